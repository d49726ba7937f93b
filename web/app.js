// The amble demo: a lobby (rooms from /api/rooms, a name, join or create)
// and a room view (canvas floor, click to walk, WASD to move, chat with
// bubbles, member list, notices, and a HUD of measured figures).
//
// window.ambleDemo is a read-only hook for tests: what the page renders.

import { AmbleClient, LeaveReason, State, nameProblem, roomProblem } from './amble.js';
import { FloorView, avatarSprite, bubbleSprite, colourFor, labelSprite } from './view.js';

const MOVE_SPEED_CM_S = 300; // free movement with the keys
const WALK_SPEED_CM_S = 300; // click-to-move
const ROOMS_REFRESH_MS = 3000;
const MAX_MESSAGES = 150;
const NAME_KEY = 'amble.name';

const $ = (id) => document.getElementById(id);
const ui = {
  lobby: $('lobby'),
  joinForm: $('join-form'),
  name: $('name'),
  room: $('room'),
  join: $('join'),
  lobbyError: $('lobby-error'),
  rooms: $('rooms'),
  roomsStatus: $('rooms-status'),
  roomView: $('room-view'),
  roomName: $('room-name'),
  roomCount: $('room-count'),
  leave: $('leave'),
  stage: $('stage'),
  canvas: $('floor'),
  banner: $('banner'),
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
};

const client = new AmbleClient({ walkSpeed: WALK_SPEED_CM_S });
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
  const colour = colourFor(member.name);
  const e = {
    member,
    id: member.id,
    name: member.name,
    colour,
    sprite: avatarSprite(member.name, colour),
    label: labelSprite(member.name, member.isSelf, view.dpr),
    bubble: null,
    bubbleText: '',
    bubbleUntil: 0,
    x: 0,
    y: 0,
    walking: false,
    tx: 0,
    ty: 0,
  };
  member.positionAt(client.renderTime(member), e);
  entries.push(e);
  byId.set(member.id, e);
  if (member.isSelf) selfEntry = e;
  return e;
}

function removeEntry(id) {
  const e = byId.get(id);
  if (!e) return;
  byId.delete(id);
  const i = entries.indexOf(e);
  if (i >= 0) entries.splice(i, 1);
  if (selfEntry === e) selfEntry = null;
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
  for (const e of entries) e.label = labelSprite(e.name, e.member.isSelf, view.dpr);
}

// ------------------------------------------------------------------ lobby

let roomsTimer = null;

async function refreshRooms() {
  try {
    const res = await fetch('/api/rooms', { cache: 'no-store' });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const { rooms } = await res.json();
    renderRooms(rooms);
    ui.roomsStatus.textContent = rooms.length ? `${rooms.reduce((n, r) => n + r.members, 0)} online` : '';
  } catch {
    ui.roomsStatus.textContent = 'server unreachable';
  }
}

function renderRooms(rooms) {
  ui.rooms.replaceChildren();
  if (rooms.length === 0) {
    const li = document.createElement('li');
    li.className = 'empty';
    li.textContent = 'No one is here yet. Name a room above to open it.';
    ui.rooms.append(li);
    return;
  }
  rooms.sort((a, b) => b.members - a.members || a.name.localeCompare(b.name, undefined, { numeric: true }));
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
    const count = document.createElement('span');
    count.className = 'pill';
    count.textContent = `${r.members}`;
    count.title = `${r.members} ${r.members === 1 ? 'member' : 'members'}`;
    const join = document.createElement('span');
    join.className = 'room-join';
    join.textContent = 'Join →';
    b.append(dot, name, count, join);
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
  ui.join.disabled = false;
  ui.join.textContent = 'Join room';
  setLobbyError(message);
  if (location.hash) history.replaceState(null, '', location.pathname + location.search);
  refreshRooms();
  clearInterval(roomsTimer);
  roomsTimer = setInterval(refreshRooms, ROOMS_REFRESH_MS);
}

function setLobbyError(message) {
  ui.lobbyError.textContent = message;
  ui.lobbyError.hidden = !message;
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
  client.join(room, name);
}

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
  view.setWorld(client.room, client.limits.worldWidth, client.limits.worldHeight);
  if (location.hash.slice(1) !== client.room) history.replaceState(null, '', `#${client.room}`);
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
}

// -------------------------------------------------------- client events

client.on('welcome', ({ rejoined }) => {
  if (!rejoined) {
    clearRoomView();
    addNotice(`You joined ${client.room}.`);
  } else {
    addNotice('Reconnected.');
  }
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
  addEntry(m);
  peopleDirty = true;
  queueNotice('joined', m.name);
});

client.on('left', (m, reason) => {
  removeEntry(m.id);
  peopleDirty = true;
  queueNotice(reason === LeaveReason.TIMED_OUT ? 'timed out' : 'left', m.name);
});

client.on('resync', () => syncEntries());

client.on('chat', ({ member, memberId, text, serverTimeMs }) => {
  const e = byId.get(memberId);
  if (e) {
    e.bubble = bubbleSprite(text, view.dpr);
    e.bubbleText = text;
    e.bubbleUntil = performance.now() + Math.min(9000, 4000 + text.length * 60);
  }
  addChat(member ? member.name : `#${memberId}`, e ? e.colour : '#8a97a8', text, serverTimeMs, member?.isSelf);
});

client.on('error', (err) => {
  if (err.refused) {
    clearRoomView();
    showLobby(err.text);
    return;
  }
  if (!ui.roomView.hidden) addNotice(err.text, true);
});

client.on('closed', (info) => {
  if (info.willReconnect) {
    reconnectAt = performance.now() + info.retryInMs;
    reconnectWhy = info.text.replace(/ Reconnecting in .*$/, '');
    if (ui.roomView.hidden) {
      setLobbyError(info.text);
    }
    return;
  }
  reconnectAt = 0;
  if (client.state === State.CLOSED) {
    clearRoomView();
    showLobby(info.text);
  }
});

