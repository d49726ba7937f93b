// The page lifecycle (options.pageLifecycle): a page hidden for the
// back/forward cache, or unloaded, leaves its room and closes its socket
// cleanly; back from the cache, it reconnects and rejoins as one member.
// The page's event target and the WebSocket are fakes; no real timers.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { AmbleClient, State } from '../amble.js';
import { decodeClientMessage, encodeServerMessage } from '../codec.js';

const EPOCH = 1_764_600_000_000;

/** An event target with the listeners in view. */
class FakePage {
  listeners = new Map();
  addEventListener(type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
  }
  removeEventListener(type, fn) {
    this.listeners.get(type)?.delete(fn);
  }
  count(type) {
    return this.listeners.get(type)?.size ?? 0;
  }
  fire(type, event) {
    for (const fn of this.listeners.get(type) ?? []) fn(event);
  }
}

function setup(options = {}) {
  const sockets = [];
  class FakeSocket {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.sentBytes = [];
      this.closedWith = null;
      sockets.push(this);
    }
    sentOf(kind) {
      return this.sentBytes.map((b) => decodeClientMessage(b)).filter((m) => m[kind]).map((m) => m[kind]);
    }
    send(bytes) {
      assert.equal(this.readyState, 1, 'send on an open socket only');
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
    }
  }
  const timers = new Map();
  let nextId = 1;
  const page = new FakePage();
  const client = new AmbleClient({
    url: 'ws://test/ws',
    WebSocket: FakeSocket,
    now: () => 0,
    setTimeout: (fn, ms) => {
      timers.set(nextId, { fn, ms });
      return nextId++;
    },
    clearTimeout: (id) => timers.delete(id),
    random: () => 0.5,
    pageTarget: page,
    ...options,
  });
  const events = [];
  for (const type of ['state', 'welcome', 'closed', 'left']) client.on(type, (...args) => events.push([type, ...args]));
  const of = (type) => events.filter((e) => e[0] === type).map((e) => e[1]);
  return { client, sockets, page, timers, of, last: () => sockets[sockets.length - 1] };
}

const welcome = (memberId, members) => ({
  welcome: {
    memberId,
    room: 'lobby',
    snapshot: { serverTimeMs: EPOCH, members },
    serverVersion: '0.1.0',
    protocolRevision: 2,
  },
});
const wire = (id, name, x, y) => ({ id, name, position: { x, y }, walk: null, movedAtMs: EPOCH });

/** In room lobby as Me (member 1), with Ada (0), started at (100, 200) with a colour. */
function joined(options) {
  const s = setup(options);
  s.client.join('lobby', 'Me', { start: { x: 100, y: 200 }, resumeToken: '', data: { colour: 'teal' } });
  s.last().open();
  s.last().receive(welcome(1, [wire(0, 'Ada', 10, 10), wire(1, 'Me', 100, 200)]));
  assert.equal(s.client.state, State.JOINED);
  return s;
}

const JOIN = { room: 'lobby', name: 'Me', token: '', start: { x: 100, y: 200 }, resumeToken: '', data: [{ key: 'colour', value: 'teal' }] };

test('pagehide for the back/forward cache: Leave, close 1000, no failure and no reconnect', () => {
  const { client, sockets, page, timers, of, last } = joined();
  assert.equal(page.count('pagehide'), 1);
  assert.equal(page.count('pageshow'), 1);
  const ws = last();
  assert.deepEqual(ws.sentOf('join'), [JOIN]);
  page.fire('pagehide', { persisted: true });
  assert.equal(ws.sentOf('leave').length, 1, 'Leave sent before the close');
  assert.deepEqual(ws.closedWith, { code: 1000, reason: 'page hidden' });
  assert.equal(client.state, State.IDLE);
  assert.deepEqual(of('closed'), [], 'not reported as a close');
  assert.equal(timers.size, 0, 'no reconnect (and no ping) scheduled');
  assert.equal(sockets.length, 1);
  // A late event from the old socket changes nothing.
  ws.onclose?.({ code: 1000, reason: '' });
  assert.equal(client.state, State.IDLE);
  // A second pagehide does nothing.
  page.fire('pagehide', { persisted: true });
  assert.equal(ws.sentOf('leave').length, 1);
});

