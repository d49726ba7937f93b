// What the client library tells a page when the server is out of reach or
// says "slow down" (issue 10, items 5, 6 and 11): a clear close text for a
// server that cannot be reached, join rate limits as refusals, and when
// chat may be sent again.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { AmbleClient, DEFAULT_LIMITS, ErrorCode, State, retryAfterMs } from '../amble.js';
import { encodeServerMessage } from '../codec.js';

const EPOCH = 1_764_600_000_000;

function setup() {
  let now = 0;
  const timers = [];
  const sockets = [];
  class FakeSocket {
    constructor() {
      this.readyState = 0;
      sockets.push(this);
    }
    send() {}
    close() {}
    open() {
      this.readyState = 1;
      this.onopen?.({});
    }
    receive(msg) {
      const b = encodeServerMessage(msg);
      this.onmessage?.({ data: b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength) });
    }
    drop(code = 1006) {
      this.readyState = 3;
      this.onclose?.({ code, reason: '' });
    }
  }
  const client = new AmbleClient({
    url: 'ws://test/ws',
    WebSocket: FakeSocket,
    now: () => now,
    setTimeout: (fn, ms) => timers.push({ fn, at: now + ms }),
    clearTimeout: () => {},
    random: () => 0.5,
  });
  const events = [];
  for (const type of ['error', 'closed']) client.on(type, (e) => events.push([type, e]));
  return { client, sockets, events, advance: (ms) => (now += ms) };
}

const welcome = (limits = {}) => ({
  welcome: {
    memberId: 0,
    room: 'lobby',
    limits: { ...DEFAULT_LIMITS, chatIntervalMs: 2000, chatBurst: 2, ...limits },
    snapshot: { serverTimeMs: EPOCH, members: [{ id: 0, name: 'Me', position: { x: 0, y: 0 }, movedAtMs: EPOCH }] },
  },
});

test('a server that cannot be reached is named as such, not as a lost connection', () => {
  const { client, sockets, events } = setup();
  client.join('lobby', 'Me');
  sockets[0].drop(1006); // refused: the socket never opened
  const [, closed] = events.find(([t]) => t === 'closed');
  assert.equal(closed.opened, false);
  assert.equal(closed.retryInMs, 375);
  assert.match(closed.text, /^Can't reach the server\. Reconnecting in 0\.4 s…$/);
  // Once it had opened, the same close is a lost connection.
  const { client: c2, sockets: s2, events: e2 } = setup();
  c2.join('lobby', 'Me');
  s2[0].open();
  s2[0].drop(1006);
  const [, lost] = e2.find(([t]) => t === 'closed');
  assert.equal(lost.opened, true);
  assert.match(lost.text, /^The connection was lost\./);
});

test('joining too often is a refusal with the wait, not a Join left hanging', () => {
  const { client, sockets, events } = setup();
  client.join('lobby', 'Me');
  sockets[0].open();
  sockets[0].receive({ error: { code: ErrorCode.RATE_LIMITED, message: 'joining too often: try again in 1500 ms' } });
  const [, err] = events.find(([t]) => t === 'error');
  assert.equal(err.refused, true);
  assert.equal(err.retryInMs, 1500);
  assert.equal(client.state, State.OPEN, 'no longer joining; the socket stays open');
});

test('chatWaitMs says when chat may be sent again, and follows the server when it says', () => {
  const { client, sockets, advance } = setup();
  client.join('lobby', 'Me');
  sockets[0].open();
  sockets[0].receive(welcome());
  assert.equal(client.chatWaitMs(), 0);
  assert.equal(client.chat('one'), true);
  assert.equal(client.chat('two'), true);
  assert.equal(client.chat('three'), false, 'the burst of 2 is spent');
  assert.equal(client.chatWaitMs(), 2010, 'one interval (plus the pacing slack)');
  advance(1010);
  assert.equal(client.chatWaitMs(), 1000);
  advance(1000);
  assert.equal(client.chatWaitMs(), 0);
  // The server dropped one anyway (its budget is what counts): wait as it says.
  sockets[0].receive({
    error: { code: ErrorCode.RATE_LIMITED, message: 'chat budget spent: message dropped, next allowed in 1840 ms' },
  });
  assert.equal(client.chatWaitMs(), 1840);
  assert.equal(client.state, State.JOINED, 'a dropped chat is no refusal');
});

test('retryAfterMs reads the wait out of the server text', () => {
  assert.equal(retryAfterMs('chat budget spent: message dropped, next allowed in 250 ms'), 250);
  assert.equal(retryAfterMs('joining too often: try again in 0 ms'), 0);
  assert.equal(retryAfterMs('slow down'), null);
  assert.equal(retryAfterMs(undefined), null);
});
