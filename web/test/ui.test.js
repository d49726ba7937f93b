// The demo's small rules (issue 10, the browser demo): keys on buttons,
// notices after a reconnect, the lobby's capacity, the title, names and
// colours, labels, edge markers, and what the stylesheet promises.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { AmbleClient, State } from '../amble.js';
import { ErrorCode, LeaveReason } from '../codec.js';
import {
  MAX_STATUS_CHARS,
  ReturnFilter,
  contrast,
  dataColour,
  dataStatus,
  errorInChat,
  inSeconds,
  keyBelongsTo,
  leftVerb,
  nameLimitHint,
  outageReason,
  roomStatus,
  serverUrls,
  statusChange,
  titleFor,
} from '../ui.js';
import { LabelGrid, PALETTE, colourDistance, colourFor, distinctColour, edgePoint, ellipsize, initial } from '../view.js';

const el = (tagName, { type, role, editable } = {}) => ({
  tagName,
  type,
  isContentEditable: !!editable,
  getAttribute: (name) => (name === 'role' ? (role ?? null) : null),
});

test('Enter and Space on a focused button press it; the page shortcuts keep other keys (item 1)', () => {
  for (const key of ['Enter', ' ']) {
    assert.equal(keyBelongsTo(el('BUTTON'), key), true, `${key} on a button`);
    assert.equal(keyBelongsTo(el('A'), key), true);
    assert.equal(keyBelongsTo(el('DIV', { role: 'tab' }), key), true);
    assert.equal(keyBelongsTo(el('INPUT', { type: 'checkbox' }), key), true);
  }
  // WASD and +/- still walk and zoom while a button has focus.
  for (const key of ['w', 'a', '+', 'ArrowUp']) assert.equal(keyBelongsTo(el('BUTTON'), key), false, key);
  // Enter on the floor (canvas) or the page opens the chat.
  assert.equal(keyBelongsTo(el('CANVAS'), 'Enter'), false);
  assert.equal(keyBelongsTo(el('BODY'), 'Enter'), false);
  assert.equal(keyBelongsTo(null, 'Enter'), false);
  // Text fields take every key.
  for (const key of ['w', 'Enter', ' ']) {
    assert.equal(keyBelongsTo(el('INPUT'), key), true);
    assert.equal(keyBelongsTo(el('INPUT', { type: 'search' }), key), true);
    assert.equal(keyBelongsTo(el('TEXTAREA'), key), true);
    assert.equal(keyBelongsTo(el('DIV', { editable: true }), key), true);
  }
});

test('after a reconnect, people who were there are not announced as joining (item 10)', () => {
  const f = new ReturnFilter({ graceMs: 30_000 });
  f.dropped(['Ada', 'Bo', 'Bo', 'Cy']);
  // Ada is in the snapshot of the rejoin; Bo (twice) and Cy come back later.
  assert.deepEqual(f.rejoined(1000, ['Ada']).sort(), ['Bo', 'Cy']);
  assert.equal(f.returning('Bo', 2000), true);
  assert.equal(f.returning('Bo', 2500), true, 'both Bos were there');
  assert.equal(f.returning('Bo', 3000), false, 'a third Bo is new');
  assert.equal(f.returning('Dee', 3000), false, 'never there: news');
  assert.equal(f.returning('Ada', 3000), false, 'Ada was back already; a second Ada is news');
  // Past the grace period even Cy is news (they may have left and come back).
  assert.equal(f.returning('Cy', 40_000), false);
});

test('a second drop before the rejoin keeps the first list', () => {
  const f = new ReturnFilter();
  f.dropped(['Ada']);
  f.dropped([]); // the next attempt failed too, with an empty room
  f.rejoined(0, []);
  assert.equal(f.returning('Ada', 10), true);
  f.clear();
  f.dropped(['Bo']);
  f.clear(); // left the room
  assert.equal(f.returning('Bo', 10), false);
});

test('the lobby shows places taken and full rooms as full (item 4)', () => {
  assert.deepEqual(roomStatus({ members: 3, capacity: 500 }), {
    full: false,
    count: '3/500',
    title: '3 of 500 places taken',
  });
  assert.equal(roomStatus({ members: 500, capacity: 500 }).full, true);
  assert.match(roomStatus({ members: 500, capacity: 500 }).title, /full/);
  // An older server without capacity: counts only, never "full".
  assert.deepEqual(roomStatus({ members: 1 }), { full: false, count: '1', title: '1 member' });
});

