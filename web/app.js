// The amble demo: a lobby (rooms from /api/rooms, a name, join or create)
// and a room view (canvas floor, click to walk, WASD to move, chat with
// bubbles, member list, notices, and a HUD of measured figures).
//
// window.ambleDemo is a read-only hook for tests: what the page renders.

import { AmbleClient, ErrorCode, State, nameProblem, roomProblem } from './amble.js';
import { FloorView, avatarSprite, bubbleSprite, distinctColour, labelSprite } from './view.js';
import {
  MAX_STATUS_CHARS,
  ReturnFilter,
  STATUSES,
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
} from './ui.js';

const MOVE_SPEED_CM_S = 300; // free movement with the keys
const WALK_SPEED_CM_S = 300; // click-to-move
const ROOMS_REFRESH_MS = 3000;
const MAX_MESSAGES = 150;
const NAME_KEY = 'amble.name';
const COLOUR_KEY = 'amble.colour'; // member data: the colour and status you chose
const STATUS_KEY = 'amble.status';
const STATS_KEY = 'amble.stats';
const GO_TO_SPEED_CM_S = 900; // "go to" someone from the People list
const HIGHLIGHT_MS = 6000; // how long someone you went to stays marked
const NEWCOMER_MS = 10_000; // how long a new arrival off screen gets an edge marker
const narrow = matchMedia('(max-width: 760px)');

const $ = (id) => document.getElementById(id);
const ui = {
  lobby: $('lobby'),
  joinForm: $('join-form'),
  name: $('name'),
  room: $('room'),
  join: $('join'),
  lobbyError: $('lobby-error'),
  nameHint: $('name-hint'),
  rooms: $('rooms'),
  roomsStatus: $('rooms-status'),
  roomView: $('room-view'),
  roomName: $('room-name'),
  roomCount: $('room-count'),
  leave: $('leave'),
  statsToggle: $('stats-toggle'),
  stage: $('stage'),
  canvas: $('floor'),
  minimap: $('minimap'),
  hudBox: $('hud'),
  banner: $('banner'),
  bannerText: $('banner-text'),
  reconnectNow: $('reconnect-now'),
  hint: $('hint'),
  zoomIn: $('zoom-in'),
  zoomOut: $('zoom-out'),
  hud: {
    dot: $('hud-dot'),
    state: $('hud-state'),
    rtt: $('hud-rtt'),
    members: $('hud-members'),
    inUps: $('hud-in-ups'),
    inBps: $('hud-in-bps'),
    outUps: $('hud-out-ups'),
    outBps: $('hud-out-bps'),
    fps: $('hud-fps'),
    pos: $('hud-pos'),
  },
  side: document.querySelector('.side'),
  tabChat: $('tab-chat'),
  tabPeople: $('tab-people'),
  people: $('people'),
  peopleCount: $('people-count'),
  peopleCountWide: $('people-count-wide'),
  messages: $('messages'),
  chatForm: $('chat-form'),
  chatInput: $('chat-input'),
  chatStatus: $('chat-status'),
  meForm: $('me-form'),
  myColour: $('my-colour'),
  myStatus: $('my-status'),
  myStatusText: $('my-status-text'),
};

// This server, then the other cluster nodes a `?nodes=3000,3001` names: a reconnect tries the next.
const client = new AmbleClient({
  walkSpeed: WALK_SPEED_CM_S,
  url: serverUrls(location),
});
const view = new FloorView(ui.canvas);

// ------------------------------------------------------------ the members

/**
 * What the page draws of each member: sprites made once, the position of
 * the last frame, the walk target, the speech bubble.
 */
const entries = []; // draw order (sorted by y by the view)
const byId = new Map();
let selfEntry = null;

function addEntry(member) {
  removeEntry(member.id);
  const twins = entries.filter((o) => o.name === member.name);
  // A colour the member chose (its data) wins; else one told apart from its twins'.
  const colour = dataColour(member.data) ?? distinctColour(member.name, twins.map((o) => o.colour));
  const e = {
    member,
    id: member.id,
    name: member.name,
    colour,
    status: dataStatus(member.data),
    tag: '',
    sprite: avatarSprite(member.name, colour),
    label: null,
    bubble: null,
    bubbleText: '',
    bubbleUntil: 0,
    notableUntil: 0,
    x: 0,
    y: 0,
    sx: 0,
    sy: 0,
    onScreen: true,
    walking: false,
    tx: 0,
    ty: 0,
  };
  member.positionAt(client.renderTime(member), e);
  entries.push(e);
  byId.set(member.id, e);
  if (member.isSelf) selfEntry = e;
  retag(member.name);
  return e;
}

function removeEntry(id) {
  const e = byId.get(id);
  if (!e) return;
  byId.delete(id);
  const i = entries.indexOf(e);
  if (i >= 0) entries.splice(i, 1);
  if (selfEntry === e) selfEntry = null;
  retag(e.name);
}

/** Members who share a name are told apart by their number (and colour). */
function retag(name) {
  const twins = entries.filter((o) => o.name === name);
  for (const o of twins) {
    const tag = twins.length > 1 ? `#${o.id}` : '';
    if (o.label && o.tag === tag) continue;
    o.tag = tag;
    o.label = labelSprite(o.name, o.member.isSelf, view.dpr, tag, o.status);
  }
}