test('pageshow from the cache: a new socket, the same Join, and a rejoin', () => {
  const { client, sockets, page, of, last } = joined();
  page.fire('pagehide', { persisted: true });
  page.fire('pageshow', { persisted: true });
  assert.equal(sockets.length, 2, 'a new socket');
  assert.equal(client.state, State.CONNECTING);
  last().open();
  assert.deepEqual(last().sentOf('join'), [JOIN], 'the same room, name, start and data');
  last().receive(welcome(3, [wire(0, 'Ada', 10, 10), wire(3, 'Me', 100, 200)]));
  assert.equal(client.state, State.JOINED);
  const welcomes = of('welcome');
  assert.equal(welcomes.length, 2);
  assert.equal(welcomes[1].rejoined, true);
  assert.deepEqual([...client.members.keys()].sort(), [0, 3], 'yourself once');
  assert.deepEqual(of('state'), ['connecting', 'open', 'joining', 'joined', 'idle', 'connecting', 'open', 'joining', 'joined']);
});

test('a pageshow that is a fresh load (not persisted) does not reconnect', () => {
  const { sockets, page } = joined();
  page.fire('pagehide', { persisted: false });
  assert.deepEqual(sockets[0].closedWith, { code: 1000, reason: 'page hidden' });
  assert.equal(sockets[0].sentOf('leave').length, 1);
  page.fire('pageshow', { persisted: false });
  assert.equal(sockets.length, 1);
});

test('pagehide while connecting closes the socket and sends nothing; pageshow starts over', () => {
  const { client, sockets, page, last } = setup();
  client.join('lobby', 'Me');
  page.fire('pagehide', { persisted: true });
  assert.deepEqual(sockets[0].closedWith, { code: 1000, reason: 'page hidden' });
  assert.equal(sockets[0].sentBytes.length, 0);
  page.fire('pageshow', { persisted: true });
  last().open();
  assert.equal(last().sentOf('join').length, 1);
  assert.equal(sockets.length, 2);
});

test('pagehide while waiting to reconnect cancels the retry; pageshow retries at once', () => {
  const { client, sockets, page, timers, last } = joined();
  last().onclose({ code: 1006, reason: '' });
  assert.equal(client.state, State.RECONNECTING);
  page.fire('pagehide', { persisted: true });
  assert.equal(timers.size, 0);
  assert.equal(client.state, State.IDLE);
  page.fire('pageshow', { persisted: true });
  assert.equal(sockets.length, 2);
});

test('close() removes the listeners, and a closed client ignores the page', () => {
  const { client, page, sockets } = joined();
  const listeners = [page.listeners.get('pagehide'), page.listeners.get('pageshow')].map((set) => [...set][0]);
  client.close();
  assert.equal(page.count('pagehide'), 0);
  assert.equal(page.count('pageshow'), 0);
  listeners[0]({ persisted: true });
  listeners[1]({ persisted: true });
  assert.equal(sockets.length, 1);
  assert.equal(client.state, State.CLOSED);
  // connect() again listens again, once.
  client.connect();
  client.connect();
  assert.equal(page.count('pagehide'), 1);
});

test('pageLifecycle: false adds no listeners; under Node the default adds none either', () => {
  const off = setup({ pageLifecycle: false });
  off.client.join('lobby', 'Me');
  assert.equal(off.page.count('pagehide'), 0);
  const node = setup({ pageTarget: undefined });
  node.client.join('lobby', 'Me');
  assert.equal(node.client.pageTarget, null, 'no window or document under Node');
  assert.throws(() => setup({ pageTarget: {} }), /pageTarget must have addEventListener/);
});

// Held places (revision 4): the Welcome's resume token goes with every
// Join back into the same room, and a page going into the cache closes
// without a Leave so that its place is held.

const TOKEN = 'ab'.repeat(16);
const NEXT = 'cd'.repeat(16);
const resumable = (memberId, members, resumeToken, resumed = false) => ({
  welcome: { ...welcome(memberId, members).welcome, protocolRevision: 4, resumeToken, resumed },
});

/** In room lobby as Me (member 1) with Ada (0), holding resume token TOKEN. */
function held(options) {
  const s = setup(options);
  s.client.join('lobby', 'Me', { start: { x: 100, y: 200 }, data: { colour: 'teal' } });
  s.last().open();
  s.last().receive(resumable(1, [wire(0, 'Ada', 10, 10), wire(1, 'Me', 100, 200)], TOKEN));
  assert.equal(s.client.resumeToken, TOKEN);
  return s;
}