test('the title names the room and counts unread chat (item 19)', () => {
  assert.equal(titleFor(null, 0), 'amble');
  assert.equal(titleFor('lobby', 0), 'lobby · amble');
  assert.equal(titleFor('lobby', 3), '(3) lobby · amble');
  assert.equal(titleFor('lobby', 250), '(99+) lobby · amble');
});

test('waits read in whole seconds, never "in 0 s" (items 10, 11)', () => {
  assert.equal(inSeconds(1), 'in 1 s');
  assert.equal(inSeconds(0), 'in 1 s');
  assert.equal(inSeconds(-50), 'in 1 s');
  assert.equal(inSeconds(1001), 'in 2 s');
  assert.equal(inSeconds(15_000), 'in 15 s');
});

test('initials are whole grapheme clusters (item 16)', () => {
  assert.equal(initial('🇫🇷 Marie'), '🇫🇷');
  assert.equal(initial('👩‍👩‍👧 family'), '👩‍👩‍👧');
  assert.equal(initial('  élodie'), 'É');
  assert.equal(initial('e\u0301mile'), 'E\u0301');
  assert.equal(initial('   '), '?');
});

test('long names are cut with an ellipsis, not squeezed (item 13)', () => {
  const measure = (t) => [...t].length * 10; // 10 px a character
  assert.equal(ellipsize('Ada', 100, measure), 'Ada');
  assert.equal(ellipsize('Bartholomew the Great', 100, measure), 'Bartholom…');
  const cut = ellipsize('Bartholomew the Great', 100, measure);
  assert.ok(measure(cut) <= 100 && cut.endsWith('…'), cut);
  // Never inside a cluster: a flag stays whole or goes whole.
  const flags = ellipsize('🇫🇷🇫🇷🇫🇷🇫🇷', 35, (t) => Array.from(new Intl.Segmenter().segment(t)).length * 10);
  assert.equal(flags, '🇫🇷🇫🇷…');
});

test('two members with one name get different colours (item 8)', () => {
  const first = colourFor('Ada');
  assert.equal(distinctColour('Ada', []), first);
  const second = distinctColour('Ada', [first]);
  assert.notEqual(second, first);
  // Not a near neighbour (the palette has two purples, two blues, two yellows).
  for (const name of ['Ada', 'Bo', 'bot 1', 'Marie']) {
    const a = colourFor(name);
    assert.ok(colourDistance(a, distinctColour(name, [a])) > 150, name);
  }
  const taken = [];
  for (let i = 0; i < PALETTE.length; i++) taken.push(distinctColour('Ada', taken));
  assert.equal(new Set(taken).size, PALETTE.length, 'twelve Adas, twelve colours');
});

test('edge markers sit where an off-screen member is, on the edge (item 3)', () => {
  const out = { x: 0, y: 0 };
  // Far to the right: on the right edge, level with the centre.
  assert.deepEqual(edgePoint(50, 50, 1000, 50, 10, 10, 90, 90, out), { x: 90, y: 50 });
  // Up and left, steeper than the diagonal: on the top edge.
  edgePoint(50, 50, 30, -350, 10, 10, 90, 90, out);
  assert.equal(out.y, 10);
  assert.ok(Math.abs(out.x - 48) < 1e-9);
  // Inside: unchanged.
  assert.deepEqual(edgePoint(50, 50, 60, 70, 10, 10, 90, 90, out), { x: 60, y: 70 });
});

test('labels are placed only where none is yet (item 13)', () => {
  const grid = new LabelGrid();
  grid.resize(200, 100, 10);
  assert.equal(grid.fits(0, 0, 50, 20), true);
  grid.mark(0, 0, 50, 20);
  assert.equal(grid.fits(40, 10, 90, 30), false, 'overlaps');
  assert.equal(grid.fits(50, 0, 100, 20), true, 'touching is fine');
  assert.equal(grid.fits(-80, 50, -10, 70), true, 'off the canvas');
  grid.clear();
  assert.equal(grid.fits(40, 10, 90, 30), true);
});

// ------------------------------------------------------------ the stylesheet