/** Rebuilds the entries from client.members, keeping those still there. */
function syncEntries() {
  for (const e of [...entries]) {
    if (client.members.get(e.id) !== e.member) removeEntry(e.id);
  }
  for (const m of client.members.values()) if (!byId.has(m.id)) addEntry(m);
  peopleDirty = true;
}

function rebuildLabels() {
  for (const e of entries) e.label = labelSprite(e.name, e.member.isSelf, view.dpr, e.tag, e.status);
}

/** A name as shown in lists: with its number when someone else has it too. */
function shownName(e, fallback) {
  if (!e) return fallback;
  return e.tag ? `${e.name} ${e.tag}` : e.name;
}

// ------------------------------------------------------------------ lobby

let roomsTimer = null;
let joinPending = false; // a Join from the lobby, not answered yet
let unreachableShown = false; // the lobby error is the "can't reach" one

async function refreshRooms() {
  let rooms;
  try {
    const res = await fetch('/api/rooms', { cache: 'no-store', signal: AbortSignal.timeout(ROOMS_REFRESH_MS) });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    ({ rooms } = await res.json());
  } catch {
    // Nothing listed is known to be open any more: no stale Join buttons.
    ui.lobby.classList.add('offline');
    ui.roomsStatus.textContent = 'offline';
    ui.rooms.replaceChildren(emptyRow("Can't reach the server. The list comes back when it does."));
    return;
  }
  ui.lobby.classList.remove('offline');
  if (unreachableShown && !joinPending) setLobbyError('');
  renderRooms(rooms);
  ui.roomsStatus.textContent = rooms.length ? `${rooms.reduce((n, r) => n + r.members, 0)} online` : '';
}

function emptyRow(text) {
  const li = document.createElement('li');
  li.className = 'empty';
  li.textContent = text;
  return li;
}

function renderRooms(rooms) {
  ui.rooms.replaceChildren();
  if (rooms.length === 0) {
    ui.rooms.append(emptyRow('No one is here yet. Name a room above to open it.'));
    return;
  }
  // Rooms one can join first, the busiest on top; full rooms last.
  const full = (r) => (roomStatus(r).full ? 1 : 0);
  rooms.sort((a, b) => full(a) - full(b) || b.members - a.members || a.name.localeCompare(b.name, undefined, { numeric: true }));
  for (const r of rooms) {
    const li = document.createElement('li');
    const b = document.createElement('button');
    b.type = 'button';
    b.dataset.room = r.name;
    const dot = document.createElement('span');
    dot.className = 'room-dot';
    const name = document.createElement('span');
    name.className = 'room-name';
    name.textContent = r.name;
    const status = roomStatus(r);
    const count = document.createElement('span');
    count.className = 'pill';
    count.textContent = status.count;
    count.title = status.title;
    const join = document.createElement('span');
    join.className = 'room-join';
    join.textContent = status.full ? 'Full' : 'Join →';
    b.append(dot, name, count, join);
    b.setAttribute('aria-label', `${r.name}: ${status.title}`);
    if (status.full) {
      li.className = 'full';
      b.disabled = true;
    }
    b.addEventListener('click', () => {
      ui.room.value = r.name;
      requestJoin();
    });
    li.append(b);
    ui.rooms.append(li);
  }
}

function showLobby(message = '') {
  ui.roomView.hidden = true;
  ui.lobby.hidden = false;
  joinPending = false;
  resetJoinButton();
  setLobbyError(message);
  document.title = titleFor(null, 0);
  if (location.hash) history.replaceState(null, '', location.pathname + location.search);
  refreshRooms();
  clearInterval(roomsTimer);
  roomsTimer = setInterval(refreshRooms, ROOMS_REFRESH_MS);
}

/** Says so when the name field has stopped taking letters at its limit. */
function updateNameHint() {
  const hint = nameLimitHint(ui.name.value, ui.name.maxLength);
  if (ui.nameHint.textContent !== hint) ui.nameHint.textContent = hint;
}
ui.name.addEventListener('input', updateNameHint);

function setLobbyError(message) {
  ui.lobbyError.textContent = message;
  ui.lobbyError.hidden = !message;
  unreachableShown = false;
}

function resetJoinButton() {
  ui.join.disabled = false;
  ui.join.textContent = 'Join room';
}

function requestJoin() {
  const name = ui.name.value.trim();
  const room = ui.room.value.trim() || 'lobby';
  const problem = nameProblem(name);
  if (problem) {
    setLobbyError(`Your name: ${problem}.`);
    ui.name.focus();
    return;
  }
  const roomIssue = roomProblem(room);
  if (roomIssue) {
    setLobbyError(`Room name: ${roomIssue}.`);
    ui.room.focus();
    return;
  }
  localStorage.setItem(NAME_KEY, name);
  setLobbyError('');
  ui.join.disabled = true;
  ui.join.textContent = 'Joining…';
  joinPending = true;
  client.join(room, name, { data: myData() });
}

// ------------------------------------------------------------ member data

/** The colour and status you chose (kept in localStorage), as member data. */
function myData() {
  const data = {};
  const colour = dataColour({ colour: localStorage.getItem(COLOUR_KEY) });
  if (colour) data.colour = colour;
  const status = localStorage.getItem(STATUS_KEY);
  if (status && [...status].length <= MAX_STATUS_CHARS && status.trim() !== '') data.status = status.trim();
  return data;
}

