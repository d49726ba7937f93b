// AmbleClient against a scripted fake WebSocket, with injected clock,
// timers and randomness: joining, motion, pacing of moves and chat, clock
// sync, refusals, and reconnect with backoff. Every timer fires because the
// test advances the fake clock; nothing waits on real time.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  AmbleClient,
  DEFAULT_RECONNECT,
  ErrorCode,
  LeaveReason,
  ServerClock,
  State,
  backoffDelay,
  chatProblem,
  dataProblem,
  nameProblem,
  textProblem,
  waitText,
} from '../amble.js';
import { decodeClientMessage, encodeServerMessage, motionTime, websocketHeaderBytes } from '../codec.js';

const EPOCH = 1_764_600_000_000; // server time at local time 0 in these tests

const LIMITS = {
  moveIntervalMs: 1000,
  moveBurst: 2,
  tickMs: 100,
  motionTimeUnitMs: 100,
  worldWidth: 5000,
  worldHeight: 5000,
  maxSpeed: 1000,
  maxMessageBytes: 4096,
  maxNameChars: 32,
  maxChatChars: 280,
  roomCapacity: 500,
  chatIntervalMs: 2000,
  chatBurst: 5,
  maxDataEntries: 8,
  maxDataBytes: 512,
  maxDataValueChars: 200,
  dataIntervalMs: 1000,
  dataBurst: 3,
};

/** Timers on a clock the test moves by hand. */
class FakeTime {
  constructor() {
    this.t = 0;
    this.timers = new Map();
    this.nextId = 1;
  }
  now = () => this.t;
  setTimeout = (fn, ms) => {
    const id = this.nextId++;
    this.timers.set(id, { at: this.t + ms, ms, fn });
    return id;
  };
  clearTimeout = (id) => {
    this.timers.delete(id);
  };
  /** Delays of the timers now pending, ascending. */
  pending() {
    return [...this.timers.values()].map((x) => x.at - this.t).sort((a, b) => a - b);
  }
  /** Moves time forward by `ms`, firing due timers in order. */
  advance(ms) {
    const end = this.t + ms;
    for (;;) {
      let next = null;
      for (const [id, timer] of this.timers) if (timer.at <= end && (!next || timer.at < next[1].at)) next = [id, timer];
      if (!next) break;
      this.timers.delete(next[0]);
      this.t = Math.max(this.t, next[1].at);
      next[1].fn();
    }
    this.t = end;
  }
}

/** A WebSocket the test drives: open(), receive(msg), drop(code). */
function fakeSocketClass() {
  const sockets = [];
  class FakeSocket {
    constructor(url, protocol) {
      this.url = url;
      this.protocol = protocol;
      this.readyState = 0;
      this.extensions = '';
      this.sentBytes = [];
      this.closedWith = null;
      sockets.push(this);
    }
    get sent() {
      return this.sentBytes.map((b) => decodeClientMessage(b));
    }
    sentOf(kind) {
      return this.sent.filter((m) => m[kind]).map((m) => m[kind]);
    }
    send(bytes) {
      assert.equal(this.readyState, 1, 'send on an open socket only');
      assert.ok(bytes instanceof Uint8Array);
      this.sentBytes.push(bytes);
    }
    close(code, reason) {
      this.readyState = 3;
      this.closedWith = { code, reason };
    }
    open() {
      this.readyState = 1;
      this.onopen?.({});
    }
    receive(msg) {
      const bytes = encodeServerMessage(msg);
      this.onmessage?.({ data: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) });
      return bytes.byteLength;
    }
    drop(code = 1006, reason = '') {
      this.readyState = 3;
      this.onclose?.({ code, reason });
    }
    /** An error and no close event, as Node's WebSocket when the server cannot be reached. */
    failWithoutClose() {
      this.onerror?.({ type: 'error' });
    }
  }
  return { FakeSocket, sockets };
}

const wire = (id, name, x, y, movedAtMs = EPOCH, walk = null) => ({
  id,
  name,
  position: { x, y },
  walk,
  movedAtMs,
});

function welcome(memberId, members, serverTimeMs = EPOCH, limits = LIMITS) {
  return {
    welcome: { memberId, room: 'lobby', limits, snapshot: { serverTimeMs, members }, serverVersion: '0.1.0', protocolRevision: 2 },
  };
}

function setup(options = {}) {
  const time = new FakeTime();
  const { FakeSocket, sockets } = fakeSocketClass();
  const client = new AmbleClient({
    url: 'ws://test/ws',
    WebSocket: FakeSocket,
    now: time.now,
    setTimeout: time.setTimeout,
    clearTimeout: time.clearTimeout,
    random: () => 0.5,
    ...options,
  });
  const events = [];
  for (const type of [
    'state', 'welcome', 'joined', 'left', 'moved', 'chat', 'resync', 'error', 'closed', 'pong', 'data',
    'tokenExpiring', 'tokenRefreshed', 'system', 'appeared', 'disappeared', 'population',
  ]) {
    client.on(type, (...args) => events.push([type, ...args]));
  }
  const last = () => sockets[sockets.length - 1];
  return { time, client, sockets, last, events, of: (type) => events.filter((e) => e[0] === type) };
}

/** A client in room lobby as member 1, with Ada (0) and Bo (2) there. */
function joined(options) {
  const s = setup(options);
  s.client.join('lobby', 'Me');
  s.last().open();
  s.last().receive(welcome(1, [wire(0, 'Ada', 100, 100), wire(1, 'Me', 2500, 2500), wire(2, 'Bo', 4000, 200)]));
  return s;
}

test('joining: connects with the subprotocol, sends Join, and the Welcome fills the room', () => {
  const { client, last, of } = setup();
  client.join('lobby', 'Me');
  assert.equal(client.state, State.CONNECTING);
  const ws = last();
  assert.equal(ws.url, 'ws://test/ws');
  assert.equal(ws.protocol, 'amble.v1');
  assert.equal(ws.binaryType, 'arraybuffer');
  ws.open();
  assert.equal(client.state, State.JOINING);
  assert.deepEqual(ws.sentOf('join'), [{ room: 'lobby', name: 'Me', token: '', start: null, resumeToken: '', data: [] }]);
  assert.equal(ws.sentOf('ping').length, 1, 'a first Ping for the clock');
  ws.receive(welcome(1, [wire(0, 'Ada', 100, 100), wire(1, 'Me', 2500, 2500)]));
  assert.equal(client.state, State.JOINED);
  assert.equal(client.room, 'lobby');
  assert.equal(client.members.size, 2);
  assert.equal(client.me.id, 1);
  assert.equal(client.me.isSelf, true);
  assert.equal(client.members.get(0).isSelf, false);
  assert.deepEqual(client.me.positionAt(client.serverNow()), { x: 2500, y: 2500 });
  const [[, info]] = of('welcome');
  assert.equal(info.rejoined, false);
  assert.equal(info.me, client.me);
  assert.deepEqual(of('state').map((e) => e[1]), ['connecting', 'open', 'joining', 'joined']);
});