const css = readFileSync(new URL('../style.css', import.meta.url), 'utf8');
const vars = Object.fromEntries([...css.matchAll(/--([\w-]+):\s*(#[0-9a-f]{6})/gi)].map((m) => [m[1], m[2]]));

/** The declarations of `selector`'s first rule inside `scope` (the whole sheet by default). */
function rule(selector, scope = css) {
  // At the start of a line (after indentation), so `input` is not `button, input`.
  const m = new RegExp(`(^|\\n)[ \\t]*${selector.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\{`).exec(scope);
  assert.ok(m, `no rule for ${selector}`);
  const i = m.index;
  return scope.slice(i, scope.indexOf('}', i));
}

function media(query) {
  const i = css.indexOf(`@media ${query} {`);
  assert.ok(i >= 0, `no @media ${query}`);
  let depth = 0;
  for (let j = css.indexOf('{', i); j < css.length; j++) {
    if (css[j] === '{') depth++;
    else if (css[j] === '}' && --depth === 0) return css.slice(i, j);
  }
  throw new Error('unbalanced');
}

test('small text is at least 4.5:1 on every panel: placeholders, timestamps, muted text (item 17)', () => {
  assert.match(rule('input::placeholder'), /color: var\(--faint\)/);
  assert.match(rule('.messages .time'), /color: var\(--faint\)/);
  for (const fg of ['faint', 'muted']) {
    for (const bg of ['bg', 'bg-2', 'panel', 'panel-2']) {
      const ratio = contrast(vars[fg], vars[bg]);
      assert.ok(ratio >= 4.5, `--${fg} on --${bg}: ${ratio.toFixed(2)}:1`);
    }
  }
  assert.ok(contrast('#5d6a7b', vars['bg-2']) < 4.5, 'the old placeholder colour would fail');
});

test('inputs are 16 px in the text colour, so typed text is no placeholder and iOS does not zoom (item 12)', () => {
  assert.match(rule('input'), /font-size: 16px/);
  assert.match(rule('input'), /color: var\(--text\)/);
  assert.match(rule('.field input'), /font-size: 16px; color: var\(--text\)/);
});

test('the phone layout keeps the walk hint (item 9)', () => {
  const phone = media('(max-width: 760px)');
  assert.doesNotMatch(phone, /\.hint \{[^}]*display: none/);
  assert.match(rule('.hint', phone), /bottom: 8px/);
});

test('a member whose server went away is said to have lost it; other reasons keep their words', () => {
  assert.equal(leftVerb(7), 'lost their server', 'LEAVE_REASON_SERVER_LOST');
  if (LeaveReason.SERVER_LOST !== undefined) assert.equal(LeaveReason.SERVER_LOST, 7);
  assert.equal(leftVerb(LeaveReason.TIMED_OUT), 'timed out');
  for (const reason of [LeaveReason.LEFT, LeaveReason.DISCONNECTED, LeaveReason.KICKED, LeaveReason.SHUTDOWN, LeaveReason.REPLACED, 0, 99]) {
    assert.equal(leftVerb(reason), 'left', `reason ${reason}`);
  }
  // Ada's page came back through another node before hers was noticed gone: nothing to say.
  assert.equal(leftVerb(7, 'Ada', ['Bo', 'Ada']), null);
  assert.equal(leftVerb(7, 'Ada', ['Bo']), 'lost their server');
  assert.equal(leftVerb(LeaveReason.LEFT, 'Ada', ['Ada']), 'left', 'only a lost server is taken back');
});

const at = (href) => {
  const u = new URL(href);
  return { protocol: u.protocol, host: u.host, hostname: u.hostname, port: u.port, search: u.search };
};

test('the demo connects to its own server, then to the cluster nodes ?nodes= names on the same host', () => {
  assert.deepEqual(serverUrls(at('http://localhost:3000/')), ['ws://localhost:3000/ws'], 'no list: this server only');
  assert.deepEqual(serverUrls(at('http://localhost:3000/?nodes=3000,3001')), ['ws://localhost:3000/ws', 'ws://localhost:3001/ws']);
  assert.deepEqual(serverUrls(at('http://localhost:3001/?nodes=3000,3001')), ['ws://localhost:3001/ws', 'ws://localhost:3000/ws']);
  assert.deepEqual(serverUrls(at('https://amble.example.com/?nodes=443,8443,8443')), [
    'wss://amble.example.com/ws',
    'wss://amble.example.com:8443/ws',
  ]);
  assert.deepEqual(serverUrls(at('http://[::1]:3000/?nodes=3001')), ['ws://[::1]:3000/ws', 'ws://[::1]:3001/ws']);
  // Ports only: anything else (another host, a path, nonsense) is left out.
  assert.deepEqual(serverUrls(at('http://localhost:3000/?nodes=evil.example:3001,3002/x,0,65536,-1,,%203003%20')), [
    'ws://localhost:3000/ws',
    'ws://localhost:3003/ws',
  ]);
});

test('one stop, one message: the restart is said once, in the banner (issue 18)', () => {
  assert.equal(errorInChat(ErrorCode.SHUTTING_DOWN), false);
  assert.equal(errorInChat(ErrorCode.INVALID_CHAT), true);
  assert.equal(errorInChat(ErrorCode.TOO_BIG), true);
  // The first close of an outage gives the reason; the failed attempts after it keep it.
  let why = outageReason('', 'The server is restarting. Reconnecting in 0.4 s…');
  assert.equal(why, 'The server is restarting.');
  why = outageReason(why, "Can't reach the server. Reconnecting in 1.7 s…");
  assert.equal(why, 'The server is restarting.');
  // A new outage starts from ''.
  assert.equal(outageReason('', "Can't reach the server. Reconnecting in 8 s…"), "Can't reach the server.");
  assert.equal(outageReason('', 'The connection was lost.'), 'The connection was lost.');
});

test('the name field says when it stopped taking letters (issue 18)', () => {
  assert.equal(nameLimitHint('', 32), '');
  assert.equal(nameLimitHint('a'.repeat(31), 32), '');
  assert.equal(nameLimitHint('a'.repeat(32), 32), 'At most 32 characters.');
  assert.equal(nameLimitHint('a'.repeat(40), 32), 'At most 32 characters.');
  // No limit on the field (maxLength -1): nothing to say.
  assert.equal(nameLimitHint('a'.repeat(40), -1), '');
});

test('reconnectNow runs the waiting attempt at once, and only a waiting one (issue 18)', () => {
  // Timers on a hand-moved clock.
  const due = new Map();
  let nextId = 1;
  const sockets = [];
  class FakeSocket {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      sockets.push(this);
    }
    send() {}
    close() {
      this.readyState = 3;
    }
  }
  const client = new AmbleClient({
    url: 'ws://127.0.0.1:1/ws',
    WebSocket: FakeSocket,
    setTimeout: (fn, ms) => {
      const id = nextId++;
      due.set(id, { fn, ms });
      return id;
    },
    clearTimeout: (id) => due.delete(id),
    now: () => 0,
    random: () => 0,
  });
  assert.equal(client.reconnectNow(), false, 'nothing to reconnect before connecting');
  client.connect();
  assert.equal(sockets.length, 1);
  // Never opened: the client waits its backoff before the next attempt.
  sockets[0].onclose({ code: 1006, reason: '' });
  assert.equal(client.state, State.RECONNECTING);
  const waiting = [...due.entries()].find(([, t]) => t.ms === 500);
  assert.ok(waiting, 'a 500 ms backoff is waiting');
  assert.equal(client.reconnectNow(), true);
  assert.equal(sockets.length, 2, 'a new attempt at once');
  assert.equal(client.state, State.CONNECTING);
  assert.equal(due.has(waiting[0]), false, 'the backoff timer is cleared');
  assert.equal(client.reconnectNow(), false, 'an attempt under way is not doubled');
  sockets[1].onclose({ code: 1006, reason: '' });
  assert.equal(client.state, State.RECONNECTING);
  client.close();
  assert.equal(client.reconnectNow(), false, 'close() ends the reconnecting');
  assert.equal(sockets.length, 2);
});

test('member data: a colour only as #rrggbb, a status trimmed and cut short, the picker\'s changes (issue 19)', () => {
  assert.equal(dataColour({ colour: '#E4572E' }), '#e4572e');
  for (const bad of [undefined, {}, { colour: 'red' }, { colour: '#fff' }, { colour: '#e4572e; x' }, { colour: 3 }]) {
    assert.equal(dataColour(bad), null, JSON.stringify(bad));
  }
  assert.equal(dataStatus({ status: '  busy ' }), 'busy');
  assert.equal(dataStatus({}), '');
  assert.equal(dataStatus(undefined), '');
  const long = 'é'.repeat(MAX_STATUS_CHARS + 5);
  assert.equal([...dataStatus({ status: long })].length, MAX_STATUS_CHARS);
  assert.ok(dataStatus({ status: long }).endsWith('…'));
  assert.deepEqual(statusChange('busy', 'ignored'), { status: 'busy' });
  assert.deepEqual(statusChange('other', ' at lunch '), { status: 'at lunch' });
  assert.deepEqual(statusChange('other', '   '), { status: null });
  assert.deepEqual(statusChange('other', 'x'.repeat(50)), { status: 'x'.repeat(MAX_STATUS_CHARS) });
});
