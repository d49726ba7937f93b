// The motion model: positions at given server times, walks, interpolation
// between updates, capped extrapolation, and easing after a jump.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { Member } from '../member.js';
import { decodeServerMessage } from '../codec.js';

const TUNING = Object.freeze({ maxInterpolationMs: 1600, maxExtrapolationMs: 200, easeMs: 400 });

const member = (tuning = TUNING) => new Member(1, 'Ada', { tuning });
const walk = (x, y, speed) => ({ target: { x, y }, speed });

function at(m, t) {
  const { x, y } = m.positionAt(t);
  return [round(x), round(y)];
}
const round = (v) => Math.round(v * 1000) / 1000;

test('a standing member stays where it was reported, before and after', () => {
  const m = member();
  m.reset(1000, 250, 4000);
  assert.deepEqual(at(m, 0), [250, 4000]);
  assert.deepEqual(at(m, 1000), [250, 4000]);
  assert.deepEqual(at(m, 1e9), [250, 4000]);
});

test('a walk goes straight to its target at its speed, then stops', () => {
  const m = member();
  // (0,0) to (300,400): 500 cm at 100 cm/s = 5 s from t = 1000.
  m.reset(1000, 0, 0, walk(300, 400, 100));
  assert.deepEqual(at(m, 500), [0, 0], 'before it starts');
  assert.deepEqual(at(m, 1000), [0, 0]);
  assert.deepEqual(at(m, 2000), [60, 80]);
  assert.deepEqual(at(m, 3500), [150, 200]);
  assert.deepEqual(at(m, 6000), [300, 400], 'arrives');
  assert.deepEqual(at(m, 60_000), [300, 400], 'and stays: no extrapolation past the target');
  const target = { x: 0, y: 0 };
  assert.equal(m.walkTargetAt(3000, target), true);
  assert.deepEqual(target, { x: 300, y: 400 });
  assert.equal(m.walkTargetAt(6001, target), false, 'arrived: no target to mark');
});

test('a walk of zero length is standing at its target', () => {
  const m = member();
  m.reset(0, 10, 10, walk(10, 10, 100));
  assert.deepEqual(at(m, 500), [10, 10]);
  assert.equal(m.walkTargetAt(500, {}), false);
});

test('rare standing updates are blended linearly, arriving when the next one says', () => {
  const m = member();
  m.reset(1000, 0, 0);
  m.update(2000, 100, 50);
  m.update(3000, 100, 250);
  assert.deepEqual(at(m, 1000), [0, 0]);
  assert.deepEqual(at(m, 1250), [25, 12.5]);
  assert.deepEqual(at(m, 2000), [100, 50]);
  assert.deepEqual(at(m, 2500), [100, 150]);
  assert.deepEqual(at(m, 3000), [100, 250]);
});

test('a walk interrupted by an update is corrected smoothly into that update', () => {
  const m = member();
  m.reset(0, 0, 0, walk(1000, 0, 100));
  // The member reports x = 80 at t = 1000 where its walk would be at 100.
  m.update(1000, 80, 0);
  assert.deepEqual(at(m, 500), [40, 0]); // 50 along the walk, 10 of the 20 cm correction
  assert.deepEqual(at(m, 1000), [80, 0]);
  assert.deepEqual(at(m, 5000), [80, 0], 'the update says standing');
  // A consistent update (on the walk's own path) changes nothing before it.
  const n = member();
  n.reset(0, 0, 0, walk(1000, 0, 100));
  n.update(1000, 100, 0, walk(1000, 0, 100));
  assert.deepEqual(at(n, 500), [50, 0]);
  assert.deepEqual(at(n, 3000), [300, 0]);
});

test('after a long gap only the last stretch before the update is blended', () => {
  const m = member();
  m.reset(0, 0, 0);
  m.update(10_000, 160, 0);
  assert.deepEqual(at(m, 5000), [0, 0], 'stood still most of the gap');
  assert.deepEqual(at(m, 8400), [0, 0]);
  assert.deepEqual(at(m, 9200), [80, 0]);
  assert.deepEqual(at(m, 10_000), [160, 0]);
});

test('a late update: the free mover is extrapolated, capped, then settles on the last report', () => {
  const m = member();
  m.reset(0, 0, 0);
  m.update(1000, 100, 0); // 0.1 cm/ms
  // Braking over the 200 ms cap: k = tau - tau^2 / 400.
  assert.deepEqual(at(m, 1100), [107.5, 0]);
  assert.deepEqual(at(m, 1200), [110, 0], 'the cap: half the travel of 200 ms');
  let peak = 0;
  for (let t = 1000; t <= 3000; t += 5) peak = Math.max(peak, m.positionAt(t).x);
  assert.equal(round(peak), 110, 'never further than the cap allows');
  assert.deepEqual(at(m, 1300), [105, 0], 'settling back');
  assert.deepEqual(at(m, 1400), [100, 0]);
  assert.deepEqual(at(m, 60_000), [100, 0], 'a stop leaves no lasting overshoot');
});

test('no extrapolation after a walk, a single report, a long gap, or with the cap at 0', () => {
  const afterWalk = member();
  afterWalk.reset(0, 0, 0, walk(100, 0, 100));
  afterWalk.update(500, 50, 0);
  assert.deepEqual(at(afterWalk, 600), [50, 0]);

  const single = member();
  single.reset(0, 20, 20);
  assert.deepEqual(at(single, 100), [20, 20]);

  const gap = member();
  gap.reset(0, 0, 0);
  gap.update(5000, 100, 0);
  assert.deepEqual(at(gap, 5100), [100, 0]);

  const off = member({ ...TUNING, maxExtrapolationMs: 0 });
  off.reset(0, 0, 0);
  off.update(1000, 100, 0);
  assert.deepEqual(at(off, 1100), [100, 0]);
});

