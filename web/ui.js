// Small pure pieces of the demo's behaviour (app.js), apart so that Node's
// test runner can check them without a browser.

import { ErrorCode, LeaveReason } from './codec.js';

/** `LeaveReason.SERVER_LOST`: in a cluster, the member's node stopped or was lost. */
const SERVER_LOST = LeaveReason.SERVER_LOST ?? 7;

/**
 * What the notice says of `name`, who left for `reason` (a LeaveReason):
 * "Ada timed out." Null for nothing: when a node goes, its people's pages
 * rejoin through another node at once, while the node is noticed gone only
 * seconds later; someone of that name already back did not go anywhere.
 * `present` is the names of the people still in the room.
 */
export function leftVerb(reason, name = null, present = []) {
  switch (reason) {
    case LeaveReason.TIMED_OUT:
      return 'timed out';
    case SERVER_LOST:
      for (const n of present) if (n === name) return null;
      return 'lost their server';
    default:
      return 'left';
  }
}

/**
 * The servers the demo connects to, from the page's `location`: its own
 * server first, then the other nodes of a cluster that the page's
 * `?nodes=` parameter names as ports on the same host
 * (`http://localhost:3000/?nodes=3000,3001`), so that when a node goes the
 * page rejoins through another. Ports only: a link cannot send the page to
 * another host. Entries that are not ports are left out.
 */
export function serverUrls(location) {
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const ownPort = location.port || (location.protocol === 'https:' ? '443' : '80');
  const urls = [`${scheme}://${location.host}/ws`];
  const seen = new Set([ownPort]);
  const nodes = new URLSearchParams(location.search ?? '').get('nodes') ?? '';
  for (const entry of nodes.split(',')) {
    const port = entry.trim();
    if (!/^[0-9]{1,5}$/.test(port) || Number(port) < 1 || Number(port) > 65535) continue;
    const canonical = String(Number(port));
    if (seen.has(canonical)) continue;
    seen.add(canonical);
    urls.push(`${scheme}://${location.hostname}:${canonical}/ws`);
  }
  return urls;
}

/**
 * Whether a server Error (not one refusing a Join) goes into the chat as a
 * notice. SHUTTING_DOWN does not: the connection closes right after it, and
 * the reconnecting banner says so; one stop, one message.
 */
export function errorInChat(code) {
  return code !== ErrorCode.SHUTTING_DOWN;
}

/**
 * The reason the reconnecting banner gives, from the reason it gave so far
 * in this outage (`current`, '' at its start) and a `closed` event's text.
 * The first close says why ("The server is restarting."); the failed
 * attempts that follow ("Can't reach the server.") do not replace it.
 */
export function outageReason(current, closeText) {
  return current || closeText.replace(/ Reconnecting in .*$/, '');
}

/**
 * What the name field says under it: nothing, or, once `value` has
 * reached the field's `maxLength` (where the browser stops taking letters
 * and cuts a paste), why it took no more.
 */
export function nameLimitHint(value, maxLength) {
  if (!(maxLength > 0) || value.length < maxLength) return '';
  return `At most ${maxLength} characters.`;
}

/** The page title: the room, and how many chat messages came while you were away. */
export function titleFor(room, unread) {
  if (!room) return 'amble';
  return unread > 0 ? `(${unread > 99 ? '99+' : unread}) ${room} · amble` : `${room} · amble`;
}

/** "in 3 s" for a wait in ms (whole seconds, rounded up; at least 1). */
export function inSeconds(ms) {
  return `in ${Math.max(1, Math.ceil(ms / 1000))} s`;
}

/**
 * Whether a key press on `target` belongs to it rather than to the page's
 * shortcuts (Enter to chat, WASD, +/-): text fields take every key; buttons,
 * links, tabs and other controls take Enter and Space, which press them.
 * `target` is an element (or a stand-in with tagName, type, getAttribute).
 */
export function keyBelongsTo(target, key) {
  if (!target || !target.tagName) return false;
  const tag = target.tagName.toUpperCase();
  if (tag === 'TEXTAREA' || tag === 'SELECT' || target.isContentEditable) return true;
  if (tag === 'INPUT') {
    const type = (target.type || 'text').toLowerCase();
    if (!['button', 'submit', 'reset', 'checkbox', 'radio', 'range', 'color', 'file'].includes(type)) return true;
  }
  if (key !== 'Enter' && key !== ' ') return false;
  if (tag === 'BUTTON' || tag === 'A' || tag === 'SUMMARY' || tag === 'INPUT') return true;
  const role = target.getAttribute?.('role');
  return role === 'button' || role === 'tab' || role === 'link' || role === 'menuitem' || role === 'option';
}