/** The side panel's picker shows what you chose. */
function showMyData() {
  const mine = myData();
  ui.myColour.value = mine.colour ?? (selfEntry ? selfEntry.colour : '#7c9cff');
  const status = mine.status ?? '';
  const known = status === '' || STATUSES.includes(status);
  ui.myStatus.value = known ? status : 'other';
  ui.myStatusText.hidden = known;
  ui.myStatusText.value = known ? '' : status;
}

/** Sends a change of your data, once the budget allows (a burst of a few, then one a second). */
let dataRetry = null;
function sendMyData(change) {
  clearTimeout(dataRetry);
  if (client.state !== State.JOINED) return;
  try {
    if (!client.setData(change)) dataRetry = setTimeout(() => sendMyData(change), client.limits.dataIntervalMs);
  } catch (err) {
    addNotice(`Can't set that: ${err.message}.`, true);
  }
}

ui.myColour.addEventListener('change', () => {
  const colour = dataColour({ colour: ui.myColour.value });
  if (!colour) return;
  localStorage.setItem(COLOUR_KEY, colour);
  sendMyData({ colour });
});

function statusPicked() {
  const other = ui.myStatus.value === 'other';
  ui.myStatusText.hidden = !other;
  if (other && ui.myStatusText.value.trim() === '') {
    ui.myStatusText.focus();
    return;
  }
  const change = ui.myStatus.value === '' ? { status: null } : statusChange(ui.myStatus.value, ui.myStatusText.value);
  if (change.status) localStorage.setItem(STATUS_KEY, change.status);
  else localStorage.removeItem(STATUS_KEY);
  sendMyData(change);
}

ui.myStatus.addEventListener('change', statusPicked);
ui.myStatusText.addEventListener('change', statusPicked);
ui.meForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  statusPicked();
});

client.on('data', (member) => {
  const e = byId.get(member.id);
  if (!e) return;
  const colour = dataColour(member.data);
  if (colour && colour !== e.colour) {
    e.colour = colour;
    e.sprite = avatarSprite(e.name, colour);
  }
  e.status = dataStatus(member.data);
  e.label = labelSprite(e.name, member.isSelf, view.dpr, e.tag, e.status);
  peopleDirty = true;
});

ui.joinForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  requestJoin();
});

// ------------------------------------------------------------------- room

function showRoom() {
  clearInterval(roomsTimer);
  ui.lobby.hidden = true;
  ui.roomView.hidden = false;
  ui.roomName.textContent = client.room;
  view.resize();
  rebuildLabels();
  updateObstacles();
  view.setWorld(client.room, client.limits.worldWidth, client.limits.worldHeight);
  if (location.hash.slice(1) !== client.room) history.replaceState(null, '', `#${client.room}`);
  updateTitle();
  updateChatStatus();
  showMyData();
}

ui.leave.addEventListener('click', () => {
  client.leave();
  clearRoomView();
  showLobby();
});

function clearRoomView() {
  entries.length = 0;
  byId.clear();
  selfEntry = null;
  ui.messages.replaceChildren();
  ui.people.replaceChildren();
  keys.clear();
  setBanner('');
  unread = 0;
  lastOthersAt = -Infinity;
  returning.clear();
  reconnectAt = 0;
  reconnectWhy = '';
  chatWaitUntil = 0;
  view.highlight(null, 0);
}

// The stats panel: shown by default on wide screens, remembered once chosen.
function setStats(shown) {
  ui.hudBox.hidden = !shown;
  ui.statsToggle.setAttribute('aria-pressed', String(shown));
  updateObstacles();
}

/** The panels over the floor, which edge markers keep clear of (CSS px of the canvas). */
function updateObstacles() {
  const base = ui.canvas.getBoundingClientRect();
  const rects = [];
  for (const el of [ui.hudBox, ui.minimap, ui.zoomIn.parentElement, ui.hint]) {
    if (el.hidden) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0) continue;
    rects.push({ x0: r.left - base.left, y0: r.top - base.top, x1: r.right - base.left, y1: r.bottom - base.top });
  }
  view.setObstacles(rects);
}
ui.statsToggle.addEventListener('click', () => {
  const shown = ui.hudBox.hidden;
  setStats(shown);
  localStorage.setItem(STATS_KEY, shown ? '1' : '0');
});
{
  const saved = localStorage.getItem(STATS_KEY);
  setStats(saved === null ? !narrow.matches : saved === '1');
}

// The title: the room, and chat that came while you were not looking.
let unread = 0;

function chatInView() {
  return !document.hidden && !(narrow.matches && ui.side.dataset.tab !== 'chat');
}

function updateTitle() {
  if (chatInView()) unread = 0;
  document.title = titleFor(ui.roomView.hidden ? null : client.room, unread);
}
document.addEventListener('visibilitychange', updateTitle);

// -------------------------------------------------------- client events

/** Who was here when the connection dropped: their return is not news. */
const returning = new ReturnFilter();

client.on('welcome', ({ rejoined }) => {
  joinPending = false;
  if (!rejoined) {
    clearRoomView();
    addNotice(`You joined ${client.room}.`);
  } else {
    const present = [];
    for (const m of client.members.values()) if (!m.isSelf) present.push(m.name);
    returning.rejoined(performance.now(), present);
    addNotice('Reconnected.');
  }
  reconnectAt = 0;
  reconnectWhy = '';
  syncEntries();
  showRoom();
  setBanner('');
  if (!rejoined) stepAside();
});