test('join refuses a bad name or room before sending anything', () => {
  const { client, sockets } = setup();
  assert.throws(() => client.join('lobby', '   '), RangeError);
  assert.throws(() => client.join('no spaces', 'Me'), RangeError);
  assert.throws(() => client.join('lobby', 'x'.repeat(33)), RangeError);
  assert.throws(() => client.join('lobby', 'tab\there'), RangeError);
  assert.equal(sockets.length, 0);
});

test('names and chat follow the server text rule, on their NFC form', () => {
  // Accepted, as the server accepts them (src/protocol/text.rs).
  for (const ok of [
    'Ada Lovelace',
    'Zoë 🌿',
    '李小龙',
    'مرحبا',
    'می\u200Cخواهم', // a zero-width non-joiner inside a Persian word
    '👨\u200D👩\u200D👧', // an emoji ZWJ sequence
    'A\u200BB',
    'e\u0301'.repeat(32), // 64 code points, 32 characters in NFC
  ]) {
    assert.equal(textProblem(ok, 32), null, JSON.stringify(ok));
  }
  const cases = [
    ['', 'empty'],
    ['   ', 'blank'],
    ['\u200B\uFEFF', 'blank'],
    ['\u3164', 'blank'],
    ['\u115F\u1160\uFFA0', 'blank'],
    ['\u2800\u2800', 'blank'],
    ['\u{1D159}\u{16FE4}\u00AD\u180E\u2060\u3000', 'blank'],
    ['admin\u202Etxt.exe', 'no bidirectional overrides or isolates'],
    ['a\u2066b', 'no bidirectional overrides or isolates'],
    ['a\u2069', 'no bidirectional overrides or isolates'],
    ['line\u2028break', 'no line or paragraph separators'],
    ['para\u2029', 'no line or paragraph separators'],
    ['bell\u0007', 'no control characters'],
    ['c1\u0085', 'no control characters'],
    ['é'.repeat(33), 'at most 32 characters'],
  ];
  for (const [text, problem] of cases) {
    assert.equal(textProblem(text, 32), problem, JSON.stringify(text));
  }
  assert.equal(nameProblem(''), 'a name is needed');
  assert.match(nameProblem('\u3164'), /something visible/);
  assert.equal(chatProblem('\u200B'), chatProblem(''));
  assert.equal(nameProblem('x\u202Ey'), 'no bidirectional overrides or isolates');
});

test('join sends the name in NFC and refuses a blank or bidi one', () => {
  const { client, sockets, last } = setup();
  assert.throws(() => client.join('lobby', '\u200B'), RangeError);
  assert.throws(() => client.join('lobby', 'x\u202Ey'), RangeError);
  assert.equal(sockets.length, 0);
  client.join('lobby', 'Zoe\u0308');
  last().open();
  const [join] = last().sentOf('join');
  assert.equal(join.name, 'Zoë');
});

test('the server clock comes from the Welcome, then from the lowest-RTT Pong', () => {
  const { client, time, last } = setup();
  client.join('lobby', 'Me');
  last().open();
  time.advance(40);
  last().receive(welcome(1, [wire(1, 'Me', 0, 0)], EPOCH + 40));
  assert.equal(client.serverNow(), EPOCH + 40);
  const [ping] = last().sentOf('ping');
  assert.equal(ping.clientTimeMs, 0);
  // Pong after a 60 ms round trip; the server stamped it at EPOCH + 30.
  time.advance(20);
  last().receive({ pong: { clientTimeMs: 0, serverTimeMs: EPOCH + 30 } });
  assert.equal(client.rttMs, 60);
  assert.equal(client.serverNow(), EPOCH + 60); // 30 + 60/2 at local 60
  // A slower sample (200 ms) does not move the offset.
  time.advance(2000 - 60); // the next Ping is due at 2000
  const second = last().sentOf('ping')[1];
  assert.equal(second.clientTimeMs, 2000);
  time.advance(200);
  last().receive({ pong: { clientTimeMs: 2000, serverTimeMs: EPOCH + 2000 + 400 } });
  assert.equal(client.rttMs, 200);
  assert.equal(client.serverNow(), EPOCH + 2200);
});

test('ServerClock keeps the offset of the lowest round trip in its window', () => {
  const clock = new ServerClock({ window: 2 });
  assert.equal(clock.now(5), null);
  clock.rough(1000, 0);
  assert.equal(clock.now(5), 1005);
  clock.sample(0, 1010, 20); // rtt 20, offset 1000
  clock.sample(100, 1200, 200); // rtt 100, offset 1050
  assert.equal(clock.offsetMs, 1000);
  clock.sample(300, 1400, 340); // rtt 40, offset 1080; the rtt-20 sample leaves the window
  assert.equal(clock.offsetMs, 1080);
  clock.rough(0, 0);
  assert.equal(clock.offsetMs, 1080, 'a rough value does not override samples');
});

test('motion batches: own id skipped, others updated at the resolved tick time', () => {
  const { client, last, of, time } = joined();
  time.advance(500);
  const t = EPOCH + 300; // the tick the batch was made in
  last().receive({
    motion: [motionTime(t, 100), 0 * 2, 200, 300, 1 * 2 + 1, 9, 9, 10, 10, 100, 2 * 2 + 1, 4000, 200, 4000, 1200, 500],
  });
  assert.equal(of('moved').length, 2, 'Ada and Bo moved; our own record is skipped');
  assert.deepEqual(client.me.positionAt(client.serverNow()), { x: 2500, y: 2500 }, 'own motion untouched');
  const ada = client.members.get(0);
  assert.equal(ada.movedAtMs, t);
  assert.deepEqual(ada.positionAt(t + 5000), { x: 200, y: 300 });
  const bo = client.members.get(2);
  assert.deepEqual(bo.positionAt(t + 1000), { x: 4000, y: 700 }, 'walking 500 cm/s from the tick time');
  const target = {};
  assert.equal(bo.walkTargetAt(t + 1000, target), true);
  assert.deepEqual(target, { x: 4000, y: 1200 });
  assert.equal(client.stats.motionUpdatesIn, 2);
  // A truncated record is reported, not applied.
  last().receive({ motion: [3, 0, 1] });
  assert.equal(of('error').length, 1);
});

test('joined, left and chat reach the page as events with their member', () => {
  const { client, last, of } = joined();
  last().receive({ joined: { member: wire(3, 'Cy', 10, 20) } });
  const [[, cy]] = of('joined');
  assert.equal(cy.name, 'Cy');
  assert.equal(client.members.get(3), cy);
  last().receive({ chat: { memberId: 3, text: 'hi 👋', serverTimeMs: EPOCH + 5 } });
  const [[, chat]] = of('chat');
  assert.equal(chat.member, cy);
  assert.equal(chat.text, 'hi 👋');
  last().receive({ left: { memberId: 3, reason: LeaveReason.TIMED_OUT } });
  const [[, gone, reason]] = of('left');
  assert.equal(gone, cy);
  assert.equal(reason, LeaveReason.TIMED_OUT);
  assert.equal(client.members.has(3), false);
  last().receive({ chat: { memberId: 3, text: 'ghost', serverTimeMs: EPOCH + 6 } });
  assert.equal(of('chat')[1][1].member, null, 'a chat from someone gone has no member');
});