test('a late update is eased in from where the member was shown, not snapped', () => {
  const m = member();
  m.reset(0, 0, 0);
  m.update(1000, 100, 0);
  // Rendering at 1500 shows 100 (settled). Then the late update for t = 2000 arrives.
  assert.deepEqual(at(m, 1500), [100, 0]);
  m.update(2000, 200, 0, null, 1500);
  assert.deepEqual(at(m, 1500), [100, 0], 'continuous at the moment it arrives');
  // The raw path is at 150 there; the 50 cm difference eases out over 400 ms.
  assert.deepEqual(at(m, 1700), [170 - 25, 0]);
  assert.deepEqual(at(m, 1900), [190, 0], 'eased out');
  for (let t = 1500; t < 1900; t += 10) {
    assert.ok(m.positionAt(t + 10).x >= m.positionAt(t).x, `monotonic at ${t}`);
  }
});

test('a resync jump is eased over easeMs from the current render time', () => {
  const m = member();
  m.reset(0, 0, 0);
  m.reset(5000, 1000, 0, null, 5000);
  assert.deepEqual(at(m, 5000), [0, 0]);
  assert.deepEqual(at(m, 5100), [1000 - 1000 * (1 - 0.15625), 0]);
  assert.deepEqual(at(m, 5200), [500, 0]);
  assert.deepEqual(at(m, 5400), [1000, 0]);
  assert.deepEqual(at(m, 9000), [1000, 0]);
  // Without easeAt, a reset is a plain replacement (used for the first sighting).
  const n = member();
  n.reset(0, 0, 0);
  n.reset(5000, 1000, 0);
  assert.deepEqual(at(n, 5000), [1000, 0]);
});

test('a second jump during an ease starts from what is shown, with no step', () => {
  const m = member();
  m.reset(0, 0, 0);
  m.reset(0, 1000, 0, null, 0);
  const shown = m.positionAt(200).x; // halfway: 500
  m.reset(0, 0, 1000, null, 200);
  const after = m.positionAt(200);
  assert.equal(round(after.x), round(shown));
  assert.equal(round(after.y), 0);
  assert.deepEqual(at(m, 600), [0, 1000]);
});

test('an update stamped no later than the newest replaces it (newest wins)', () => {
  const m = member();
  m.reset(1000, 0, 0);
  m.update(2000, 100, 0);
  m.update(1500, 300, 0); // resolved earlier than 2000: taken as at 2000
  assert.equal(m.keyframes.length, 2);
  assert.deepEqual(at(m, 2000), [300, 0]);
  assert.equal(m.updates, 2);
});

test('keyframes the render time has passed are dropped, and the list stays bounded', () => {
  const m = member();
  m.reset(0, 0, 0);
  for (let i = 1; i <= 100; i++) m.update(i * 1000, i * 10, 0, null, i * 1000 - 1200);
  assert.ok(m.keyframes.length <= 4, `kept ${m.keyframes.length}`);
  assert.deepEqual(at(m, 100_000 - 1200), [988, 0]);
  const flood = member();
  flood.reset(0, 0, 0);
  for (let i = 1; i <= 100; i++) flood.update(i, i, 0);
  assert.ok(flood.keyframes.length <= 16);
});

test('positionAt writes into the object it is given', () => {
  const m = member();
  m.reset(0, 5, 6);
  const out = { x: 0, y: 0 };
  assert.equal(m.positionAt(10, out), out);
  assert.deepEqual(out, { x: 5, y: 6 });
});

test('a member from the Welcome vector walks from where the snapshot says', () => {
  const doc = JSON.parse(readFileSync(new URL('./vectors.json', import.meta.url), 'utf8'));
  const v = doc.vectors.find((x) => x.name === 'welcome');
  const msg = decodeServerMessage(Buffer.from(v.hex, 'hex'));
  const [ada, bo] = msg.welcome.snapshot.members.map((m) => Member.fromWire(m, { tuning: TUNING }));
  assert.deepEqual(at(ada, msg.welcome.snapshot.serverTimeMs), [0, 0]);
  // Bó: (100,4900) -> (2500,2500) at 140 cm/s from movedAtMs.
  const t0 = bo.movedAtMs;
  assert.equal(t0, 1_764_600_000_100);
  const dist = Math.hypot(2400, 2400);
  const [x, y] = at(bo, t0 + 10_000);
  assert.equal(round(x), round(100 + (2400 * 1400) / dist));
  assert.equal(round(y), round(4900 - (2400 * 1400) / dist));
  assert.deepEqual(at(bo, t0 + (dist / 140) * 1000 + 1), [2500, 2500]);
});

test('a new walk that arrives while the last one is under way causes no jump (issue 10, item 2)', () => {
  // Walking (0,0) -> (1000,0) at 100 cm/s from t = 0; at t = 2000 the member
  // turned. The update arrives late: the render time is 1500, mid-walk and
  // past the blend's start, so the new keyframe's segment covers it.
  const m = member();
  m.reset(0, 0, 0, walk(1000, 0, 100));
  assert.deepEqual(at(m, 1500), [150, 0]);
  m.update(2000, 200, 0, walk(200, 500, 100), 1500);
  assert.deepEqual(at(m, 1500), [150, 0], 'drawn where it was: no ease back towards the walk start');
  assert.equal(m.easeDx, 0);
  // And it blends on into the turn without a step.
  let prev = m.positionAt(1500, { x: 0, y: 0 });
  for (let t = 1516; t <= 3000; t += 16) {
    const p = m.positionAt(t, { x: 0, y: 0 });
    assert.ok(Math.hypot(p.x - prev.x, p.y - prev.y) < 4, `a step at ${t}`);
    prev = p;
  }
});