test('pagehide into the cache with a resume token: no Leave, the place is held; pageshow resumes it', () => {
  const { client, sockets, page, of, last } = held();
  const left = [];
  client.on('left', (m) => left.push(m.id));
  const ada = client.members.get(0);
  page.fire('pagehide', { persisted: true });
  assert.equal(sockets[0].sentOf('leave').length, 0, 'no Leave: the server holds the place');
  assert.deepEqual(sockets[0].closedWith, { code: 1000, reason: 'page hidden' });
  page.fire('pageshow', { persisted: true });
  last().open();
  assert.deepEqual(last().sentOf('join'), [{ ...JOIN, resumeToken: TOKEN }]);
  last().receive(resumable(1, [wire(0, 'Ada', 10, 10), wire(1, 'Me', 100, 200)], NEXT, true));
  const w = of('welcome')[1];
  assert.equal(w.resumed, true);
  assert.equal(w.rejoined, true);
  assert.deepEqual([...client.members.keys()].sort(), [0, 1], 'one of you, one Ada');
  assert.equal(client.members.get(0), ada, 'the others are the same objects');
  assert.deepEqual(left, []);
  assert.equal(client.resumeToken, NEXT, 'the next token, for the next drop');
});

test('an unload (not persisted) leaves, even with a resume token', () => {
  const { sockets, page } = held();
  page.fire('pagehide', { persisted: false });
  assert.equal(sockets[0].sentOf('leave').length, 1);
});

test('every reconnect and failover sends the newest token; a new join, a leave or a close sends none', () => {
  const { client, timers, last } = held({ url: ['ws://a/ws', 'ws://b/ws'] });
  const retry = () => {
    const [[id, { fn }]] = [...timers.entries()].filter(([, t]) => t.ms > 100);
    timers.delete(id);
    fn();
  };
  last().onclose({ code: 1006, reason: '' });
  retry();
  assert.equal(last().url, 'ws://a/ws', 'the node that holds the place first');
  last().onclose({ code: 1006, reason: '' });
  retry();
  assert.equal(last().url, 'ws://b/ws', 'failover to the next node');
  last().open();
  assert.equal(last().sentOf('join')[0].resumeToken, TOKEN);
  last().receive(resumable(9, [wire(0, 'Ada', 10, 10), wire(9, 'Me', 100, 200)], NEXT));
  assert.equal(client.memberId, 9);
  assert.equal(client.resumeToken, NEXT);
  client.join('other', 'Me');
  assert.equal(last().sentOf('join')[1].resumeToken, '', 'another room: a fresh arrival');
  assert.equal(client.resumeToken, null);
  client.close();
  assert.equal(client.resumeToken, null);
});

test('Renumbered moves a member to its new id: the same object, no left and no joined', () => {
  const { client, last, of } = held();
  const joined = [];
  client.on('joined', (m) => joined.push(m.id));
  const renumbered = [];
  client.on('renumbered', (m, old) => renumbered.push([m.id, old]));
  const ada = client.members.get(0);
  last().receive({ renumbered: { oldId: 0, newId: 17 } });
  assert.equal(client.members.get(17), ada);
  assert.equal(ada.id, 17);
  assert.equal(client.members.has(0), false);
  assert.deepEqual(renumbered, [[17, 0]]);
  assert.deepEqual(of('left'), []);
  assert.deepEqual(joined, []);
  // Yourself, renumbered: your id follows.
  last().receive({ renumbered: { oldId: 1, newId: 33 } });
  assert.equal(client.memberId, 33);
  assert.equal(client.me.id, 33);
  assert.equal(client.members.get(33), client.me);
  // An id nobody has changes nothing.
  last().receive({ renumbered: { oldId: 5, newId: 6 } });
  assert.deepEqual([...client.members.keys()].sort((a, b) => a - b), [17, 33]);
});

test('close 4001 (the place resumed from a newer connection) is not retried', () => {
  const { client, last, timers } = held();
  last().onclose({ code: 4001, reason: 'resumed by a newer connection' });
  assert.equal(client.state, State.CLOSED);
  assert.equal([...timers.values()].filter((t) => t.ms > 100).length, 0);
});

test('several urls with a resume token: the first retry after a drop goes back to the same server, the next ones on', () => {
  const { client, last, timers } = held({ url: ['ws://a/ws', 'ws://b/ws'] });
  const retry = () => {
    const [[id, { fn }]] = [...timers.entries()].filter(([, t]) => t.ms > 100);
    timers.delete(id);
    fn();
  };
  last().onclose({ code: 1006, reason: '' });
  assert.equal(client.url, 'ws://a/ws', 'the server that holds the place first');
  retry();
  assert.equal(last().url, 'ws://a/ws');
  last().onclose({ code: 1006, reason: '' }); // it is gone: never opened
  assert.equal(client.url, 'ws://b/ws', 'then the next one');
  retry();
  last().open();
  assert.equal(last().sentOf('join')[0].resumeToken, TOKEN);
  // A server going away (1001) is left for the next one at once.
  last().receive(resumable(9, [wire(0, 'Ada', 10, 10), wire(9, 'Me', 100, 200)], NEXT));
  last().onclose({ code: 1001, reason: 'server shutting down' });
  assert.equal(client.url, 'ws://a/ws');
});