test('moveTo: sent at most once per interval, newest position wins, the stop goes out', () => {
  const { client, last, time } = joined();
  const ws = last();
  const moves = () => ws.sentOf('move');
  // Hold a key for 5 s, one moveTo per 16 ms frame.
  let x = 2500;
  for (let t = 0; t < 5000; t += 16) {
    x += 1;
    client.moveTo(x, 2500);
    time.advance(16);
  }
  const sent = moves();
  assert.ok(sent.length >= 5 && sent.length <= 6, `sent ${sent.length} moves in 5 s`);
  for (const m of sent) assert.equal(m.walk, null);
  // Then nothing more is pressed: the final position is sent, once.
  time.advance(3000);
  const all = moves();
  assert.deepEqual(all[all.length - 1].position, { x, y: 2500 });
  assert.equal(all.length, sent.length + 1);
  // Sequence numbers increase; times are the local clock.
  assert.deepEqual(all.map((m) => m.seq), all.map((_, i) => i + 1));
  // Locally you are where you said, at once.
  assert.deepEqual(client.me.positionAt(client.serverNow()), { x, y: 2500 });
  // Moving back to where the server has you sends nothing new.
  client.moveTo(x, 2500);
  time.advance(3000);
  assert.equal(moves().length, all.length);
});

test('walkTo: one message for the whole walk, predicted locally from where you are', () => {
  const { client, last, time } = joined({ walkSpeed: 250 });
  client.walkTo(3000.4, 2500);
  const [move] = last().sentOf('move');
  assert.deepEqual(move.position, { x: 2500, y: 2500 });
  assert.deepEqual(move.walk, { target: { x: 3000, y: 2500 }, speed: 250 });
  time.advance(1000);
  assert.deepEqual(client.me.positionAt(client.serverNow()), { x: 2750, y: 2500 });
  time.advance(1500);
  assert.deepEqual(client.me.positionAt(client.serverNow()), { x: 3000, y: 2500 });
  assert.equal(last().sentOf('move').length, 1);
  // Three more walks at once: the burst of 2 lets two go, the third waits
  // for a token; a fourth before then replaces it (newest wins).
  client.walkTo(3000, 3000);
  client.walkTo(3200, 3000);
  client.walkTo(3300, 3000);
  assert.equal(last().sentOf('move').length, 3);
  client.walkTo(500, 4500, { speed: 100 });
  time.advance(1009);
  assert.equal(last().sentOf('move').length, 3, 'no token yet (one per 1010 ms)');
  time.advance(1);
  const moves = last().sentOf('move');
  assert.equal(moves.length, 4, 'the waiting walk goes when a token is back');
  assert.deepEqual(moves[3].walk, { target: { x: 500, y: 4500 }, speed: 100 });
  const p = client.me.positionAt(client.serverNow());
  assert.deepEqual(moves[3].position, { x: Math.round(p.x), y: Math.round(p.y) }, 'sent from where the walk is now');
  time.advance(10_000);
  assert.equal(last().sentOf('move').length, 4);
});

test('moveTo and walkTo throw a RangeError for NaN, Infinity and points outside the world', () => {
  const { client, last } = joined();
  for (const [x, y] of [[NaN, 0], [0, Infinity], [-Infinity, 0], [-1, 0], [5001, 0], [0, 5000.6]]) {
    assert.throws(() => client.moveTo(x, y), RangeError, `moveTo(${x}, ${y})`);
    assert.throws(() => client.walkTo(x, y), RangeError, `walkTo(${x}, ${y})`);
  }
  assert.throws(() => client.walkTo(10, 10, { speed: 0 }), RangeError);
  assert.throws(() => client.walkTo(10, 10, { speed: 1001 }), RangeError);
  assert.throws(() => client.walkTo(10, 10, { speed: NaN }), RangeError);
  assert.equal(last().sentOf('move').length, 0, 'nothing was sent');
  assert.doesNotThrow(() => client.moveTo(5000, 4999.6), 'rounded to 5000');
});

test('moving before joining is an error', () => {
  const { client } = setup();
  assert.throws(() => client.moveTo(1, 1), /join one first/);
  assert.throws(() => client.chat('hi'), /join one first/);
});

test('chat: checked, and held to the chat budget', () => {
  const { client, last, time } = joined();
  assert.throws(() => client.chat('  '), RangeError);
  assert.throws(() => client.chat('x'.repeat(281)), RangeError);
  assert.throws(() => client.chat('bell\u0007'), RangeError);
  assert.throws(() => client.chat('\u2800'), RangeError);
  assert.throws(() => client.chat('a\u2029b'), RangeError);
  const sent = [];
  for (let i = 0; i < 7; i++) sent.push(client.chat(`hello ${i}`));
  assert.deepEqual(sent, [true, true, true, true, true, false, false]);
  time.advance(2010);
  assert.equal(client.chat('again'), true);
  assert.equal(client.chat('too soon'), false);
  assert.deepEqual(last().sentOf('chat').map((c) => c.text), ['hello 0', 'hello 1', 'hello 2', 'hello 3', 'hello 4', 'again']);
});

test('byte counters are the frames actually sent and received, plus exact header sizes', () => {
  const { client, last } = setup();
  client.join('lobby', 'Me');
  const ws = last();
  ws.open();
  let inBytes = ws.receive(welcome(1, [wire(1, 'Me', 0, 0)]));
  inBytes += ws.receive({ motion: [3, 0, 1, 2] });
  const outBytes = ws.sentBytes.reduce((n, b) => n + b.byteLength, 0);
  assert.equal(client.stats.framesOut, ws.sentBytes.length);
  assert.equal(client.stats.bytesOut, outBytes);
  assert.equal(client.stats.bytesIn, inBytes);
  assert.equal(client.stats.framesIn, 2);
  assert.equal(client.stats.wireBytesIn, inBytes + 2 * 2, 'two small unmasked frames: 2-byte headers');
  assert.equal(
    client.stats.wireBytesOut,
    ws.sentBytes.reduce((n, b) => n + b.byteLength + websocketHeaderBytes(b.byteLength, true), 0),
  );
  assert.equal(client.stats.wireBytesOut, outBytes + 6 * ws.sentBytes.length);
});