/** Everyone arrives at the same spot: if it is taken, walk a few steps off it. */
function stepAside() {
  const me = client.me;
  const t = client.renderTime();
  const at = me.positionAt(client.serverNow(), { x: 0, y: 0 });
  const other = { x: 0, y: 0 };
  let crowded = false;
  for (const m of client.members.values()) {
    if (m === me) continue;
    m.positionAt(t, other);
    if (Math.hypot(other.x - at.x, other.y - at.y) < 120) crowded = true;
  }
  if (!crowded) return;
  const angle = Math.random() * Math.PI * 2;
  const dist = 180 + Math.random() * 220;
  client.walkTo(
    clamp(at.x + Math.cos(angle) * dist, 0, client.limits.worldWidth),
    clamp(at.y + Math.sin(angle) * dist, 0, client.limits.worldHeight),
  );
}

client.on('joined', (m) => {
  const e = addEntry(m);
  peopleDirty = true;
  if (returning.returning(m.name, performance.now())) return;
  e.notableUntil = performance.now() + NEWCOMER_MS;
  queueNotice('joined', shownName(e, m.name), m.id);
});

client.on('left', (m, reason) => {
  const name = shownName(byId.get(m.id), m.name);
  removeEntry(m.id);
  peopleDirty = true;
  const present = [...client.members.values()].map((other) => other.name);
  const verb = leftVerb(reason, m.name, present);
  if (verb) queueNotice(verb, name);
});

// A spatial room (a plaza): people come into view and go out of it
// quietly; they are in the room all along, so no notice.
client.on('appeared', (m) => {
  addEntry(m);
  peopleDirty = true;
});

client.on('disappeared', (m) => {
  removeEntry(m.id);
  peopleDirty = true;
});

client.on('population', () => {
  peopleDirty = true;
});

client.on('resync', () => syncEntries());

// A member resumed its place through another node: the same person under a
// new id. Its entry (sprite, colour, bubble) follows; nothing to announce.
client.on('renumbered', (m, oldId) => {
  const e = byId.get(oldId);
  if (!e) return;
  byId.delete(oldId);
  e.id = m.id;
  byId.set(m.id, e);
  retag(e.name);
  peopleDirty = true;
});

client.on('chat', ({ member, memberId, text, serverTimeMs }) => {
  const e = byId.get(memberId);
  if (e) {
    // Smaller on a phone, so that a few bubbles do not cover the floor.
    const small = view.cssW < 520;
    e.bubble = bubbleSprite(text, view.dpr, small ? Math.min(170, view.cssW * 0.45) : 210, small ? 3 : 4);
    e.bubbleText = text;
    e.bubbleUntil = performance.now() + Math.min(9000, 4000 + text.length * 60);
  }
  addChat(shownName(e, member ? member.name : `#${memberId}`), e ? e.colour : '#8a97a8', text, serverTimeMs, member?.isSelf);
  if (!member?.isSelf && !chatInView()) {
    unread++;
    updateTitle();
  }
});

// The app's own messages (its backend, through the server API): shown as
// the server's, never as a member's.
client.on('system', ({ text, serverTimeMs, direct }) => {
  addChat(direct ? 'Server (to you)' : 'Server', '#5b6b80', text, serverTimeMs, false);
});

client.on('error', (err) => {
  if (err.refused) {
    const text =
      err.code === ErrorCode.RATE_LIMITED && err.retryInMs !== null
        ? `You are joining too often: try again ${inSeconds(err.retryInMs)}.`
        : err.text;
    clearRoomView();
    showLobby(text);
    return;
  }
  if (ui.roomView.hidden) return;
  if (err.code === ErrorCode.RATE_LIMITED) {
    chatWaitUntil = performance.now() + (err.retryInMs ?? client.chatWaitMs());
    updateChatStatus();
    return;
  }
  if (errorInChat(err.code)) addNotice(err.text, true);
});

client.on('closed', (info) => {
  if (ui.roomView.hidden) {
    // A Join from the lobby that could not get through: stop and say why.
    if (!joinPending) return;
    joinPending = false;
    if (info.willReconnect) client.close(); // emits 'closed' again, now ignored
    resetJoinButton();
    if (info.opened === false) {
      setLobbyError("Can't reach the server. Check that it is running, then try again.");
      unreachableShown = true;
    } else {
      setLobbyError(info.text.replace(/ Reconnecting in .*$/, ''));
    }
    refreshRooms();
    return;
  }
  if (info.willReconnect) {
    if (reconnectAt === 0) {
      const names = [];
      for (const e of entries) if (e !== selfEntry) names.push(e.name);
      returning.dropped(names);
      reconnectWhy = '';
    }
    reconnectAt = performance.now() + info.retryInMs;
    // One outage, one reason: the failed attempts after a restart do not
    // turn "The server is restarting." into "Can't reach the server.".
    reconnectWhy = outageReason(reconnectWhy, info.text);
    renderBanner();
    return;
  }
  reconnectAt = 0;
  if (client.state === State.CLOSED) {
    clearRoomView();
    showLobby(info.text);
  }
});

client.on('state', () => {
  renderHud();
  updateChatStatus();
});

