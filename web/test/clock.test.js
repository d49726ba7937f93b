// The render clock under load (issue 10, item 2): Pongs and motion batches
// that arrive late by a varying queueing delay, frames that stall. The time
// members are drawn at must never go backwards, and what is drawn must move
// continuously: no jump back to where a walk began.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { AmbleClient, ServerClock, defaultRenderDelay, DEFAULT_LIMITS } from '../amble.js';
import { Member } from '../member.js';

const EPOCH = 1_764_600_000_000; // server time at local time 0

/** A small seeded PRNG (mulberry32), so a failure replays. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A busy machine: a message's handler runs late by a queueing delay that is
 * usually small and now and then several hundred ms.
 */
function loadDelay(random) {
  const r = random();
  if (r < 0.6) return random() * 15;
  if (r < 0.9) return 30 + random() * 150;
  return 200 + random() * 400;
}

/**
 * Simulates `seconds` of a remote member walking 128 cm legs (one walk a
 * second, stamped with the server tick), Pongs every 2 s, and frames every
 * ~16 ms with stalls. Returns what each frame drew.
 */
function simulate(clock, seconds, seed) {
  const random = rng(seed);
  const renderDelay = defaultRenderDelay(DEFAULT_LIMITS);
  const events = [];
  // Pings every 2 s; the reply is stamped 10 ms after the send and handled late.
  for (let t = 0; t < seconds * 1000; t += 2000) {
    const delay = 20 + loadDelay(random);
    events.push({ at: t + delay, kind: 'pong', sent: t, server: EPOCH + t + 10 });
  }
  // A walker: every second a new walk of 128 cm at 300 cm/s, from where it stands.
  let x = 1000;
  let y = 1000;
  for (let t = 1000; t < seconds * 1000; t += 1000) {
    const angle = random() * Math.PI * 2;
    const tx = Math.round(x + Math.cos(angle) * 128);
    const ty = Math.round(y + Math.sin(angle) * 128);
    events.push({ at: t + 5 + loadDelay(random), kind: 'move', t: EPOCH + t, x, y, walk: { target: { x: tx, y: ty }, speed: 300 } });
    x = tx;
    y = ty;
  }
  // Frames: ~60 fps, with a stalled frame now and then.
  for (let t = 0, n = 0; t < seconds * 1000; n++) {
    events.push({ at: t, kind: 'frame', order: n });
    t += random() < 0.05 ? 50 + random() * 250 : 16.7;
  }
  events.sort((a, b) => a.at - b.at);

  const member = new Member(7, 'Walker');
  member.reset(EPOCH, 1000, 1000);
  clock.rough(EPOCH, 0);
  const drawn = [];
  for (const ev of events) {
    const renderAt = clock.now(ev.at) - renderDelay;
    if (ev.kind === 'pong') clock.sample(ev.sent, ev.server, ev.at);
    else if (ev.kind === 'move') member.update(ev.t, ev.x, ev.y, ev.walk, renderAt);
    else drawn.push({ local: ev.at, t: renderAt, ...member.positionAt(renderAt) });
  }
  return drawn;
}

test('jittery clock samples: the render time never goes backwards, positions stay continuous', () => {
  for (const seed of [1, 2, 3, 4, 5, 6, 7, 8]) {
    const drawn = simulate(new ServerClock(), 120, seed);
    assert.ok(drawn.length > 4000);
    for (let i = 1; i < drawn.length; i++) {
      const a = drawn[i - 1];
      const b = drawn[i];
      const dt = b.t - a.t;
      assert.ok(dt >= 0, `seed ${seed}: render time stepped back ${-dt} ms at local ${b.local.toFixed(1)} ms`);
      // Within 5 % of the local clock: no steps forward either.
      const dl = b.local - a.local;
      assert.ok(dt <= dl * 1.05 + 0.01, `seed ${seed}: render time leapt ${dt} ms in ${dl} ms`);
      // The walker never moves faster than it walks (300 cm/s), so never jumps.
      const step = Math.hypot(b.x - a.x, b.y - a.y);
      assert.ok(step <= (300 * dt) / 1000 + 0.5, `seed ${seed}: a ${step.toFixed(1)} cm step in ${dt.toFixed(1)} ms at local ${b.local.toFixed(1)}`);
    }
  }
});

test('the clock slews to a better estimate instead of stepping, and snaps only when far off', () => {
  const clock = new ServerClock({ window: 8 });
  clock.sample(0, 1000 + 40, 100); // rtt 100, offset 990
  assert.equal(clock.now(100), 1090, 'the first estimate is taken at once');
  assert.equal(clock.now(1010), 1010 + 990);
  clock.sample(1000, 2000 + 5, 1010); // rtt 10, offset 1000: 10 ms later than shown
  assert.equal(clock.offsetMs, 1000);
  // 5 % of the 100 ms since: 5 ms of the 10 ms difference.
  assert.equal(clock.now(1110), 1110 + 995);
  assert.equal(clock.now(1310), 1310 + 1000, 'then it has caught up');
  // A much lower estimate (the best sample left the window): no step back.
  clock.offsetMs = 800;
  let prev = clock.now(1310);
  for (let t = 1320; t < 6000; t += 10) {
    const now = clock.now(t);
    assert.ok(now > prev, `time went back at ${t}`);
    prev = now;
  }
  assert.equal(clock.now(6000) - 6000, 800, '200 ms taken up in 4 s');
  // A server whose clock is a minute off: not worth a minute of slewing.
  clock.offsetMs = 60_800;
  assert.equal(clock.now(6010), 6010 + 60_800);
});

test('a reconnect keeps the offset in use: time runs on across it', () => {
  const clock = new ServerClock();
  clock.sample(0, 1050, 100);
  const before = clock.now(200);
  clock.reset();
  assert.equal(clock.rttMs, null);
  assert.equal(clock.now(200), before, 'still known after reset');
  clock.rough(1000 + 300 - 20, 300); // a Welcome's time, 20 ms behind
  assert.ok(clock.now(300) >= before + 100 * 0.95);
});

test('renderTime and serverNow take a frame timestamp', () => {
  let local = 500;
  const client = new AmbleClient({ url: 'ws://test/ws', WebSocket: class {}, now: () => local });
  client.clock.rough(EPOCH + 500, 500);
  assert.equal(client.serverNow(), EPOCH + 500);
  local = 520; // the frame began at 505; the code runs at 520
  assert.equal(client.serverNow(505), EPOCH + 505);
  assert.equal(client.renderTime(null, 505), EPOCH + 505 - client.renderDelayMs);
  assert.equal(client.renderTime(null), EPOCH + 520 - client.renderDelayMs);
});