test('a refused join (room full, bad name) says why and keeps the socket, without retrying', () => {
  const { client, last, of, time, sockets } = setup();
  client.join('lobby', 'Me');
  last().open();
  last().receive({ error: { code: ErrorCode.ROOM_FULL, message: 'room lobby is full (500 members)' } });
  const [[, err]] = of('error');
  assert.equal(err.refused, true);
  assert.match(err.text, /room is full/);
  assert.equal(client.state, State.OPEN);
  assert.equal(last().readyState, 1);
  time.advance(60_000);
  assert.equal(sockets.length, 1);
  assert.equal(last().sentOf('join').length, 1, 'no retry of the join');
  // A different name then works on the same socket.
  client.join('lobby', 'Me2');
  assert.equal(last().sentOf('join').length, 2);
  last().receive({ error: { code: ErrorCode.INVALID_NAME, message: 'too long' } });
  assert.match(of('error')[1][1].text, /name can't be used \(too long\)/);
});

test('a flood close (1008) is reported and not retried', () => {
  const { client, last, of, time, sockets } = joined();
  last().receive({ error: { code: ErrorCode.FLOOD, message: 'too many messages' } });
  last().drop(1008, 'flood');
  const [[, closed]] = of('closed');
  assert.equal(closed.willReconnect, false);
  assert.equal(closed.code, 1008);
  assert.match(closed.text, /too many messages/);
  assert.equal(client.state, State.CLOSED);
  time.advance(120_000);
  assert.equal(sockets.length, 1);
});

test('reconnect: exponential backoff with injected jitter, rejoining the same room where you were', () => {
  const { client, last, of, time, sockets } = joined();
  client.moveTo(1234, 2345);
  // The server goes away; it is down for five attempts.
  last().drop(1001, 'shutting down');
  assert.equal(client.state, State.RECONNECTING);
  const expected = [375, 750, 1500, 3000, 6000, 11_250, 11_250]; // min(15 s, 500 * 2^n) * (1 - 0.5 * 0.5)
  const seen = [];
  for (let i = 0; i < expected.length; i++) {
    const [delay] = time.pending();
    seen.push(delay);
    assert.equal(sockets.length, i + 1, 'no new socket before the delay is over');
    time.advance(delay - 1);
    assert.equal(sockets.length, i + 1);
    time.advance(1);
    assert.equal(sockets.length, i + 2, 'a new socket when it is');
    if (i < expected.length - 1) last().drop(1006);
  }
  assert.deepEqual(seen, expected);
  assert.deepEqual(of('closed').map((e) => e[1].retryInMs), expected);
  assert.match(of('closed')[0][1].text, /Reconnecting in/);
  // The server is back: the client rejoins the same room with the same name.
  last().open();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: 'Me', token: '', start: null, resumeToken: '', data: [] }]);
  last().receive(welcome(4, [wire(0, 'Ada', 100, 100), wire(4, 'Me', 2500, 2500)]));
  assert.equal(client.state, State.JOINED);
  const [, rejoin] = of('welcome')[1];
  assert.equal(rejoin.rejoined, true);
  // ...and tells the server where it was, instead of the spawn point.
  assert.deepEqual(last().sentOf('move')[0].position, { x: 1234, y: 2345 });
  assert.deepEqual(client.me.positionAt(client.serverNow()), { x: 1234, y: 2345 });
  // After a successful rejoin the backoff starts over.
  last().drop(1006);
  assert.deepEqual(time.pending().slice(-1), [375]);
});

test('close() stops for good: no reconnect, no timers left', () => {
  const { client, last, time, sockets, of } = joined();
  client.close();
  assert.equal(last().closedWith.code, 1000);
  assert.equal(client.state, State.CLOSED);
  assert.deepEqual(time.pending(), []);
  time.advance(60_000);
  assert.equal(sockets.length, 1);
  assert.equal(of('closed')[0][1].willReconnect, false);
});

test('leave() keeps the socket; a new join works on it', () => {
  const { client, last } = joined();
  client.leave();
  assert.equal(client.state, State.OPEN);
  assert.equal(client.members.size, 0);
  assert.equal(client.me, null);
  assert.equal(last().sentOf('leave').length, 1);
  client.join('cafe', 'Me');
  assert.deepEqual(last().sentOf('join')[1], { room: 'cafe', name: 'Me', token: '', start: null, resumeToken: '', data: [] });
});

test('a resync replaces the members; a member that is still there is eased, not snapped', () => {
  const { client, last, of, time } = joined({ easeMs: 400 });
  time.advance(5000);
  const ada = client.members.get(0);
  const t = client.renderTime();
  assert.deepEqual(ada.positionAt(t), { x: 100, y: 100 });
  last().receive({
    resync: { serverTimeMs: EPOCH + 5000, members: [wire(0, 'Ada', 1100, 100, EPOCH + 4000), wire(1, 'Me', 0, 0), wire(5, 'Di', 1, 1)] },
  });
  assert.equal(of('resync').length, 1);
  assert.deepEqual([...client.members.keys()].sort(), [0, 1, 5]);
  assert.equal(client.members.get(0), ada, 'same object');
  assert.deepEqual(ada.positionAt(t), { x: 100, y: 100 }, 'no jump at the moment it arrives');
  assert.deepEqual(ada.positionAt(t + 400), { x: 1100, y: 100 }, 'eased in within easeMs');
  assert.deepEqual(client.me.positionAt(client.serverNow()), { x: 2500, y: 2500 }, 'own motion stays local');
});

test('backoffDelay: exponential, capped, jittered into (1 - jitter, 1] of the step', () => {
  const p = DEFAULT_RECONNECT;
  assert.equal(backoffDelay(0, p, () => 0), 500);
  assert.equal(backoffDelay(1, p, () => 0), 1000);
  assert.equal(backoffDelay(10, p, () => 0), 15_000);
  assert.equal(backoffDelay(3, p, () => 0.999999), 2000);
  assert.equal(backoffDelay(2, { ...p, jitter: 0 }, () => 0.7), 2000);
  for (let a = 0; a < 20; a++) {
    const d = backoffDelay(a, p, Math.random);
    const step = Math.min(15_000, 500 * 2 ** a);
    assert.ok(d > step * 0.5 - 1 && d <= step, `attempt ${a}: ${d}`);
  }
});

test('switching rooms sends Leave then Join; a late Welcome for the old room is ignored', () => {
  const { client, last, of } = setup();
  client.join('lobby', 'Me');
  last().open();
  client.join('cafe', 'Me'); // before the lobby's Welcome came
  assert.deepEqual(last().sent.filter((m) => !m.ping).map((m) => Object.keys(m)[0]), ['join', 'leave', 'join']);
  last().receive(welcome(1, [wire(1, 'Me', 0, 0)])); // room: 'lobby'
  assert.equal(client.state, State.JOINING);
  assert.equal(of('welcome').length, 0);
  last().receive({ joined: { member: wire(7, 'Old', 1, 1) } });
  assert.equal(client.members.size, 0, 'frames of the old room are not applied');
  last().receive({ welcome: { ...welcome(3, [wire(3, 'Me', 5, 5)]).welcome, room: 'cafe' } });
  assert.equal(client.state, State.JOINED);
  assert.equal(client.room, 'cafe');
  assert.equal(of('welcome').length, 1);
});