let reconnectAt = 0; // while reconnecting: when the next attempt starts (performance.now)
let reconnectWhy = ''; // why, said once for the whole outage

/**
 * While reconnecting, one line: why, and when the next attempt is (or that
 * it is under way); while waiting for it, a "Reconnect now" button.
 */
function renderBanner() {
  if (!reconnectAt || ui.roomView.hidden) return;
  const wait = reconnectAt - performance.now();
  const waiting = client.state === State.RECONNECTING && wait > 0;
  setBanner(
    waiting ? `${reconnectWhy} Reconnecting ${inSeconds(wait)}…` : `${reconnectWhy} Reconnecting…`,
    false,
    waiting,
  );
}

function setBanner(text, error = false, canReconnectNow = false) {
  ui.banner.hidden = !text;
  ui.bannerText.textContent = text;
  ui.banner.classList.toggle('err', error);
  if (ui.reconnectNow.hidden === canReconnectNow) ui.reconnectNow.hidden = !canReconnectNow;
}

/** "Reconnect now": the next attempt at once, instead of after the backoff. */
function reconnectNow() {
  if (!client.reconnectNow()) return;
  reconnectAt = performance.now();
  renderBanner();
}
ui.reconnectNow.addEventListener('click', reconnectNow);

// ------------------------------------------------------------ chat panel