/**
 * After a reconnect, the server announces as "joined" the people who come
 * back as well (they reconnect after you). They never left as far as the
 * person watching is concerned: this remembers who was there when the
 * connection dropped and keeps quiet about them for a while after the rejoin.
 */
export class ReturnFilter {
  constructor({ graceMs = 30_000 } = {}) {
    this.graceMs = graceMs;
    this.names = new Map(); // name -> how many were there
    this.until = 0;
  }

  /** The connection dropped with these names in the room (yours aside). */
  dropped(names) {
    if (this.names.size > 0) return; // a second drop before the rejoin: keep the first list
    for (const n of names) this.names.set(n, (this.names.get(n) ?? 0) + 1);
    this.until = Infinity;
  }

  /** Rejoined at local time `nowMs`; returns the names still away. */
  rejoined(nowMs, present) {
    const seen = new Map();
    for (const n of present) seen.set(n, (seen.get(n) ?? 0) + 1);
    for (const [n, k] of seen) this.take(n, k);
    this.until = nowMs + this.graceMs;
    return [...this.names.keys()];
  }

  /** True when "`name` joined" at `nowMs` is someone coming back, not news. */
  returning(name, nowMs) {
    if (nowMs > this.until) {
      this.names.clear();
      return false;
    }
    if (!this.names.has(name)) return false;
    this.take(name, 1);
    return true;
  }

  /** Forgets everything (you left the room). */
  clear() {
    this.names.clear();
    this.until = 0;
  }

  take(name, k) {
    const left = (this.names.get(name) ?? 0) - k;
    if (left > 0) this.names.set(name, left);
    else this.names.delete(name);
  }
}

/**
 * What the lobby shows for a room from /api/rooms: its count, and whether
 * it is full (capacity 0 or missing: unknown, never full).
 */
export function roomStatus({ members, capacity }) {
  const full = capacity > 0 && members >= capacity;
  return {
    full,
    count: capacity > 0 ? `${members}/${capacity}` : `${members}`,
    title: capacity > 0
      ? `${members} of ${capacity} places taken${full ? ': full' : ''}`
      : `${members} ${members === 1 ? 'member' : 'members'}`,
  };
}

/** WCAG relative luminance of a #rrggbb colour. */
export function luminance(hex) {
  const v = parseInt(hex.slice(1), 16);
  const lin = (c) => {
    const x = c / 255;
    return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
  };
  return 0.2126 * lin((v >> 16) & 255) + 0.7152 * lin((v >> 8) & 255) + 0.0722 * lin(v & 255);
}

/** WCAG contrast ratio of two #rrggbb colours (1 to 21). */
export function contrast(a, b) {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

/** The statuses the demo offers; anything else is free text ("other"). */
export const STATUSES = Object.freeze(['available', 'busy', 'presenting']);

/** Longest free-text status the demo sends (the server allows more). */
export const MAX_STATUS_CHARS = 40;

/**
 * The avatar colour a member's data asks for (`data.colour`, `#rrggbb`), in
 * lower case, or null when it has none or not in that form (data is the
 * app's: another page may have put anything there).
 */
export function dataColour(data) {
  const c = data?.colour;
  return typeof c === 'string' && /^#[0-9a-f]{6}$/i.test(c) ? c.toLowerCase() : null;
}

/** A member's status to show under its name: `data.status`, trimmed and cut short, or ''. */
export function dataStatus(data) {
  const s = data?.status;
  if (typeof s !== 'string') return '';
  const chars = [...s.trim()];
  return chars.length > MAX_STATUS_CHARS ? `${chars.slice(0, MAX_STATUS_CHARS - 1).join('')}…` : chars.join('');
}

/**
 * The data entries a status picker gives: the choice, or the free text
 * when the choice is 'other' ('' or null removes the status).
 */
export function statusChange(choice, text) {
  if (STATUSES.includes(choice)) return { status: choice };
  const t = (text ?? '').trim();
  return { status: t === '' ? null : [...t].slice(0, MAX_STATUS_CHARS).join('') };
}