test('a walk that has arrived before its turn to be sent goes out as standing at the target', () => {
  const { client, last, time } = joined();
  client.walkTo(2600, 2500);
  client.walkTo(2700, 2500);
  client.walkTo(2800, 2500, { speed: 1000 }); // no token left: waits about a second
  time.advance(2000);
  const moves = last().sentOf('move');
  assert.equal(moves.length, 3);
  assert.deepEqual(moves[2], { position: { x: 2800, y: 2500 }, walk: null, seq: 3, clientTimeMs: 1010 });
});

test('an exception in an event handler does not break the client', () => {
  const reported = [];
  const { client, last, of } = setup({ reportError: (err) => reported.push(err.message) });
  client.on('welcome', () => {
    throw new Error('page bug');
  });
  let later = false;
  client.on('welcome', () => {
    later = true;
  });
  client.join('lobby', 'Me');
  last().open();
  last().receive(welcome(1, [wire(1, 'Me', 0, 0)]));
  assert.equal(client.state, State.JOINED, 'the client carried on');
  assert.equal(of('welcome').length, 1);
  assert.equal(later, true, 'handlers after the failing one still ran');
  assert.deepEqual(reported, ['page bug'], 'and the error was reported');
});

// ------------------------------------------------------------------ tokens

/** Lets resolved promises (an async getToken) run their callbacks. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

test('token: a fixed token goes in every Join, the first and after a reconnect', () => {
  const { client, last, time } = setup({ token: 'header.claims.sig' });
  client.join('lobby', 'Me');
  last().open();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: 'Me', token: 'header.claims.sig', start: null, resumeToken: '', data: [] }]);
  last().drop(1006);
  time.advance(time.pending()[0]);
  last().open();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: 'Me', token: 'header.claims.sig', start: null, resumeToken: '', data: [] }]);
});

test('getToken: asked before every Join, again on each reconnect; a late answer for a dead socket is dropped', async () => {
  const asked = [];
  let n = 0;
  const { client, last, time, sockets } = setup({
    getToken: async (wanted) => {
      asked.push(wanted);
      n += 1;
      return `token-${n}`;
    },
  });
  client.join('lobby', 'Me');
  last().open();
  assert.equal(client.state, State.JOINING);
  assert.deepEqual(last().sentOf('join'), [], 'nothing sent before the token comes');
  await settle();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: 'Me', token: 'token-1', start: null, resumeToken: '', data: [] }]);
  last().receive(welcome(1, [wire(1, 'Me', 2500, 2500)]));
  assert.equal(client.state, State.JOINED);

  // The connection drops; the reconnect asks for a fresh token.
  last().drop(1006);
  time.advance(time.pending()[0]);
  last().open();
  await settle();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: 'Me', token: 'token-2', start: null, resumeToken: '', data: [] }]);
  assert.deepEqual(asked, [
    { room: 'lobby', name: 'Me' },
    { room: 'lobby', name: 'Me' },
  ]);

  // A socket that drops while its token is on the way never sends it.
  last().drop(1006);
  time.advance(time.pending()[0]);
  const dying = last();
  dying.open();
  dying.drop(1006);
  await settle();
  assert.deepEqual(dying.sentOf('join'), []);
  time.advance(time.pending()[0]);
  assert.equal(sockets.length, 4);
});

test('getToken failing gives the join up with a clear error, without a retry loop', async () => {
  const { client, last, of, time, sockets } = setup({
    getToken: async () => {
      throw new Error('backend says 401');
    },
  });
  client.join('lobby', 'Me');
  last().open();
  await settle();
  const [[, err]] = of('error');
  assert.equal(err.refused, true);
  assert.equal(err.code, null);
  assert.match(err.message, /401/);
  assert.match(err.text, /sign-in token/);
  assert.equal(client.state, State.OPEN);
  assert.deepEqual(last().sentOf('join'), []);
  time.advance(60_000);
  assert.equal(sockets.length, 1);
});

test('UNAUTHENTICATED and FORBIDDEN are refusals the app sees, never retried', () => {
  for (const [code, pattern] of [
    [ErrorCode.UNAUTHENTICATED, /sign-in \(the token has expired\)/],
    [ErrorCode.FORBIDDEN, /access to this room/],
  ]) {
    const { client, last, of, time, sockets } = setup({ token: 'old' });
    client.join('lobby', 'Me');
    last().open();
    last().receive({ error: { code, message: 'the token has expired' } });
    const [[, err]] = of('error');
    assert.equal(err.code, code);
    assert.equal(err.refused, true);
    assert.match(err.text, pattern);
    assert.equal(client.state, State.OPEN);
    time.advance(60_000);
    assert.equal(sockets.length, 1, 'no reconnect');
    assert.equal(last().sentOf('join').length, 1, 'no second Join');
    // Were the server to close after it, the client still would not retry.
    last().drop(1008);
    assert.equal(of('closed')[0][1].willReconnect, false);
  }
});

test('replaced by your own newer connection (REPLACED, close 4000): closed, not retried', () => {
  const { client, last, of, time, sockets } = joined({ token: 't' });
  last().receive({ error: { code: ErrorCode.REPLACED, message: 'joined again elsewhere' } });
  last().drop(4000, 'replaced by a newer connection');
  const [[, closed]] = of('closed');
  assert.equal(closed.willReconnect, false);
  assert.match(closed.text, /another tab or device/);
  assert.equal(client.state, State.CLOSED);
  time.advance(120_000);
  assert.equal(sockets.length, 1);
  assert.equal(LeaveReason.REPLACED, 6);
});

// Issue #17: a spatial room sends what comes into view and goes out of it.
test('spatial: Appeared adds members without a joined, Disappeared removes them without a left', () => {
  const { client, last, of } = joined();
  assert.equal(client.population, 3);
  last().receive({ appeared: { members: [wire(7, 'Far', 9000, 9000), wire(1, 'Me', 0, 0)] } });
  assert.equal(client.members.get(7).name, 'Far');
  assert.equal(client.me.positionAt(client.serverNow()).x, 2500, 'yourself is never replaced');
  assert.deepEqual(of('appeared').map((e) => e[1].id), [7]);
  assert.equal(of('joined').length, 0);
  last().receive({ disappeared: { memberIds: [7, 1, 99] } });
  assert.equal(client.members.has(7), false);
  assert.equal(client.members.has(1), true, 'yourself stays');
  assert.deepEqual(of('disappeared').map((e) => e[1].id), [7]);
  assert.equal(of('left').length, 0);
  last().receive({ population: { members: 9412 } });
  assert.equal(client.population, 9412);
  assert.deepEqual(of('population').map((e) => e[1]), [9412]);
});

// Issue #18: the app's removals through the server API end the session for good.
for (const [name, code, close, reason, text] of [
  ['kicked', ErrorCode.KICKED, 4004, 'kicked', /removed from this room: spamming/],
  ['banned', ErrorCode.BANNED, 4005, 'banned', /banned by the app for 600 s more/],
  ['room closed', ErrorCode.ROOM_CLOSED, 4006, 'room closed', /room was closed/],
]) {
  test(`${name} by the app (close ${close}): closed with the reason, not retried`, () => {
    const { client, last, of, time, sockets } = joined({ token: 't' });
    const message = code === ErrorCode.KICKED
      ? 'removed from the room by the app: spamming'
      : 'you are banned by the app for 600 s more: spam';
    last().receive({ error: { code, message } });
    last().drop(close, reason);
    const [[, closed]] = of('closed');
    assert.equal(closed.willReconnect, false);
    assert.match(closed.text, text);
    assert.equal(client.state, State.CLOSED);
    time.advance(120_000);
    assert.equal(sockets.length, 1, 'no reconnect');
  });
}

test('a closing code alone (no Error first) is not retried either', () => {
  for (const close of [4004, 4005, 4006]) {
    const { of, time, sockets, last } = joined();
    last().drop(close, '');
    assert.equal(of('closed')[0][1].willReconnect, false, `close ${close}`);
    time.advance(120_000);
    assert.equal(sockets.length, 1);
  }
});

test('a Join refused as BANNED keeps the socket and says why', () => {
  const { client, last, of } = setup({ token: 't' });
  client.join('lobby', 'Me');
  last().open();
  last().receive({ error: { code: ErrorCode.BANNED, message: 'you are banned by the app for 60 s more: spam' } });
  const [[, err]] = of('error');
  assert.equal(err.refused, true);
  assert.match(err.text, /can't join: you are banned by the app for 60 s more: spam/);
});

test('MUTED: the chat was dropped, the session goes on', () => {
  const { client, last, of } = joined();
  last().receive({ error: { code: ErrorCode.MUTED, message: 'you are muted by the app for 30 s more: message dropped' } });
  const [[, err]] = of('error');
  assert.equal(err.refused, false);
  assert.match(err.text, /can't chat now: you are muted/);
  assert.equal(client.state, State.JOINED);
});

test("system messages are the app's, with whether they were for you alone", () => {
  const { last, of } = joined();
  last().receive({ system: { text: 'Doors close soon.', serverTimeMs: EPOCH + 10, direct: false } });
  last().receive({ system: { text: 'Just you.', serverTimeMs: EPOCH + 20, direct: true } });
  assert.deepEqual(of('system').map((e) => e[1]), [
    { text: 'Doors close soon.', serverTimeMs: EPOCH + 10, direct: false },
    { text: 'Just you.', serverTimeMs: EPOCH + 20, direct: true },
  ]);
  assert.equal(of('chat').length, 0, 'never a chat line of a member');
});

// Issue #18: the server says a token expires; getToken renews it.
const EXP = EPOCH + 600_000;

test('TokenExpiring with getToken: asked with refresh: true, sent as RefreshToken; TokenRefreshed moves the expiry', async () => {
  const asked = [];
  let n = 0;
  const { client, last, of } = setup({
    getToken: async (wanted) => {
      asked.push(wanted);
      n += 1;
      return `token-${n}`;
    },
  });
  client.join('lobby', 'Me');
  last().open();
  await settle();
  last().receive({ welcome: { ...welcome(1, [wire(1, 'Me', 2500, 2500)]).welcome, protocolRevision: 3, tokenExpiresAtMs: EXP } });
  assert.equal(client.tokenExpiresAtMs, EXP);

  last().receive({ tokenExpiring: { expiresAtMs: EXP } });
  assert.deepEqual(of('tokenExpiring').map((e) => e[1]), [{ expiresAtMs: EXP, refreshing: true }]);
  await settle();
  assert.deepEqual(asked, [
    { room: 'lobby', name: 'Me' },
    { room: 'lobby', name: 'Me', refresh: true },
  ]);
  assert.deepEqual(last().sentOf('refresh'), [{ token: 'token-2' }]);
  assert.equal(client.state, State.JOINED);

  last().receive({ tokenRefreshed: { expiresAtMs: EXP + 600_000 } });
  assert.deepEqual(of('tokenRefreshed').map((e) => e[1]), [{ expiresAtMs: EXP + 600_000 }]);
  assert.equal(client.tokenExpiresAtMs, EXP + 600_000);
  // A server without keys answers 0: nothing expires.
  last().receive({ tokenRefreshed: { expiresAtMs: 0 } });
  assert.equal(client.tokenExpiresAtMs, null);
});

test('a refresh token that arrives after the socket dropped is not sent; a failing getToken keeps the room', async () => {
  const first = joined({ getToken: async () => 'fresh' });
  await settle(); // the Join's token
  const dropped = first.last();
  dropped.receive({ tokenExpiring: { expiresAtMs: EXP } });
  dropped.drop(1006);
  await settle();
  assert.deepEqual(dropped.sentOf('refresh'), []);

  const { client, last, of } = joined({
    getToken: async ({ refresh }) => {
      if (refresh) throw new Error('backend down');
      return 'for-the-join';
    },
  });
  await settle();
  last().receive({ tokenExpiring: { expiresAtMs: EXP } });
  await settle();
  const [[, err]] = of('error');
  assert.equal(err.refresh, true);
  assert.equal(err.refused, false);
  assert.match(err.message, /backend down/);
  assert.match(err.text, /renew the sign-in token/);
  assert.equal(client.state, State.JOINED);
  assert.deepEqual(last().sentOf('refresh'), []);
});

test('a refused refresh (FORBIDDEN) keeps the room, and a later drop is still retried', () => {
  const { client, last, of } = joined({ getToken: async () => 'fresh' });
  last().receive({ error: { code: ErrorCode.FORBIDDEN, message: 'token refresh refused: the token is for another user' } });
  assert.equal(client.state, State.JOINED);
  const [[, err]] = of('error');
  assert.equal(err.refused, false);
  assert.equal(err.refresh, true);
  last().drop(1006);
  assert.equal(of('closed')[0][1].willReconnect, true);
});

test('TOKEN_EXPIRED and close 4003 with getToken: reconnects and joins with a fresh token', async () => {
  let n = 0;
  const { client, last, of, time, sockets } = setup({ getToken: async () => `token-${++n}` });
  client.join('lobby', 'Me');
  last().open();
  await settle();
  last().receive(welcome(1, [wire(1, 'Me', 2500, 2500)]));
  last().receive({ error: { code: ErrorCode.TOKEN_EXPIRED, message: 'your token expired and was not refreshed' } });
  last().drop(4003, 'token expired');
  const [[, closed]] = of('closed');
  assert.equal(closed.willReconnect, true);
  assert.match(closed.text, /^Your sign-in expired before it was renewed\. Reconnecting in /);
  assert.equal(client.tokenExpiresAtMs, null);
  time.advance(time.pending()[0]);
  assert.equal(sockets.length, 2);
  last().open();
  await settle();
  assert.deepEqual(last().sentOf('join').map((j) => j.token), ['token-2']);
});

test('TOKEN_EXPIRED and close 4003 with a fixed token: closed for good, saying why', () => {
  const { client, last, of, time, sockets } = joined({ token: 't' });
  last().receive({ tokenExpiring: { expiresAtMs: EXP } });
  assert.deepEqual(of('tokenExpiring').map((e) => e[1]), [{ expiresAtMs: EXP, refreshing: false }]);
  assert.deepEqual(last().sentOf('refresh'), []);
  last().receive({ error: { code: ErrorCode.TOKEN_EXPIRED, message: 'your token expired' } });
  last().drop(4003, 'token expired');
  const [[, closed]] = of('closed');
  assert.equal(closed.willReconnect, false);
  assert.equal(closed.text, 'Your sign-in expired before it was renewed.');
  assert.equal(client.state, State.CLOSED);
  time.advance(120_000);
  assert.equal(sockets.length, 1);
  // A close 4003 alone (the Error lost) says the same.
  const other = joined({ token: 't' });
  other.last().drop(4003, 'token expired');
  assert.equal(other.of('closed')[0][1].text, 'Your sign-in expired before it was renewed.');
  assert.equal(other.of('closed')[0][1].willReconnect, false);
});

test('with a token the name may be left to its name claim', () => {
  const { client, last } = setup({ token: 't' });
  client.join('lobby');
  last().open();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: '', token: 't', start: null, resumeToken: '', data: [] }]);
  const { client: open } = setup();
  assert.throws(() => open.join('lobby'), RangeError);
  assert.throws(() => setup({ token: 42 }), TypeError);
  assert.throws(() => setup({ getToken: 'nope' }), TypeError);
});

test('one url: every reconnect goes back to it, as before (a string or a list of one)', () => {
  for (const url of ['ws://a/ws', ['ws://a/ws']]) {
    const { client, last, sockets, time, of } = joined({ url });
    assert.deepEqual(client.urls, ['ws://a/ws']);
    assert.equal(client.url, 'ws://a/ws');
    for (let i = 0; i < 3; i++) {
      last().drop(1006);
      time.advance(time.pending()[0]);
    }
    assert.deepEqual(sockets.map((ws) => ws.url), ['ws://a/ws', 'ws://a/ws', 'ws://a/ws', 'ws://a/ws']);
    assert.deepEqual(of('closed').map((e) => [e[1].url, e[1].nextUrl]), Array(3).fill(['ws://a/ws', 'ws://a/ws']));
    // The backoff is the one-server backoff, untouched.
    assert.deepEqual(of('closed').map((e) => e[1].retryInMs), [375, 750, 1500]);
  }
});

test('several urls: a dropped connection reconnects through the next one, in turn, with the same backoff', () => {
  const urls = ['ws://n1/ws', 'ws://n2/ws', 'ws://n3/ws'];
  const { client, last, sockets, time, of } = joined({ url: urls });
  assert.equal(sockets[0].url, 'ws://n1/ws', 'the first one first');
  client.moveTo(1234, 2345);
  // Node 1 is killed: the page goes to node 2, which is down too, then to node 3.
  last().drop(1006);
  assert.equal(client.state, State.RECONNECTING);
  assert.equal(client.url, 'ws://n2/ws');
  time.advance(time.pending()[0]);
  last().drop(1006); // node 2 unreachable: never opened
  time.advance(time.pending()[0]);
  assert.deepEqual(sockets.map((ws) => ws.url), urls);
  assert.deepEqual(of('closed').map((e) => [e[1].url, e[1].nextUrl, e[1].retryInMs]), [
    ['ws://n1/ws', 'ws://n2/ws', 375],
    ['ws://n2/ws', 'ws://n3/ws', 750],
  ]);
  // Node 3 answers: the page rejoins the same room where it was.
  last().open();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: 'Me', token: '', start: null, resumeToken: '', data: [] }]);
  last().receive(welcome(7, [wire(0, 'Ada', 100, 100), wire(7, 'Me', 2500, 2500)]));
  assert.equal(client.state, State.JOINED);
  assert.equal(of('welcome')[1][1].rejoined, true);
  assert.deepEqual(last().sentOf('move')[0].position, { x: 1234, y: 2345 });
  // Node 3 goes too: after the last comes the first again, and the backoff started over.
  last().drop(1001);
  assert.equal(client.url, 'ws://n1/ws');
  assert.deepEqual(time.pending().slice(-1), [375]);
  time.advance(375);
  assert.equal(last().url, 'ws://n1/ws');
});

test('several urls as options.urls; a close not retried stays on its server', () => {
  const { client, last, sockets, time, of } = joined({ url: undefined, urls: ['ws://n1/ws', 'ws://n2/ws'] });
  assert.equal(sockets[0].url, 'ws://n1/ws');
  last().receive({ error: { code: ErrorCode.FLOOD, message: 'flood' } });
  last().drop(1008);
  assert.equal(client.state, State.CLOSED);
  assert.equal(client.url, 'ws://n1/ws');
  assert.equal(of('closed')[0][1].nextUrl, null);
  time.advance(60_000);
  assert.equal(sockets.length, 1);
});

test('url lists are checked: not empty, strings only, not both url and urls', () => {
  const base = { WebSocket: class {}, now: () => 0 };
  assert.throws(() => new AmbleClient({ ...base, url: [] }), TypeError);
  assert.throws(() => new AmbleClient({ ...base, url: ['ws://a/ws', ''] }), TypeError);
  assert.throws(() => new AmbleClient({ ...base, url: ['ws://a/ws', 3] }), TypeError);
  assert.throws(() => new AmbleClient({ ...base, urls: 'ws://a/ws,ws://b/ws'.split(','), url: 'ws://a/ws' }), TypeError);
  const client = new AmbleClient({ ...base, urls: ['ws://a/ws', 'ws://b/ws'] });
  assert.ok(Object.isFrozen(client.urls));
  client.url = 'ws://c/ws';
  assert.deepEqual(client.urls, ['ws://c/ws']);
});

test('a socket that fails with an error and no close event (Node) ends as closed, not connecting', () => {
  const { time, client, last, of } = setup({ reconnect: false });
  client.connect();
  assert.equal(client.state, 'connecting');
  last().failWithoutClose();
  time.advance(0);
  assert.equal(client.state, 'closed');
  const [[, closed]] = of('closed');
  assert.equal(closed.code, 1006);
  assert.equal(closed.opened, false);
  assert.equal(closed.willReconnect, false);
  assert.equal(last().closedWith !== null, true, 'the failed socket is closed');
});

test('with reconnects, a socket failing without a close event is retried', () => {
  const { time, client, sockets, last } = setup();
  client.connect();
  last().failWithoutClose();
  time.advance(0);
  assert.equal(client.state, 'reconnecting');
  time.advance(60_000);
  assert.equal(sockets.length, 2, 'a second attempt');
  // A browser's close event after the error changes nothing more.
  sockets[0].drop(1006);
  assert.equal(sockets.length, 2);
});

test('close() twice fires closed once', () => {
  const { client, last, of } = joined();
  client.close();
  client.close();
  assert.equal(of('closed').length, 1);
  assert.equal(client.state, 'closed');
  assert.equal(last().closedWith.code, 1000);
});

test('the reconnect wait is said as it is: tenths of a second under 10 s', () => {
  assert.equal(waitText(256), '0.3 s');
  assert.equal(waitText(1_332), '1.3 s');
  assert.equal(waitText(1_000), '1.0 s');
  assert.equal(waitText(9_949), '9.9 s');
  assert.equal(waitText(12_400), '12 s');
});

test('join may say where to appear; the start goes with every Join of that room, rejoins included', () => {
  const { client, last, time } = setup();
  assert.throws(() => client.join('lobby', 'Me', { start: { x: -1, y: 3 } }), RangeError);
  assert.throws(() => client.join('lobby', 'Me', { start: { x: Number.NaN, y: 3 } }), RangeError);
  client.join('lobby', 'Me', { start: { x: 120.4, y: 4999.6 } });
  last().open();
  assert.deepEqual(last().sentOf('join'), [{ room: 'lobby', name: 'Me', token: '', start: { x: 120, y: 5000 }, resumeToken: '', data: [] }]);
  last().drop(1006);
  time.advance(60_000);
  last().open();
  assert.deepEqual(last().sentOf('join')[0].start, { x: 120, y: 5000 });
});

// ------------------------------------------------------------ member data

test('join carries data, sorted by key, in every Join of that room; members expose data and a shared user', () => {
  const { client, last, time } = setup();
  client.join('lobby', 'Me', { data: { status: 'busy', colour: '#e4572e' } });
  last().open();
  const sent = [{ key: 'colour', value: '#e4572e' }, { key: 'status', value: 'busy' }];
  assert.deepEqual(last().sentOf('join')[0].data, sent);
  last().receive(welcome(1, [
    { ...wire(0, 'Ada', 100, 100), data: [{ key: 'role', value: 'host' }], user: 'user-7' },
    { ...wire(1, 'Me', 2500, 2500), data: sent },
  ]));
  assert.deepEqual(client.members.get(0).data, { role: 'host' });
  assert.equal(client.members.get(0).user, 'user-7');
  assert.deepEqual(client.me.data, { colour: '#e4572e', status: 'busy' });
  assert.equal(client.me.user, null, 'not shared: null');
  assert.ok(Object.isFrozen(client.me.data));
  // A reconnect rejoins with the same data.
  last().drop(1006);
  time.advance(60_000);
  last().open();
  assert.deepEqual(last().sentOf('join')[0].data, sent);
});

test('join refuses data the server would refuse before sending anything', () => {
  const { client, sockets } = setup();
  assert.throws(() => client.join('lobby', 'Me', { data: { Colour: 'red' } }), /key "Colour"/);
  assert.throws(() => client.join('lobby', 'Me', { data: { k: '' } }), /the value is empty/);
  assert.throws(() => client.join('lobby', 'Me', { data: { k: 3 } }), /must be text/);
  assert.throws(() => client.join('lobby', 'Me', { data: { k: 'x'.repeat(201) } }), /at most 200 characters/);
  assert.throws(() => client.join('lobby', 'Me', { data: ['a'] }), RangeError);
  const nine = Object.fromEntries([...Array(9).keys()].map((i) => [`k${i}`, 'v']));
  assert.throws(() => client.join('lobby', 'Me', { data: nine }), /at most 8 entries/);
  assert.throws(
    () => client.join('lobby', 'Me', { data: { a: 'x'.repeat(200), b: 'x'.repeat(200), c: 'x'.repeat(110) } }),
    /at most 512 bytes/,
  );
  assert.equal(sockets.length, 0);
});

test('dataProblem: removals only for setData', () => {
  assert.equal(dataProblem({ status: 'busy' }), null);
  assert.equal(dataProblem({ status: '' }, undefined, { removals: true }), null);
  assert.equal(dataProblem({ status: null }, undefined, { removals: true }), null);
  assert.match(dataProblem({ status: null }), /must be text/);
  assert.match(dataProblem({ 'a b': 'x' }), /key "a b"/);
});

test('setData sends entries, removals as empty values, within its budget; the data event follows the server', () => {
  const { client, last, of, time } = joined();
  assert.equal(client.setData({ status: 'presenting', colour: null }), true);
  assert.deepEqual(last().sentOf('setData'), [
    { data: [{ key: 'colour', value: '' }, { key: 'status', value: 'presenting' }] },
  ]);
  assert.equal(of('data').length, 0, 'nothing until the server says so');
  last().receive({ memberData: { memberId: 1, data: [{ key: 'status', value: 'presenting' }] } });
  const [[, member, previous]] = of('data');
  assert.equal(member, client.me);
  assert.deepEqual(previous, {});
  assert.deepEqual(client.me.data, { status: 'presenting' });
  // Someone else's change.
  last().receive({ memberData: { memberId: 0, data: [{ key: 'colour', value: 'red' }] } });
  assert.deepEqual(client.members.get(0).data, { colour: 'red' });
  assert.equal(of('data').length, 2);
  // An unknown member's data is ignored.
  last().receive({ memberData: { memberId: 99, data: [] } });
  assert.equal(of('data').length, 2);
  // Budget: a burst of 3, then one per dataIntervalMs.
  assert.equal(client.setData({ a: '1' }), true);
  assert.equal(client.setData({ a: '2' }), true);
  assert.equal(client.setData({ a: '3' }), false);
  assert.equal(last().sentOf('setData').length, 3);
  time.advance(1_010);
  assert.equal(client.setData({ a: '3' }), true);
  assert.throws(() => client.setData({ A: '1' }), RangeError);
  // The data set last goes with a rejoin.
  last().drop(1006);
  time.advance(60_000);
  last().open();
  assert.deepEqual(last().sentOf('join')[0].data, [{ key: 'a', value: '3' }, { key: 'status', value: 'presenting' }]);
});

test('a snapshot replaces members\' data; INVALID_DATA refuses a join and explains itself', () => {
  const { client, last, of } = joined();
  last().receive({ resync: { serverTimeMs: EPOCH, members: [
    { ...wire(0, 'Ada', 100, 100), data: [{ key: 'status', value: 'away' }], user: 'u-1' },
    wire(1, 'Me', 2500, 2500),
  ] } });
  assert.deepEqual(client.members.get(0).data, { status: 'away' });
  assert.equal(client.members.get(0).user, 'u-1');
  client.join('other', 'Me');
  last().receive({ error: { code: ErrorCode.INVALID_DATA, message: 'the token\'s data claim: key "Role": bad' } });
  const info = of('error').at(-1)[1];
  assert.equal(info.refused, true);
  assert.match(info.text, /can't be set/);
  assert.throws(() => client.setData({ a: '1' }), /join one first/);
});