function timeOf(serverTimeMs) {
  const d = new Date(serverTimeMs);
  return `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
}

function appendMessage(li) {
  const list = ui.messages;
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  list.append(li);
  while (list.children.length > MAX_MESSAGES) list.firstElementChild.remove();
  if (atBottom) list.scrollTop = list.scrollHeight;
}

function addChat(name, colour, text, serverTimeMs, self) {
  const li = document.createElement('li');
  li.className = 'chat-line';
  const from = document.createElement('span');
  from.className = 'from';
  from.style.color = colour;
  from.textContent = self ? `${name} (you)` : name;
  const body = document.createElement('span');
  body.className = 'text';
  body.textContent = text;
  const time = document.createElement('time');
  time.className = 'time';
  time.textContent = timeOf(serverTimeMs);
  li.append(from, body, time);
  appendMessage(li);
}

function addNotice(text, error = false, goToId = null) {
  const li = document.createElement('li');
  li.className = error ? 'notice err' : 'notice';
  li.textContent = text;
  if (goToId !== null) {
    // Someone who just arrived: one click to go and say hello.
    const go = document.createElement('button');
    go.type = 'button';
    go.className = 'link';
    go.textContent = 'Go to';
    go.addEventListener('click', () => goTo(goToId));
    li.append(' ', go);
  }
  appendMessage(li);
}

/** Join/leave notices, gathered for a moment so a crowd arriving is one line. */
const noticeQueue = [];
let noticeTimer = null;

function queueNotice(what, name, id = null) {
  noticeQueue.push([what, name, id]);
  if (noticeTimer === null) noticeTimer = setTimeout(flushNotices, 400);
}

function flushNotices() {
  noticeTimer = null;
  const groups = new Map();
  for (const [what, name, id] of noticeQueue) {
    if (!groups.has(what)) groups.set(what, []);
    groups.get(what).push([name, id]);
  }
  noticeQueue.length = 0;
  for (const [what, people] of groups) {
    if (people.length <= 3) {
      for (const [n, id] of people) addNotice(`${n} ${what}.`, false, id !== null && byId.has(id) ? id : null);
    } else {
      addNotice(`${people[0][0]}, ${people[1][0]} and ${people.length - 2} others ${what}.`);
    }
  }
}

let chatWaitUntil = 0; // the server or the budget said: no chat before (performance.now)

ui.chatForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = ui.chatInput.value;
  if (!text.trim()) return;
  if (client.state !== State.JOINED) {
    // Kept in the box; the line above it says why it was not sent.
    flashChatStatus();
    return;
  }
  try {
    if (client.chat(text)) ui.chatInput.value = '';
    else {
      chatWaitUntil = performance.now() + client.chatWaitMs();
      flashChatStatus();
    }
  } catch (err) {
    addNotice(`Not sent: ${err.message}.`, true);
  }
  updateChatStatus();
});

/**
 * One line above the chat box for why a message cannot go now: while
 * reconnecting, or while the chat budget refills (with when it will).
 * Updated in place, never repeated.
 */
function updateChatStatus() {
  let text = '';
  if (!ui.roomView.hidden && client.state !== State.JOINED) {
    text = 'Reconnecting: messages can be sent once you are back.';
  } else {
    const wait = chatWaitUntil - performance.now();
    if (wait > 0) text = `Slow down: you can send again ${inSeconds(wait)}.`;
    else chatWaitUntil = 0;
  }
  if (ui.chatStatus.textContent !== text) ui.chatStatus.textContent = text;
  ui.chatStatus.hidden = !text;
}

function flashChatStatus() {
  updateChatStatus();
  ui.chatStatus.classList.remove('flash');
  void ui.chatStatus.offsetWidth; // restart the animation
  ui.chatStatus.classList.add('flash');
}

// ----------------------------------------------------------- people list

let peopleDirty = false;
const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: 'base' });

function renderPeople() {
  peopleDirty = false;
  const list = [...client.members.values()].sort(
    (a, b) => (b.isSelf ? 1 : 0) - (a.isSelf ? 1 : 0) || collator.compare(a.name, b.name),
  );
  const shown = list.slice(0, 300);
  const items = shown.map((m) => {
    const e = byId.get(m.id);
    const li = document.createElement('li');
    // Others are buttons: go to them. You are not.
    const row = document.createElement(m.isSelf ? 'div' : 'button');
    row.className = 'person';
    const sw = document.createElement('span');
    sw.className = 'swatch';
    sw.style.background = e ? e.colour : '#8a97a8';
    const who = document.createElement('span');
    who.className = 'who';
    who.textContent = shownName(e, m.name);
    if (e?.status) {
      const status = document.createElement('span');
      status.className = 'status';
      status.textContent = e.status;
      who.append(status);
    }
    row.append(sw, who);
    const tag = document.createElement('span');
    tag.className = 'tag';
    row.append(tag);
    if (m.isSelf) {
      li.className = 'self';
      tag.textContent = 'you';
    } else {
      row.type = 'button';
      row.dataset.id = String(m.id);
      row.title = `Go to ${shownName(e, m.name)}`;
      tag.className = 'go';
      tag.textContent = 'Go to';
    }
    li.append(row);
    return li;
  });
  if (list.length > shown.length) {
    const li = document.createElement('li');
    li.className = 'more';
    li.textContent = `and ${list.length - shown.length} more`;
    items.push(li);
  }
  ui.people.replaceChildren(...items);
  // In a spatial room: who is in view, of how many in the room.
  const n = client.limits.interestRadius > 0 ? `${list.length} of ${client.population}` : `${list.length}`;
  ui.roomCount.textContent = n;
  ui.peopleCount.textContent = n;
  ui.peopleCountWide.textContent = n;
}

ui.people.addEventListener('click', (ev) => {
  const row = ev.target.closest('button[data-id]');
  if (row) goTo(Number(row.dataset.id));
});

/** Walks you to stand beside member `id` and marks them until you get there. */
function goTo(id) {
  const e = byId.get(id);
  if (!e || !selfEntry || client.state !== State.JOINED) return;
  const dx = selfEntry.x - e.x;
  const dy = selfEntry.y - e.y;
  const d = Math.hypot(dx, dy);
  const gap = 110; // cm: beside them, not on top
  const x = d > gap ? e.x + (dx / d) * gap : selfEntry.x;
  const y = d > gap ? e.y + (dy / d) * gap : selfEntry.y;
  keys.clear();
  client.walkTo(clamp(x, 0, client.limits.worldWidth), clamp(y, 0, client.limits.worldHeight), {
    speed: Math.min(GO_TO_SPEED_CM_S, client.limits.maxSpeed),
  });
  view.highlight(id, performance.now() + HIGHLIGHT_MS);
}

function selectTab(tab) {
  ui.side.dataset.tab = tab;
  ui.tabChat.setAttribute('aria-selected', String(tab === 'chat'));
  ui.tabPeople.setAttribute('aria-selected', String(tab === 'people'));
  updateTitle();
}
ui.tabChat.addEventListener('click', () => selectTab('chat'));
ui.tabPeople.addEventListener('click', () => selectTab('people'));
selectTab('chat');

// ------------------------------------------------------------------ input

const keys = new Set();
const KEY_DIRS = {
  KeyW: [0, -1], ArrowUp: [0, -1],
  KeyS: [0, 1], ArrowDown: [0, 1],
  KeyA: [-1, 0], ArrowLeft: [-1, 0],
  KeyD: [1, 0], ArrowRight: [1, 0],
};

function typing(target) {
  return target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement;
}

window.addEventListener('keydown', (ev) => {
  if (ui.roomView.hidden || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (typing(ev.target) && ev.key === 'Escape') {
    ev.target.blur();
    return;
  }
  // A focused button takes Enter and Space (they press it); a text field takes every key.
  if (keyBelongsTo(ev.target, ev.key)) return;
  if (ev.key === 'Enter') {
    ev.preventDefault();
    selectTab('chat');
    ui.chatInput.focus();
    return;
  }
  if (ev.key === '+' || ev.key === '=') view.zoomBy(1.2);
  if (ev.key === '-') view.zoomBy(1 / 1.2);
  if (KEY_DIRS[ev.code]) {
    ev.preventDefault();
    keys.add(ev.code);
  }
});
window.addEventListener('keyup', (ev) => keys.delete(ev.code));
window.addEventListener('blur', () => keys.clear());

const pointerWorld = { x: 0, y: 0 };
ui.canvas.addEventListener('pointerdown', (ev) => {
  if (ev.button !== 0 || client.state !== State.JOINED) return;
  if (typing(document.activeElement)) document.activeElement.blur();
  const rect = ui.canvas.getBoundingClientRect();
  const marked = view.markerAt(ev.clientX - rect.left, ev.clientY - rect.top);
  if (marked !== null) {
    goTo(marked);
    return;
  }
  view.screenToWorld(ev.clientX - rect.left, ev.clientY - rect.top, pointerWorld);
  const x = clamp(pointerWorld.x, 0, client.limits.worldWidth);
  const y = clamp(pointerWorld.y, 0, client.limits.worldHeight);
  keys.clear();
  client.walkTo(x, y);
});

ui.canvas.addEventListener(
  'wheel',
  (ev) => {
    ev.preventDefault();
    view.zoomBy(Math.exp(-ev.deltaY / 500));
  },
  { passive: false },
);
ui.minimap.addEventListener('pointerdown', (ev) => {
  if (ev.button !== 0 || client.state !== State.JOINED) return;
  ev.preventDefault();
  const rect = ui.minimap.getBoundingClientRect();
  if (!view.minimapToWorld(ev.clientX - rect.left, ev.clientY - rect.top, pointerWorld)) return;
  keys.clear();
  client.walkTo(pointerWorld.x, pointerWorld.y, { speed: Math.min(GO_TO_SPEED_CM_S, client.limits.maxSpeed) });
});
ui.zoomIn.addEventListener('click', () => view.zoomBy(1.25));
ui.zoomOut.addEventListener('click', () => view.zoomBy(1 / 1.25));
const touch = matchMedia('(pointer: coarse)').matches;
const HINT = touch ? 'Tap to walk · tap a marker to go to someone' : 'Click to walk · WASD to move · Enter to chat';
ui.hint.textContent = HINT;
ui.chatInput.addEventListener('focus', () => {
  if (!touch) ui.hint.textContent = 'Typing · Esc to walk again';
});
ui.chatInput.addEventListener('blur', () => {
  ui.hint.textContent = HINT;
});

new ResizeObserver(() => {
  const dpr = view.dpr;
  view.resize();
  if (view.dpr !== dpr) rebuildLabels();
  updateObstacles();
}).observe(ui.canvas);

// ------------------------------------------------------------ frame loop

const free = { x: 0, y: 0, active: false }; // free-movement position, sub-centimetre
const scratch = { x: 0, y: 0 };
let lastFrame = performance.now();
let lastOthersAt = -Infinity; // others' render time never goes back, even if the clock were to
let frames = 0;
const frameTimes = new Float64Array(240); // ring of recent frame timestamps
const frameWork = new Float64Array(240); // ms of script per frame, same ring
let frameHead = 0;

let frameNow = 0;

function moveWithKeys(dtMs) {
  let dx = 0;
  let dy = 0;
  for (const code of keys) {
    const d = KEY_DIRS[code];
    dx += d[0];
    dy += d[1];
  }
  if ((dx === 0 && dy === 0) || !client.me) {
    free.active = false;
    return;
  }
  const me = client.me;
  me.positionAt(client.serverNow(frameNow), scratch);
  if (!free.active || Math.abs(free.x - scratch.x) > 2 || Math.abs(free.y - scratch.y) > 2) {
    free.x = scratch.x;
    free.y = scratch.y;
    free.active = true;
  }
  const len = Math.sqrt(dx * dx + dy * dy);
  const step = (MOVE_SPEED_CM_S * Math.min(dtMs, 100)) / 1000;
  free.x = clamp(free.x + (dx / len) * step, 0, client.limits.worldWidth);
  free.y = clamp(free.y + (dy / len) * step, 0, client.limits.worldHeight);
  client.moveTo(free.x, free.y);
}

function frame(now) {
  frameNow = now;
  const dt = now - lastFrame;
  lastFrame = now;
  frames++;
  const started = performance.now();
  if (!ui.roomView.hidden && client.me) {
    if (client.state === State.JOINED) moveWithKeys(dt);
    // Every position at the frame's own timestamp, not when this code runs.
    const othersAt = Math.max(lastOthersAt, client.renderTime(null, now));
    lastOthersAt = othersAt;
    const selfAt = client.serverNow(now);
    for (let i = 0; i < entries.length; i++) {
      const e = entries[i];
      const t = e.member.isSelf ? selfAt : othersAt;
      e.member.positionAt(t, e);
      scratch.x = 0;
      e.walking = e.member.walkTargetAt(t, scratch);
      if (e.walking) {
        e.tx = scratch.x;
        e.ty = scratch.y;
      }
    }
    if (selfEntry) view.follow(selfEntry.x, selfEntry.y, dt);
    view.draw(entries, entries.length, selfEntry, now);
    if (frames % 2 === 0) view.drawMinimap(ui.minimap, entries, entries.length, selfEntry, now);
    if (peopleDirty && now - lastPeopleRender > 250) {
      lastPeopleRender = now;
      renderPeople();
    }
  }
  frameTimes[frameHead] = now;
  frameWork[frameHead] = performance.now() - started;
  frameHead = (frameHead + 1) % frameTimes.length;
  requestAnimationFrame(frame);
}
let lastPeopleRender = 0;
requestAnimationFrame(frame);

// ------------------------------------------------------------------- HUD

/** Counter samples, one per HUD tick, so rates are measured over the last second. */
const samples = [];

function sample() {
  const s = client.stats;
  samples.push({
    t: performance.now(),
    upIn: s.motionUpdatesIn,
    upOut: s.movesOut,
    bytesIn: s.wireBytesIn,
    bytesOut: s.wireBytesOut,
  });
  while (samples.length > 2 && samples[samples.length - 1].t - samples[1].t >= 1000) samples.shift();
}

function rate(key) {
  if (samples.length < 2) return null;
  const a = samples[0];
  const b = samples[samples.length - 1];
  const dt = b.t - a.t;
  return dt > 0 ? ((b[key] - a[key]) * 1000) / dt : null;
}

function formatBytes(perSecond) {
  if (perSecond === null) return '';
  if (perSecond >= 1e6) return `${(perSecond / 1e6).toFixed(2)} MB/s`;
  if (perSecond >= 1e3) return `${(perSecond / 1e3).toFixed(1)} kB/s`;
  return `${Math.round(perSecond)} B/s`;
}

function formatRate(perSecond) {
  return perSecond === null ? '–' : `${perSecond < 10 ? perSecond.toFixed(1) : Math.round(perSecond)} upd/s`;
}

function measuredFps(now) {
  let n = 0;
  for (let i = 0; i < frameTimes.length; i++) if (frameTimes[i] > now - 1000) n++;
  return n;
}

const STATE_TEXT = {
  [State.IDLE]: 'Idle',
  [State.CONNECTING]: 'Connecting…',
  [State.OPEN]: 'Connected',
  [State.JOINING]: 'Joining…',
  [State.JOINED]: 'Connected',
  [State.RECONNECTING]: 'Reconnecting…',
  [State.CLOSED]: 'Disconnected',
};

function renderHud() {
  const h = ui.hud;
  const st = client.state;
  h.state.textContent = STATE_TEXT[st] ?? st;
  h.dot.className = st === State.JOINED ? 'dot ok' : st === State.CLOSED ? 'dot err' : 'dot';
  h.rtt.textContent = client.rttMs === null ? '–' : `${client.rttMs < 10 ? client.rttMs.toFixed(1) : Math.round(client.rttMs)} ms`;
  h.members.textContent =
    client.limits.interestRadius > 0
      ? `${client.members.size} of ${client.population} in view`
      : `${client.members.size}`;
  h.inUps.textContent = formatRate(rate('upIn'));
  h.inBps.textContent = formatBytes(rate('bytesIn'));
  h.outUps.textContent = formatRate(rate('upOut'));
  h.outBps.textContent = formatBytes(rate('bytesOut'));
  h.fps.textContent = `${measuredFps(performance.now())}`;
  h.pos.textContent = selfEntry ? `${(selfEntry.x / 100).toFixed(1)}, ${(selfEntry.y / 100).toFixed(1)} m` : '–';
  renderBanner();
}

setInterval(() => {
  sample();
  renderHud();
  if (chatWaitUntil) updateChatStatus();
}, 250);

// ------------------------------------------------------------ debug hook

Object.defineProperty(window, 'ambleDemo', {
  value: Object.freeze({
    /** The members as rendered in the last frame: positions in cm. */
    members: () =>
      entries.map((e) => ({
        id: e.id,
        name: e.name,
        self: e.member.isSelf,
        x: e.x,
        y: e.y,
        walking: e.walking,
        target: e.walking ? { x: e.tx, y: e.ty } : null,
        bubble: e.bubble ? e.bubbleText : null,
        onScreen: e.onScreen,
        colour: e.colour,
        label: e.tag ? `${e.name} ${e.tag}` : e.name,
        /** What is shown under the name (member data `status`), '' for none. */
        status: e.status,
        data: { ...e.member.data },
        user: e.member.user,
      })),
    /** Edge markers drawn in the last frame: member id and CSS px on the canvas. */
    markers: () => view.markers.slice(0, view.markerCount).map((m) => ({ ...m })),
    /** What the last frames' render times were (others' and yours), for clock checks. */
    renderTimes: () => ({ others: lastOthersAt }),
    state: () => client.state,
    /** While waiting to reconnect: ms until the next attempt is due (null otherwise). */
    reconnectDueInMs: () =>
      client.state === State.RECONNECTING && reconnectAt ? reconnectAt - performance.now() : null,
    room: () => client.room,
    limits: () => ({ ...client.limits }),
    stats: () => ({ ...client.stats, rttMs: client.rttMs }),
    frames: () => frames,
    /** Frames in the last second, and the script time they took (ms). */
    frameStats: () => {
      const now = performance.now();
      let n = 0;
      let sum = 0;
      let max = 0;
      for (let i = 0; i < frameTimes.length; i++) {
        if (frameTimes[i] <= now - 1000) continue;
        n++;
        sum += frameWork[i];
        max = Math.max(max, frameWork[i]);
      }
      return { fps: n, workMsAvg: n ? sum / n : 0, workMsMax: max };
    },
    zoom: (factor) => view.zoomBy(factor),
    /** The camera: zoom factor and the world point at the canvas centre (cm). */
    camera: () => ({ zoom: view.zoom, x: view.camX, y: view.camY }),
    /** The world point under a CSS pixel of the canvas (for tests that click). */
    worldToCanvas: (x, y) => {
      const s = view.scale;
      return { x: (x - view.camX) * s + view.cssW / 2, y: (y - view.camY) * s + view.cssH / 2 };
    },
  }),
  enumerable: true,
});

function clamp(v, lo, hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

// ------------------------------------------------------------------ start

ui.name.value = localStorage.getItem(NAME_KEY) ?? '';
updateNameHint();
const hashRoom = decodeURIComponent(location.hash.slice(1));
if (hashRoom && !roomProblem(hashRoom)) ui.room.value = hashRoom;
if (hashRoom && !roomProblem(hashRoom) && !nameProblem(ui.name.value)) {
  showLobby();
  requestJoin();
} else {
  showLobby();
  (ui.name.value ? ui.room : ui.name).focus();
}