client.on('state', (state) => {
  if (state === State.JOINED || state === State.OPEN) reconnectAt = 0;
  renderHud();
});

let reconnectAt = 0;
let reconnectWhy = '';

function setBanner(text, error = false) {
  ui.banner.hidden = !text;
  ui.banner.textContent = text;
  ui.banner.classList.toggle('err', error);
}

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

function addNotice(text, error = false) {
  const li = document.createElement('li');
  li.className = error ? 'notice err' : 'notice';
  li.textContent = text;
  appendMessage(li);
}

/** Join/leave notices, gathered for a moment so a crowd arriving is one line. */
const noticeQueue = [];
let noticeTimer = null;

function queueNotice(what, name) {
  noticeQueue.push([what, name]);
  if (noticeTimer === null) noticeTimer = setTimeout(flushNotices, 400);
}

function flushNotices() {
  noticeTimer = null;
  const groups = new Map();
  for (const [what, name] of noticeQueue) {
    if (!groups.has(what)) groups.set(what, []);
    groups.get(what).push(name);
  }
  noticeQueue.length = 0;
  for (const [what, names] of groups) {
    if (names.length <= 3) for (const n of names) addNotice(`${n} ${what}.`);
    else addNotice(`${names.slice(0, 2).join(', ')} and ${names.length - 2} others ${what}.`);
  }
}

ui.chatForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = ui.chatInput.value;
  if (!text.trim() || client.state !== State.JOINED) return;
  try {
    if (client.chat(text)) ui.chatInput.value = '';
    else addNotice('Slow down a little: chat is limited to a few messages at a time.', true);
  } catch (err) {
    addNotice(`Not sent: ${err.message}.`, true);
  }
});

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
    const li = document.createElement('li');
    if (m.isSelf) li.className = 'self';
    const sw = document.createElement('span');
    sw.className = 'swatch';
    sw.style.background = colourFor(m.name);
    const who = document.createElement('span');
    who.className = 'who';
    who.textContent = m.name;
    li.append(sw, who);
    if (m.isSelf) {
      const tag = document.createElement('span');
      tag.className = 'tag';
      tag.textContent = 'you';
      li.append(tag);
    }
    return li;
  });
  if (list.length > shown.length) {
    const li = document.createElement('li');
    li.className = 'more';
    li.textContent = `and ${list.length - shown.length} more`;
    items.push(li);
  }
  ui.people.replaceChildren(...items);
  const n = `${list.length}`;
  ui.roomCount.textContent = n;
  ui.peopleCount.textContent = n;
  ui.peopleCountWide.textContent = n;
}

function selectTab(tab) {
  ui.side.dataset.tab = tab;
  ui.tabChat.setAttribute('aria-selected', String(tab === 'chat'));
  ui.tabPeople.setAttribute('aria-selected', String(tab === 'people'));
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
  if (ui.roomView.hidden) return;
  if (typing(ev.target)) {
    if (ev.key === 'Escape') ev.target.blur();
    return;
  }
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
ui.zoomIn.addEventListener('click', () => view.zoomBy(1.25));
ui.zoomOut.addEventListener('click', () => view.zoomBy(1 / 1.25));
if (matchMedia('(pointer: coarse)').matches) ui.hint.textContent = 'Tap to walk';

new ResizeObserver(() => {
  const dpr = view.dpr;
  view.resize();
  if (view.dpr !== dpr) rebuildLabels();
}).observe(ui.canvas);

// ------------------------------------------------------------ frame loop

const free = { x: 0, y: 0, active: false }; // free-movement position, sub-centimetre
const scratch = { x: 0, y: 0 };
let lastFrame = performance.now();
let frames = 0;
const frameTimes = new Float64Array(240); // ring of recent frame timestamps
const frameWork = new Float64Array(240); // ms of script per frame, same ring
let frameHead = 0;

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
  me.positionAt(client.serverNow(), scratch);
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
  const dt = now - lastFrame;
  lastFrame = now;
  frames++;
  const started = performance.now();
  if (!ui.roomView.hidden && client.me) {
    if (client.state === State.JOINED) moveWithKeys(dt);
    const othersAt = client.renderTime();
    const selfAt = client.serverNow();
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
  h.members.textContent = `${client.members.size}`;
  h.inUps.textContent = formatRate(rate('upIn'));
  h.inBps.textContent = formatBytes(rate('bytesIn'));
  h.outUps.textContent = formatRate(rate('upOut'));
  h.outBps.textContent = formatBytes(rate('bytesOut'));
  h.fps.textContent = `${measuredFps(performance.now())}`;
  h.pos.textContent = selfEntry ? `${(selfEntry.x / 100).toFixed(1)}, ${(selfEntry.y / 100).toFixed(1)} m` : '–';
  if (reconnectAt && !ui.roomView.hidden) {
    const s = Math.max(0, Math.ceil((reconnectAt - performance.now()) / 1000));
    setBanner(client.state === State.RECONNECTING ? `${reconnectWhy} Reconnecting in ${s} s…` : `${reconnectWhy} Reconnecting…`);
  }
}

setInterval(() => {
  sample();
  renderHud();
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
      })),
    state: () => client.state,
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
const hashRoom = decodeURIComponent(location.hash.slice(1));
if (hashRoom && !roomProblem(hashRoom)) ui.room.value = hashRoom;
if (hashRoom && !roomProblem(hashRoom) && !nameProblem(ui.name.value)) {
  showLobby();
  requestJoin();
} else {
  showLobby();
  (ui.name.value ? ui.room : ui.name).focus();
}
