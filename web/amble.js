// amble client library: connect to an amble server, join a room, see its
// members move, move yourself, chat. An ES module with no dependencies
// beyond its two siblings (codec.js: the wire format; member.js: the motion
// model). docs/client.md documents it.
//
// World units are centimetres (integers on the wire) and times are server
// time in milliseconds since the Unix epoch, as in the protocol. Every
// clock, timer, random source and the WebSocket class can be injected, so
// the library runs, deterministically, under Node's test runner.

import {
  ErrorCode,
  LeaveReason,
  MotionError,
  PROTOCOL_REVISION,
  SUBPROTOCOL,
  checkPosition,
  checkSpeed,
  decodeServerMessage,
  encodeClientMessage,
  motionRecordLength,
  resolveMotionTime,
  websocketHeaderBytes,
} from './codec.js';
import { DEFAULT_TUNING, Member } from './member.js';

export { ErrorCode, LeaveReason, Member, PROTOCOL_REVISION, SUBPROTOCOL };

/** This SDK's version: the package's (web/package.json), in the bundle's file name too. */
export const VERSION = '0.1.0';

/**
 * What each protocol revision added, as a server before it lacks it
 * (docs/protocol.md, "Compatibility"). Revision 1 is the original.
 */
export const REVISION_FEATURES = Object.freeze({
  2: Object.freeze(['Join.start (where to appear)', 'member data', 'the server version in Welcome']),
  3: Object.freeze(['token expiry notices and RefreshToken']),
  4: Object.freeze(['resuming a held place after a drop', "the app's system messages"]),
  5: Object.freeze(['spatial rooms (area of interest)']),
});

/**
 * How this SDK gets on with a server that sent `serverRevision` and
 * `serverVersion` in its Welcome (0 and '' from a server before revision
 * 2, which speaks revision 1): null when the server speaks this SDK's
 * revision or a newer one, else what it may lack and a sentence naming
 * both versions. The SDK works on either way; the server ignores what it
 * does not know.
 */
export function compatibility(serverRevision, serverVersion = '') {
  const revision = serverRevision > 0 ? serverRevision : 1;
  if (revision >= PROTOCOL_REVISION) return null;
  const missing = [];
  for (let r = revision + 1; r <= PROTOCOL_REVISION; r++) missing.push(...(REVISION_FEATURES[r] ?? []));
  const server = serverVersion ? `amble server ${serverVersion}` : 'this amble server (a release before 0.1.0)';
  return {
    serverVersion: serverVersion || null,
    serverRevision: revision,
    sdkVersion: VERSION,
    sdkRevision: PROTOCOL_REVISION,
    missing,
    text:
      `${server} speaks protocol revision ${revision}, older than this SDK's ${PROTOCOL_REVISION} ` +
      `(amble SDK ${VERSION}): it may not support ${missing.join(', ')}. The SDK works on without them.`,
  };
}

/** Connection states, in `client.state` and the `state` event. */
export const State = Object.freeze({
  IDLE: 'idle', // not connected yet
  CONNECTING: 'connecting', // WebSocket opening
  OPEN: 'open', // connected, in no room
  JOINING: 'joining', // Join sent, waiting for Welcome
  JOINED: 'joined', // in a room
  RECONNECTING: 'reconnecting', // lost the connection, waiting to retry
  CLOSED: 'closed', // closed for good (close() or a refusal not worth retrying)
});

/** Reconnect backoff: delay = min(max, initial * factor^attempt), minus up to `jitter` of it. */
export const DEFAULT_RECONNECT = Object.freeze({
  initialDelayMs: 500,
  maxDelayMs: 15_000,
  factor: 2,
  jitter: 0.5,
});

/**
 * The delay before reconnect attempt `attempt` (0 for the first retry):
 * exponential up to `maxDelayMs`, then scaled by a random factor in
 * (1 - jitter, 1] so that many clients dropped at once do not return at once.
 */
export function backoffDelay(attempt, policy = DEFAULT_RECONNECT, random = Math.random) {
  const base = Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.factor ** attempt);
  return Math.round(base * (1 - policy.jitter * random()));
}

/** Limits assumed until the server's Welcome says otherwise (the server defaults). */
export const DEFAULT_LIMITS = Object.freeze({
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
});

/** Member data keys: 1 to 32 characters of a-z, 0-9, '_', '.' and '-'. */
const DATA_KEY = /^[a-z0-9_.-]{1,32}$/;

/** Added to the render delay for network jitter (ms). */
const JITTER_MARGIN_MS = 100;

/** Slack on the client's own pacing, so it never runs ahead of the server's bucket. */
const PACING_SLACK_MS = 10;

/**
 * Estimates server time from Ping/Pong: of the last few samples, the one
 * with the lowest round trip gives the offset (server time at arrival =
 * its server time + half the round trip).
 *
 * That estimate (`offsetMs`) steps whenever a better sample comes or the
 * best one leaves the window: on a busy machine, by half the queueing delay
 * of the samples (tens to hundreds of ms). `now()` does not step with it:
 * it slews towards the estimate by at most `slew` ms per ms (5 %), so the
 * time it gives never goes backwards and has no jumps, and whatever is
 * drawn at it moves on smoothly. Only a difference over `snapMs` (the first
 * estimate, or a server whose clock was set) is taken at once.
 */
export class ServerClock {
  constructor({ window = 8, slew = 0.05, snapMs = 1000 } = {}) {
    this.window = window;
    this.slew = slew;
    this.snapMs = snapMs;
    this.samples = [];
    /** Server time minus local time (ms), the newest estimate; null until first known. */
    this.offsetMs = null;
    /** The offset `now()` uses, slewing towards `offsetMs`, and when it last moved (local ms). */
    this.shownOffsetMs = null;
    this.shownAtMs = 0;
    /** Round trip of the newest Pong (ms); null until the first. */
    this.rttMs = null;
  }

  /** A rough offset (e.g. from a Welcome's snapshot time), kept until a Pong comes. */
  rough(serverTimeMs, localMs) {
    if (this.samples.length === 0) this.offsetMs = serverTimeMs - localMs;
  }

  /** Adds a Pong that answered a Ping sent at local `sentMs`, received at `localMs`. */
  sample(sentMs, serverTimeMs, localMs) {
    const rtt = Math.max(0, localMs - sentMs);
    this.rttMs = rtt;
    this.samples.push({ rtt, offset: serverTimeMs + rtt / 2 - localMs });
    if (this.samples.length > this.window) this.samples.shift();
    let best = this.samples[0];
    for (const s of this.samples) if (s.rtt < best.rtt) best = s;
    this.offsetMs = best.offset;
    return rtt;
  }

  /** Server time now, given local time `localMs`; null when unknown. */
  now(localMs) {
    if (this.offsetMs === null) return null;
    const diff = this.offsetMs - (this.shownOffsetMs ?? this.offsetMs);
    if (this.shownOffsetMs === null || Math.abs(diff) > this.snapMs) {
      this.shownOffsetMs = this.offsetMs;
      this.shownAtMs = localMs;
    } else if (localMs > this.shownAtMs) {
      const step = (localMs - this.shownAtMs) * this.slew;
      this.shownOffsetMs += diff < -step ? -step : diff > step ? step : diff;
      this.shownAtMs = localMs;
    }
    return localMs + this.shownOffsetMs;
  }

  /**
   * Forgets the samples (a new connection has new round trips) but keeps
   * the offset in use, so that time runs on smoothly across a reconnect.
   */
  reset() {
    this.samples.length = 0;
    this.rttMs = null;
  }
}

// ------------------------------------------------------------------ checks

const ROOM = /^[A-Za-z0-9_.-]+$/;

// The text rule for names and chat, as the server has it (src/protocol/text.rs,
// docs/protocol.md "Names and chat text"): checked on the NFC form.
const BIDI_CONTROL = /[\u202A-\u202E\u2066-\u2069]/u;
const CONTROL = /\p{Cc}/u;
const SEPARATOR = /[\p{Zl}\p{Zp}]/u;
const INVISIBLE =
  /[\p{White_Space}\p{Default_Ignorable_Code_Point}\p{Cf}\p{Zs}\u2800\u{16FE4}\u{1D159}]/u;

/**
 * Why `text` breaks the rule the server holds names and chat to, or null:
 * 'empty', 'blank' (nothing visible), or a phrase for a person.
 */
export function textProblem(text, maxChars) {
  if (typeof text !== 'string') return 'empty';
  const chars = [...text.normalize('NFC')];
  if (chars.length === 0) return 'empty';
  if (chars.length > maxChars) return `at most ${maxChars} characters`;
  let visible = false;
  for (const c of chars) {
    if (BIDI_CONTROL.test(c)) return 'no bidirectional overrides or isolates';
    if (CONTROL.test(c)) return 'no control characters';
    if (SEPARATOR.test(c)) return 'no line or paragraph separators';
    if (!INVISIBLE.test(c)) visible = true;
  }
  return visible ? null : 'blank';
}

/** Why `name` would be refused (INVALID_NAME), or null when it is fine. */
export function nameProblem(name, maxChars = DEFAULT_LIMITS.maxNameChars) {
  const problem = textProblem(name, maxChars);
  if (problem === 'empty') return 'a name is needed';
  if (problem === 'blank') return 'a name needs something visible, not only spaces or invisible characters';
  return problem;
}

/** Why `room` would be refused (INVALID_ROOM), or null when it is fine. */
export function roomProblem(room, maxChars = 32) {
  if (typeof room !== 'string' || room === '') return 'a room name is needed';
  if (room.length > maxChars) return `at most ${maxChars} characters`;
  if (!ROOM.test(room)) return "only letters, digits, '_', '-' and '.'";
  return null;
}

/** Why chat `text` would be refused (INVALID_CHAT), or null when it is fine. */
export function chatProblem(text, maxChars = DEFAULT_LIMITS.maxChatChars) {
  const problem = textProblem(text, maxChars);
  if (problem === 'empty' || problem === 'blank') return 'the message is empty';
  return problem;
}

/**
 * Why member data would be refused (INVALID_DATA), or null when it is fine:
 * `data` is an object of key → value; with `removals`, a value of '' or
 * null removes the key (setData), otherwise every value must be text.
 * Only the entries themselves are checked: whether a member's data after a
 * change keeps to maxDataEntries and maxDataBytes is the server's to say.
 */
export function dataProblem(data, limits = DEFAULT_LIMITS, { removals = false } = {}) {
  if (data === null || typeof data !== 'object' || Array.isArray(data)) {
    return 'data must be an object of key → text';
  }
  const keys = Object.keys(data);
  const max = removals ? limits.maxDataEntries * 2 : limits.maxDataEntries;
  if (keys.length > max) return `at most ${max} entries`;
  let bytes = 0;
  for (const key of keys) {
    if (!DATA_KEY.test(key)) return `key ${JSON.stringify(key)}: 1 to 32 characters of a-z, 0-9, '_', '.' and '-'`;
    const value = data[key];
    if (removals && (value === '' || value === null)) continue;
    if (typeof value !== 'string') return `key ${JSON.stringify(key)}: the value must be text`;
    const problem = textProblem(value, limits.maxDataValueChars);
    if (problem) return `key ${JSON.stringify(key)}: ${problem === 'blank' ? 'the value is blank' : problem === 'empty' ? 'the value is empty' : problem}`;
    bytes += key.length + utf8Length(value.normalize('NFC'));
  }
  if (!removals && bytes > limits.maxDataBytes) return `at most ${limits.maxDataBytes} bytes of keys and values`;
  return null;
}

function utf8Length(text) {
  return new TextEncoder().encode(text).length;
}

/** Wire entries (`[{ key, value }]`, sorted by key) for data `{ key: value }`. */
function dataEntries(data) {
  return Object.keys(data ?? {})
    .sort()
    .map((key) => ({ key, value: data[key] === null ? '' : data[key].normalize('NFC') }));
}

/** A sentence for a person about an Error code from the server. */
export function explainError(code, serverMessage = '') {
  switch (code) {
    case ErrorCode.ROOM_FULL:
      return 'This room is full. Try another room, or come back in a while.';
    case ErrorCode.INVALID_NAME:
      return `That name can't be used${serverMessage ? ` (${serverMessage})` : ''}.`;
    case ErrorCode.INVALID_ROOM:
      return `That room name can't be used${serverMessage ? ` (${serverMessage})` : ''}.`;
    case ErrorCode.FLOOD:
      return 'The server disconnected you for sending too many messages.';
    case ErrorCode.SERVER_FULL:
      return 'The server is full right now.';
    case ErrorCode.SHUTTING_DOWN:
      return 'The server is restarting.';
    case ErrorCode.RATE_LIMITED:
      // Chat over its budget, or joining too often: the server says which.
      return serverMessage ? `Slow down: ${serverMessage}.` : 'Slow down: that message was dropped.';
    case ErrorCode.INVALID_CHAT:
      return `That message can't be sent${serverMessage ? ` (${serverMessage})` : ''}.`;
    case ErrorCode.TOO_BIG:
      return 'A message was too big for the server.';
    case ErrorCode.UNAUTHENTICATED:
      return `The server did not accept your sign-in${serverMessage ? ` (${serverMessage})` : ''}. Sign in again.`;
    case ErrorCode.FORBIDDEN:
      return "You don't have access to this room.";
    case ErrorCode.REPLACED:
      return 'You joined this room from another tab or device, so this one was disconnected.';
    case ErrorCode.INVALID_DATA:
      return `That can't be set${serverMessage ? ` (${serverMessage})` : ''}.`;
    case ErrorCode.TOKEN_EXPIRED:
      return 'Your sign-in expired before it was renewed.';
    case ErrorCode.KICKED:
      return `You were removed from this room${appReason(serverMessage)}.`;
    case ErrorCode.BANNED:
      return `You can't join: ${serverMessage || 'you are banned'}.`;
    case ErrorCode.MUTED:
      return `You can't chat now: ${serverMessage || 'you are muted'}.`;
    case ErrorCode.ROOM_CLOSED:
      return 'This room was closed.';
    default:
      return serverMessage || `Server error ${code}.`;
  }
}

/** The app's reason in a KICKED message ("removed from the room by the app: REASON"). */
function appReason(serverMessage) {
  const reason = /by the app: (.+)$/.exec(serverMessage ?? '')?.[1];
  return reason ? `: ${reason}` : '';
}

/** Error codes that refuse a Join; the socket stays open. RATE_LIMITED refuses one when joining too often. */
const REFUSALS = new Set([
  ErrorCode.ROOM_FULL,
  ErrorCode.INVALID_NAME,
  ErrorCode.INVALID_ROOM,
  ErrorCode.UNAUTHENTICATED,
  ErrorCode.FORBIDDEN,
  ErrorCode.RATE_LIMITED,
  ErrorCode.INVALID_DATA,
  ErrorCode.BANNED,
]);

/** The wait a RATE_LIMITED message names ("... next allowed in 1840 ms"), or null. */
export function retryAfterMs(serverMessage) {
  const m = /\bin (\d+) ms\b/.exec(serverMessage ?? '');
  return m ? Number(m[1]) : null;
}

/** Close code of a connection replaced by a newer one of the same user. */
const CLOSE_REPLACED = 4000;
/** Close code of a session whose token expired unrefreshed (TOKEN_EXPIRED). */
const CLOSE_TOKEN_EXPIRED = 4003;
/** Close codes of the app's removals (server API): KICKED, BANNED, ROOM_CLOSED. */
const CLOSE_KICKED = 4004;
const CLOSE_BANNED = 4005;
const CLOSE_ROOM_CLOSED = 4006;
/** Close code of a connection whose place a resume from a newer one took. */
const CLOSE_RESUMED = 4001;

/** Close codes after which retrying would only repeat the offence (or, for
 * 4000 and 4001, take the room back from your own newer tab or connection; for 4004-4006, undo
 * what the app decided). */
const NO_RETRY_CLOSE_CODES = new Set([
  1003, 1007, 1008, 1009, CLOSE_REPLACED, CLOSE_KICKED, CLOSE_BANNED, CLOSE_ROOM_CLOSED, CLOSE_RESUMED,
]);
const NO_RETRY_ERRORS = new Set([
  ErrorCode.FLOOD,
  ErrorCode.MALFORMED,
  ErrorCode.TOO_BIG,
  ErrorCode.TEXT_FRAME,
  ErrorCode.UNAUTHENTICATED,
  ErrorCode.FORBIDDEN,
  ErrorCode.REPLACED,
  ErrorCode.KICKED,
  ErrorCode.BANNED,
  ErrorCode.ROOM_CLOSED,
]);

function defaultReportError(err) {
  if (typeof globalThis.reportError === 'function') globalThis.reportError(err);
  else
    queueMicrotask(() => {
      throw err;
    });
}

function defaultUrl() {
  const loc = globalThis.location;
  if (!loc) throw new TypeError('AmbleClient needs options.url outside a browser');
  return `${loc.protocol === 'https:' ? 'wss' : 'ws'}://${loc.host}/ws`;
}

/**
 * The server URLs from `options.url` (a string, or an array of them) or
 * `options.urls` (an array): a non-empty list of non-empty strings.
 */
function serverUrls(options) {
  if (options.url !== undefined && options.urls !== undefined) {
    throw new TypeError('give options.url or options.urls, not both');
  }
  const given = options.urls ?? options.url;
  if (given === undefined || given === null) return [defaultUrl()];
  const list = typeof given === 'string' ? [given] : given;
  if (!Array.isArray(list) || list.length === 0) {
    throw new TypeError('options.url must be a URL string or a non-empty array of them');
  }
  for (const u of list) {
    if (typeof u !== 'string' || u === '') throw new TypeError(`not a server URL: ${JSON.stringify(u)}`);
  }
  return Object.freeze([...list]);
}

// ------------------------------------------------------------------ client

/**
 * One connection to an amble server, in at most one room at a time.
 *
 * `options.url` may list several servers (the nodes of a cluster, which
 * share rooms): the first is tried first, and each reconnect tries the
 * next one in turn, so a page whose server went away rejoins through
 * another.
 *
 * Events (`client.on(type, fn)` returns a function that unsubscribes):
 * - `state` (state, previous)
 * - `welcome` ({ room, me, members, limits, rejoined, resumed }) — joined a
 *   room; `resumed`: the server gave back the place held since a drop (the
 *   others saw nothing)
 * - `joined` (member) — someone else came in
 * - `left` (member, reason) — someone left (reason: LeaveReason)
 * - `moved` (member) — a motion update for someone else
 * - `chat` ({ member, memberId, text, serverTimeMs }) — member may be null
 * - `appeared` (member), `disappeared` (member) — spatial rooms: someone came
 *   into your view or went out of it (they are in the room all along: not
 *   `joined` or `left`)
 * - `found` ({ prefix, members, nextCursor, total }) — the answer to `find`
 * - `population` (count) — spatial rooms: the room's member count changed
 *   (`client.population`; at most once a second)
 * - `system` ({ text, serverTimeMs, direct }) — a message from the app that
 *   hosts the world (its backend, through the server API), not a member's;
 *   `direct` when it is for you alone
 * - `data` (member, previous) — a member's data changed (yours included):
 *   `member.data` is the new one, `previous` the one before
 * - `resync` (members) — the member list was replaced by a snapshot
 * - `renumbered` (member, oldId) — a member's id changed (it resumed its
 *   place through another node of a cluster): the same member, now
 *   `member.id`; no `left`, no `joined`
 * - `pong` (rttMs)
 * - `error` ({ code, message, text, refused }) — Error from the server
 * - `closed` ({ code, reason, error, willReconnect, retryInMs, url, nextUrl, text })
 * - `compatibility` ({ serverVersion, serverRevision, sdkVersion, sdkRevision, missing, text })
 *   — once per server release: it speaks an older protocol revision than this SDK
 * - `tokenExpiring` ({ expiresAtMs, refreshing }) — the server says your token
 *   expires at expiresAtMs; `refreshing` when getToken is being asked for a
 *   fresh one (sent as RefreshToken)
 * - `tokenRefreshed` ({ expiresAtMs }) — the server took the fresh token
 *   (expiresAtMs 0: a server without keys, nothing expires)
 */
export class AmbleClient {
  constructor(options = {}) {
    /** The servers to connect to, in order; `url` is the one in use (or tried next). */
    this.urls = serverUrls(options);
    this.urlIndex = 0;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.now = options.now ?? (() => performance.now());
    this.random = options.random ?? Math.random;
    this.setTimer = options.setTimeout ?? ((fn, ms) => setTimeout(fn, ms));
    this.clearTimer = options.clearTimeout ?? ((id) => clearTimeout(id));
    /** Where exceptions thrown by event handlers go (the browser's reportError by default). */
    this.reportError = options.reportError ?? defaultReportError;
    /** Where the one warning about an older server goes (console.warn by default). */
    this.warn = options.warn ?? ((text) => console.warn(text));
    this.reconnect =
      options.reconnect === false ? null : { ...DEFAULT_RECONNECT, ...(options.reconnect ?? {}) };
    this.pingIntervalMs = options.pingIntervalMs ?? 2000;
    /**
     * A signed token for Join (`token`), or an async function that returns
     * one (`getToken({ room, name })`), called before every Join, so again on
     * each reconnect: tokens expire. Asked too, as `getToken({ room, name,
     * refresh: true })`, when the server says the member's token is about to
     * expire: the answer goes out as RefreshToken. Only needed when the
     * server requires tokens; see docs/client.md, "Tokens".
     */
    this.token = options.token ?? null;
    this.getToken = options.getToken ?? null;
    if (this.token !== null && typeof this.token !== 'string') throw new TypeError('options.token must be a string');
    if (this.getToken !== null && typeof this.getToken !== 'function') {
      throw new TypeError('options.getToken must be a function');
    }
    /** Walk speed (cm/s) for walkTo when none is given; capped at limits.maxSpeed. */
    this.walkSpeed = options.walkSpeed ?? 300;
    this.renderDelayOption = options.renderDelayMs ?? null;
    /** Shared by every member: read on each positionAt. */
    this.tuning = {
      ...DEFAULT_TUNING,
      ...(options.maxExtrapolationMs !== undefined && { maxExtrapolationMs: options.maxExtrapolationMs }),
      ...(options.easeMs !== undefined && { easeMs: options.easeMs }),
    };
    this.limits = { ...DEFAULT_LIMITS };
    this.renderDelayMs = this.renderDelayOption ?? defaultRenderDelay(this.limits);
    this.clock = new ServerClock();

    this.state = State.IDLE;
    /** Members of the room, you included, by id (in a spatial room: those in view). */
    this.members = new Map();
    /** Members in the room, you included (in a spatial room, in view or not); 0 outside one. */
    this.population = 0;
    /** Your own member (motion predicted locally); null outside a room. */
    this.me = null;
    this.memberId = null;
    this.room = null;
    /** The newest Pong's round trip (ms), or null. */
    this.rttMs = null;
    /** The server's release and protocol revision, from its newest Welcome; null before. */
    this.serverVersion = null;
    this.serverRevision = null;
    /** When the member's token expires (ms since the epoch, server time): null without one. */
    this.tokenExpiresAtMs = null;
    /**
     * The newest Welcome's resume token: sent with the Join of every
     * reconnect and failover to the same room, so the server gives the
     * held place back (null: none, or not in a room).
     */
    this.resumeToken = null;
    this.warnedServers = new Set(); // `${version}/${revision}` already warned about
    /** The last Error the server sent, and the last close. */
    this.lastError = null;
    this.lastClose = null;

    /**
     * Counters, all measured: frames and payload bytes as handed to and by
     * the WebSocket, plus `wire*` = payload + the RFC 6455 frame header
     * (computed exactly from each payload length; masked out).
     */
    this.stats = {
      framesIn: 0,
      framesOut: 0,
      bytesIn: 0,
      bytesOut: 0,
      wireBytesIn: 0,
      wireBytesOut: 0,
      motionUpdatesIn: 0,
      movesOut: 0,
      chatsOut: 0,
      undecodable: 0,
      extensions: '',
    };

    this.handlers = new Map();
    this.ws = null;
    this.active = false; // connect() called and close() not since
    this.attempt = 0;
    this.wanted = null; // { room, name } to be in
    this.timers = { reconnect: null, ping: null, flush: null };
    this.pending = null; // the newest unsent move
    this.lastSentStand = null; // { x, y } of the last standing move sent
    this.seq = 0;
    this.moveTokens = 0;
    this.moveTokensAt = 0;
    this.lastFreeMoveAt = -Infinity;
    this.chatTokens = 0;
    this.chatTokensAt = 0;
    this.dataTokens = 0;
    this.dataTokensAt = 0;
    this.initPageLifecycle(options);
  }

  /** The server URL in use, or the one the next attempt goes to. */
  get url() {
    return this.urls[this.urlIndex];
  }

  /** Replaces the server list with this one URL (from the next connection on). */
  set url(value) {
    this.urls = serverUrls({ url: value });
    this.urlIndex = 0;
  }

  // -------------------------------------------------------------- events

  /** Subscribes `fn` to event `type`; returns the unsubscribe function. */
  on(type, fn) {
    let set = this.handlers.get(type);
    if (!set) this.handlers.set(type, (set = new Set()));
    set.add(fn);
    return () => set.delete(fn);
  }

  emit(type, ...args) {
    const set = this.handlers.get(type);
    if (!set) return;
    for (const fn of set) {
      try {
        fn(...args);
      } catch (err) {
        // A failing handler must not break the connection; report it apart.
        this.reportError(err);
      }
    }
  }

  setState(next) {
    if (next === this.state) return;
    const prev = this.state;
    this.state = next;
    this.emit('state', next, prev);
  }

  // ---------------------------------------------------------- time & clock

  /**
   * The estimated server time (ms since the epoch) now, or at local time
   * `localMs` (e.g. a frame's timestamp, on the clock of `options.now`).
   */
  serverNow(localMs = this.now()) {
    return this.clock.now(localMs) ?? Date.now();
  }

  /**
   * The time to pass to `member.positionAt`: server time minus the render
   * delay for others, so their next update has usually arrived; now for
   * yourself, whose motion is predicted locally. `localMs` as in serverNow.
   */
  renderTime(member = null, localMs = this.now()) {
    const now = this.serverNow(localMs);
    return member && member.isSelf ? now : now - this.renderDelayMs;
  }

  // ------------------------------------------------------------ lifecycle

  /** Opens the connection (and keeps reopening it until close()). */
  connect() {
    this.active = true;
    this.pageHidden = false;
    this.listenToPage(true);
    if (this.ws || this.timers.reconnect !== null) return this;
    this.openSocket();
    return this;
  }

  /**
   * Joins `room` as `name` (connecting first if need be). Leaves the current
   * room first. Throws a RangeError for a name or room the server would
   * refuse. With a `token` or `getToken`, `name` may be left out when the
   * token's `name` claim supplies it. The answer comes as a `welcome` or an
   * `error` event.
   */
  join(room, name = '', { start = null, data = {} } = {}) {
    const tokenNames = name === '' && (this.token !== null || this.getToken !== null);
    const problem = roomProblem(room)
      ?? (tokenNames ? null : nameProblem(name, this.limits.maxNameChars))
      ?? dataProblem(data, this.limits);
    if (problem) throw new RangeError(problem);
    if (start !== null && !(Number.isFinite(start?.x) && Number.isFinite(start?.y) && start.x >= 0 && start.y >= 0)) {
      throw new RangeError('start must be { x, y } in cm, both finite and not negative');
    }
    if (this.state === State.JOINED || this.state === State.JOINING) this.sendLeave();
    this.clearRoom(); // a new join is a new arrival, not a rejoin
    // The server keeps names in NFC: so does the client, to match its own.
    const at = start === null ? null : { x: Math.round(start.x), y: Math.round(start.y) };
    // The data goes with every Join of this room, and follows setData, so
    // a rejoin after a reconnect carries the data as it was last set.
    const wantedData = Object.fromEntries(dataEntries(data).map((e) => [e.key, e.value]));
    this.wanted = { room, name: name.normalize('NFC'), start: at, data: wantedData };
    if (this.ws && this.ws.readyState === 1) this.sendJoin();
    else this.connect();
    return this;
  }

  /** Leaves the room; the connection stays open. */
  leave() {
    this.wanted = null;
    if (this.state === State.JOINED || this.state === State.JOINING) this.sendLeave();
    this.clearRoom();
    if (this.ws && this.ws.readyState === 1) this.setState(State.OPEN);
  }

  /** Closes the connection for good. A second call does nothing (one `closed`). */
  close() {
    if (this.state === State.CLOSED && !this.active && this.ws === null) return;
    this.active = false;
    this.wanted = null;
    this.listenToPage(false);
    this.stopTimers();
    const hadSocket = this.dropSocket('bye');
    this.clearRoom();
    this.lastClose = {
      code: 1000,
      reason: 'closed by the client',
      error: null,
      willReconnect: false,
      retryInMs: null,
      url: hadSocket ? this.url : null,
      nextUrl: null,
      text: 'Disconnected.',
    };
    this.setState(State.CLOSED);
    this.emit('closed', this.lastClose);
  }

  openSocket() {
    this.setState(State.CONNECTING);
    this.lastError = null;
    let ws;
    try {
      ws = new this.WebSocket(this.url, SUBPROTOCOL);
    } catch (err) {
      // A bad URL throws synchronously: nothing to retry.
      this.active = false;
      this.setState(State.CLOSED);
      throw err;
    }
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    this.wsOpened = false;
    ws.onopen = () => this.onOpen(ws);
    ws.onmessage = (ev) => this.onMessage(ws, ev.data);
    ws.onclose = (ev) => this.onClose(ws, ev);
    // In a browser a close event follows an error, with its code. Node's
    // WebSocket (Node 20 and 22) fires only the error when the server
    // cannot be reached, and stays CONNECTING: then the error ends the
    // socket here, as the close event would have (1006, never opened).
    ws.onerror = () => {
      if (this.wsOpened) return;
      this.setTimer(() => {
        if (ws !== this.ws || this.wsOpened) return;
        try {
          ws.close();
        } catch {
          // Closing a socket that never opened may throw; it is dropped anyway.
        }
        this.onClose(ws, { code: 1006, reason: '' });
      }, 0);
    };
  }

  onOpen(ws) {
    if (ws !== this.ws) return;
    this.wsOpened = true;
    this.stats.extensions = ws.extensions ?? '';
    this.clock.reset();
    this.setState(State.OPEN);
    if (!this.wanted) this.attempt = 0;
    this.sendPing();
    if (this.wanted) this.sendJoin();
  }

  onClose(ws, ev) {
    if (ws !== this.ws) return;
    this.ws = null;
    detach(ws);
    this.stopTimers();
    const error = this.lastError;
    const code = ev.code ?? 1006;
    // An expired token: worth a reconnect only with getToken to ask for a
    // fresh one (a fixed token would be refused at once).
    const expired = code === CLOSE_TOKEN_EXPIRED || error?.code === ErrorCode.TOKEN_EXPIRED;
    const retry =
      this.active &&
      this.reconnect !== null &&
      !NO_RETRY_CLOSE_CODES.has(code) &&
      !(error && !error.refresh && NO_RETRY_ERRORS.has(error.code)) &&
      !(expired && this.getToken === null);
    const retryInMs = retry ? backoffDelay(this.attempt, this.reconnect, this.random) : null;
    const url = this.url;
    // Each retry goes to the next server in the list (the same one when there is one),
    // except the first after a drop from a server that is not going away (1001) while
    // this client holds a resume token: that server holds the place and gives it back
    // under the same id, so it is asked first (another node of the cluster can give it
    // back too, under a new id: the others then see one `renumbered`).
    const resumeHere = this.resumeToken !== null && this.wsOpened && this.attempt === 0 && code !== 1001;
    if (retry && !resumeHere) this.urlIndex = (this.urlIndex + 1) % this.urls.length;
    this.lastClose = {
      code,
      reason: ev.reason ?? '',
      error,
      willReconnect: retry,
      retryInMs,
      /** The server this connection was to, and the one the retry goes to (null: none). */
      url,
      nextUrl: retry ? this.url : null,
      /** False when the socket never opened: the server could not be reached. */
      opened: this.wsOpened,
      text: closeText(code, error, retryInMs, this.wsOpened),
    };
    if (retry) {
      this.attempt++;
      this.setState(State.RECONNECTING);
      this.timers.reconnect = this.setTimer(() => {
        this.timers.reconnect = null;
        if (this.active) this.openSocket();
      }, retryInMs);
    } else {
      this.active = false;
      this.clearRoom();
      this.setState(State.CLOSED);
    }
    this.emit('closed', this.lastClose);
  }

  /**
   * While `reconnecting` and waiting out the backoff: the next attempt now
   * (a "Reconnect now" button). The backoff of later attempts still grows.
   * Returns false, doing nothing, when no attempt is waiting.
   */
  reconnectNow() {
    if (!this.active || this.timers.reconnect === null) return false;
    this.clearTimer(this.timers.reconnect);
    this.timers.reconnect = null;
    this.openSocket();
    return true;
  }

  // ------------------------------------------------------- page lifecycle

  /**
   * `options.pageLifecycle` (default true, in a browser): on `pagehide` the
   * client closes its socket (1000). A page going into the back/forward
   * cache (`persisted`) closes without a Leave: the server holds its place
   * for the resume grace, and on `pageshow` from the cache the client
   * reconnects with its resume token and gets the place back, unseen by the
   * others (after the grace: a fresh join; the others saw it leave). A page
   * being unloaded leaves its room first, so it never lingers there.
   * `options.pageTarget` is where the listeners go (`globalThis` by default;
   * tests give their own).
   */
  initPageLifecycle(options) {
    const inBrowser =
      typeof globalThis.addEventListener === 'function' &&
      typeof globalThis.window !== 'undefined' &&
      typeof globalThis.document !== 'undefined';
    const target = options.pageTarget ?? (inBrowser ? globalThis : null);
    if (target !== null && typeof target?.addEventListener !== 'function') {
      throw new TypeError('options.pageTarget must have addEventListener and removeEventListener');
    }
    this.pageTarget = options.pageLifecycle === false ? null : target;
    this.pageListening = false;
    this.pageHidden = false; // left and closed on pagehide, until pageshow
    this.onPageHide = (event) => {
      if (!this.active || this.pageHidden) return;
      this.pageHidden = true;
      // Into the cache: no Leave, the server holds the place and pageshow
      // resumes it (this.wanted, this.me and the token stay). Unloaded:
      // Leave first, so the others see a Left at once.
      const cached = event?.persisted === true && this.resumeToken !== null;
      if (!cached && (this.state === State.JOINED || this.state === State.JOINING)) this.sendLeave();
      this.stopTimers();
      this.dropSocket('page hidden');
      this.attempt = 0;
      this.setState(State.IDLE);
    };
    this.onPageShow = (event) => {
      if (!event?.persisted || !this.active || !this.pageHidden) return;
      this.pageHidden = false;
      if (this.ws === null && this.timers.reconnect === null) this.openSocket();
    };
  }

  /** Adds (`on`) or removes the pagehide/pageshow listeners; once each. */
  listenToPage(on) {
    if (this.pageTarget === null || this.pageListening === on) return;
    this.pageListening = on;
    const method = on ? 'addEventListener' : 'removeEventListener';
    this.pageTarget[method]('pagehide', this.onPageHide);
    this.pageTarget[method]('pageshow', this.onPageShow);
  }

  /**
   * Closes the socket (1000, `reason`) without hearing from it again.
   * Returns whether there was one.
   */
  dropSocket(reason) {
    const ws = this.ws;
    this.ws = null;
    if (!ws) return false;
    detach(ws);
    try {
      ws.close(1000, reason);
    } catch {
      // Already closing.
    }
    return true;
  }

  stopTimers() {
    for (const key of Object.keys(this.timers)) {
      if (this.timers[key] !== null) this.clearTimer(this.timers[key]);
      this.timers[key] = null;
    }
  }

  clearRoom() {
    this.members.clear();
    this.me = null;
    this.memberId = null;
    this.room = null;
    this.pending = null;
    this.lastSentStand = null;
    this.tokenExpiresAtMs = null;
    this.resumeToken = null;
  }

  // -------------------------------------------------------------- sending

  send(msg) {
    const ws = this.ws;
    if (!ws || ws.readyState !== 1) return false;
    const bytes = encodeClientMessage(msg, this.limits);
    ws.send(bytes);
    this.stats.framesOut++;
    this.stats.bytesOut += bytes.byteLength;
    this.stats.wireBytesOut += bytes.byteLength + websocketHeaderBytes(bytes.byteLength, true);
    return true;
  }

  sendJoin() {
    this.setState(State.JOINING);
    const { room, name, start } = this.wanted;
    const data = dataEntries(this.wanted.data);
    // Back in the room we were in (a reconnect, a failover, a page back
    // from the cache): ask for the held place. A new arrival has no token.
    const resumeToken = this.me !== null && this.room === room ? (this.resumeToken ?? '') : '';
    if (this.getToken === null) {
      this.send({ join: { room, name, token: this.token ?? '', start, resumeToken, data } });
      return;
    }
    // A fresh token for every Join. Its answer is used only if the socket
    // and the room wanted are still the ones it was asked for.
    const ws = this.ws;
    const wanted = this.wanted;
    const current = () => ws === this.ws && wanted === this.wanted;
    let asked;
    try {
      asked = Promise.resolve(this.getToken({ room, name }));
    } catch (err) {
      asked = Promise.reject(err);
    }
    asked.then(
      (token) => {
        if (!current()) return;
        if (typeof token !== 'string' || token === '') {
          this.tokenFailed(new TypeError('getToken must resolve to a token string'));
          return;
        }
        this.send({ join: { room, name, token, start, resumeToken, data } });
      },
      (err) => {
        if (current()) this.tokenFailed(err);
      },
    );
  }

  /**
   * TokenExpiring: with getToken, ask it for a fresh token and send it as
   * RefreshToken (for this socket and room only). Without, the app is told
   * and the session ends at the expiry.
   */
  onTokenExpiring(t) {
    if (this.state !== State.JOINED || !this.wanted) return;
    this.tokenExpiresAtMs = t.expiresAtMs || null;
    const refreshing = this.getToken !== null;
    this.emit('tokenExpiring', { expiresAtMs: t.expiresAtMs, refreshing });
    if (!refreshing) return;
    const ws = this.ws;
    const wanted = this.wanted;
    const current = () => ws === this.ws && wanted === this.wanted && this.state === State.JOINED;
    let asked;
    try {
      asked = Promise.resolve(this.getToken({ room: wanted.room, name: wanted.name, refresh: true }));
    } catch (err) {
      asked = Promise.reject(err);
    }
    const failed = (err) => {
      // The room stays until the server ends the session at the expiry.
      const info = {
        code: null,
        message: err?.message ?? String(err),
        text: 'Could not renew the sign-in token; this session ends when it expires.',
        refused: false,
        refresh: true,
      };
      this.lastError = info;
      this.emit('error', info);
    };
    asked.then(
      (token) => {
        if (!current()) return;
        if (typeof token !== 'string' || token === '') failed(new TypeError('getToken must resolve to a token string'));
        else this.send({ refresh: { token } });
      },
      (err) => {
        if (current()) failed(err);
      },
    );
  }

  onTokenRefreshed(t) {
    if (this.state !== State.JOINED) return;
    this.tokenExpiresAtMs = t.expiresAtMs || null;
    this.emit('tokenRefreshed', { expiresAtMs: t.expiresAtMs });
  }

  /** getToken failed: the join is given up (no retry loop), the socket stays. */
  tokenFailed(err) {
    const info = {
      code: null,
      message: err?.message ?? String(err),
      text: 'Could not get a sign-in token for this room.',
      refused: true,
    };
    this.lastError = info;
    this.wanted = null;
    this.clearRoom();
    this.setState(State.OPEN);
    this.emit('error', info);
  }

  sendLeave() {
    this.send({ leave: {} });
  }

  sendPing() {
    if (this.timers.ping !== null) this.clearTimer(this.timers.ping);
    this.send({ ping: { clientTimeMs: Math.max(0, Math.round(this.now())) } });
    this.timers.ping = this.setTimer(() => {
      this.timers.ping = null;
      this.sendPing();
    }, this.pingIntervalMs);
  }

  /**
   * Free movement: you are standing at (x, y) cm now. Call it as often as
   * you like (e.g. every frame while a key is held); the newest position is
   * sent at most once per `limits.moveIntervalMs`. Throws a RangeError for
   * NaN, ±Infinity or a point outside the world (after rounding to whole cm).
   */
  moveTo(x, y) {
    const me = this.requireMe('moveTo');
    const px = Math.round(x);
    const py = Math.round(y);
    checkPosition(px, py, this.limits, 'moveTo');
    me.reset(this.serverNow(), px, py);
    const last = this.lastSentStand;
    if (last && last.x === px && last.y === py && (!this.pending || !this.pending.walk)) {
      this.pending = null; // back where the server already has you
      return;
    }
    this.pending = { walk: false, x: px, y: py };
    this.flush();
  }

  /**
   * Click-to-move: walk in a straight line from where you are to (x, y) cm
   * at `speed` cm/s (default `walkSpeed`), then stop. One message for the
   * whole walk. Throws a RangeError for a target outside the world or a
   * speed outside 1..=limits.maxSpeed.
   */
  walkTo(x, y, { speed } = {}) {
    const me = this.requireMe('walkTo');
    const tx = Math.round(x);
    const ty = Math.round(y);
    checkPosition(tx, ty, this.limits, 'walkTo');
    let s;
    if (speed === undefined) s = Math.min(Math.max(1, Math.round(this.walkSpeed)), this.limits.maxSpeed);
    else {
      s = Math.round(speed);
      checkSpeed(s, this.limits, 'walkTo speed');
    }
    const now = this.serverNow();
    const from = me.positionAt(now, { x: 0, y: 0 });
    me.reset(now, Math.round(from.x), Math.round(from.y), { target: { x: tx, y: ty }, speed: s });
    this.pending = { walk: true, tx, ty, speed: s };
    this.flush();
  }

  requireMe(what) {
    if (!this.me) throw new Error(`${what} needs a room: join one first`);
    return this.me;
  }

  refillMoves(now) {
    const spacing = this.limits.moveIntervalMs + PACING_SLACK_MS;
    const burst = Math.max(1, this.limits.moveBurst);
    this.moveTokens = Math.min(burst, this.moveTokens + (now - this.moveTokensAt) / spacing);
    this.moveTokensAt = now;
    return spacing;
  }

  /** Sends the pending move if the pacing allows, else sets a timer for when it will. */
  flush() {
    if (!this.pending || this.state !== State.JOINED) return;
    const now = this.now();
    const spacing = this.refillMoves(now);
    let waitMs = this.moveTokens >= 1 ? 0 : (1 - this.moveTokens) * spacing;
    // Free movement keeps to one per interval, leaving the burst for walks and stops.
    if (!this.pending.walk) waitMs = Math.max(waitMs, this.lastFreeMoveAt + spacing - now);
    if (waitMs > 0) {
      if (this.timers.flush === null) {
        this.timers.flush = this.setTimer(() => {
          this.timers.flush = null;
          this.flush();
        }, Math.ceil(waitMs));
      }
      return;
    }
    const p = this.pending;
    this.pending = null;
    let move;
    if (p.walk) {
      const at = this.me.positionAt(this.serverNow(), { x: 0, y: 0 });
      const x = Math.round(at.x);
      const y = Math.round(at.y);
      if (x === p.tx && y === p.ty) {
        move = { position: { x, y }, walk: null };
        this.lastSentStand = { x, y };
      } else {
        move = { position: { x, y }, walk: { target: { x: p.tx, y: p.ty }, speed: p.speed } };
        this.lastSentStand = null;
      }
    } else {
      move = { position: { x: p.x, y: p.y }, walk: null };
      this.lastSentStand = { x: p.x, y: p.y };
      this.lastFreeMoveAt = now;
    }
    this.seq = (this.seq + 1) >>> 0;
    move.seq = this.seq;
    move.clientTimeMs = Math.max(0, Math.round(now));
    this.moveTokens -= 1;
    if (this.send({ move })) this.stats.movesOut++;
  }

  /**
   * Sends a chat message. Throws a RangeError for text the server would
   * refuse (see chatProblem). Returns false, sending
   * nothing, when the chat budget (limits.chatBurst, one more per
   * chatIntervalMs) is spent.
   */
  chat(text) {
    if (this.state !== State.JOINED) throw new Error('chat needs a room: join one first');
    const problem = chatProblem(text, this.limits.maxChatChars);
    if (problem) throw new RangeError(problem);
    const now = this.now();
    const interval = this.limits.chatIntervalMs + PACING_SLACK_MS;
    const burst = Math.max(1, this.limits.chatBurst);
    this.chatTokens = Math.min(burst, this.chatTokens + (now - this.chatTokensAt) / interval);
    this.chatTokensAt = now;
    if (this.chatTokens < 1) return false;
    this.chatTokens -= 1;
    if (!this.send({ chat: { text } })) return false;
    this.stats.chatsOut++;
    return true;
  }

  /**
   * Finds members of your room whose name starts with `prefix` (ignoring
   * case; '' for everyone), in view or not (a spatial room): the answer
   * comes as a `found` event ({ prefix, members, nextCursor, total }, each
   * member with its position, so you can walk or jump there). `cursor`
   * continues a page (the last `found`'s nextCursor). Returns false,
   * sending nothing, outside a room; the server allows a find every 2 s
   * (bursts of 3) and answers RATE_LIMITED past it.
   */
  find(prefix = '', { cursor = 0 } = {}) {
    if (this.state !== State.JOINED) return false;
    return this.send({ find: { prefix: String(prefix).normalize('NFC'), cursor } });
  }

  /**
   * Sets entries of your member data (`{ key: value }`; a value of '' or
   * null removes the key). Everyone in the room, you included, gets a
   * `data` event once the server applied it; it stays for rejoins. Throws
   * a RangeError for entries the server would refuse (see dataProblem).
   * Returns false, sending nothing, when the data budget (limits.dataBurst,
   * one more per dataIntervalMs) is spent.
   */
  setData(changes) {
    if (this.state !== State.JOINED) throw new Error('setData needs a room: join one first');
    const problem = dataProblem(changes, this.limits, { removals: true });
    if (problem) throw new RangeError(problem);
    const now = this.now();
    const interval = this.limits.dataIntervalMs + PACING_SLACK_MS;
    const burst = Math.max(1, this.limits.dataBurst);
    this.dataTokens = Math.min(burst, this.dataTokens + (now - this.dataTokensAt) / interval);
    this.dataTokensAt = now;
    if (this.dataTokens < 1) return false;
    this.dataTokens -= 1;
    const entries = dataEntries(changes);
    if (!this.send({ setData: { data: entries } })) return false;
    if (this.wanted) {
      const next = { ...this.wanted.data };
      for (const { key, value } of entries) {
        if (value === '') delete next[key];
        else next[key] = value;
      }
      this.wanted.data = next;
    }
    return true;
  }

  /** How long (ms) until chat() may send again: 0 when it may now. */
  chatWaitMs() {
    const interval = this.limits.chatIntervalMs + PACING_SLACK_MS;
    const tokens = Math.min(Math.max(1, this.limits.chatBurst), this.chatTokens + (this.now() - this.chatTokensAt) / interval);
    return tokens >= 1 ? 0 : Math.ceil((1 - tokens) * interval);
  }

  // ------------------------------------------------------------ receiving

  onMessage(ws, data) {
    if (ws !== this.ws) return;
    if (typeof data === 'string') {
      this.stats.undecodable++;
      return;
    }
    const bytes = data instanceof ArrayBuffer ? new Uint8Array(data) : data;
    const len = bytes.byteLength;
    this.stats.framesIn++;
    this.stats.bytesIn += len;
    this.stats.wireBytesIn += len + websocketHeaderBytes(len, false);
    let msg;
    try {
      msg = decodeServerMessage(bytes);
    } catch (err) {
      this.stats.undecodable++;
      this.emit('error', { code: null, message: err.message, text: 'Received a frame that could not be read.', refused: false });
      return;
    }
    if (msg.welcome) this.onWelcome(msg.welcome);
    else if (msg.joined) this.onJoined(msg.joined);
    else if (msg.left) this.onLeft(msg.left);
    else if (msg.chat) this.onChat(msg.chat);
    else if (msg.pong) this.onPong(msg.pong);
    else if (msg.error) this.onError(msg.error);
    else if (msg.resync) this.onResync(msg.resync);
    else if (msg.memberData) this.onMemberData(msg.memberData);
    else if (msg.tokenExpiring) this.onTokenExpiring(msg.tokenExpiring);
    else if (msg.tokenRefreshed) this.onTokenRefreshed(msg.tokenRefreshed);
    else if (msg.system) this.onSystem(msg.system);
    else if (msg.appeared) this.onAppeared(msg.appeared);
    else if (msg.disappeared) this.onDisappeared(msg.disappeared);
    else if (msg.population) this.onPopulation(msg.population);
    else if (msg.found) this.onFound(msg.found);
    else if (msg.renumbered) this.onRenumbered(msg.renumbered);
    if (msg.motion.length > 0) this.onMotion(msg.motion);
  }

  /**
   * Renumbered: a member resumed its place through another node, whose
   * ids differ. The same Member object moves to its new id, motion and
   * interpolation included: nothing to see, no `left` and no `joined`.
   */
  onRenumbered(r) {
    if (this.state !== State.JOINED || r.oldId === r.newId) return;
    const m = this.members.get(r.oldId);
    if (!m) return;
    this.members.delete(r.oldId);
    m.id = r.newId;
    this.members.set(r.newId, m);
    if (this.memberId === r.oldId) this.memberId = r.newId;
    this.emit('renumbered', m, r.oldId);
  }

  onWelcome(w) {
    // A Welcome to a room left (or switched from) since: the Leave that
    // followed it has already been sent.
    if (!this.wanted || this.wanted.room !== w.room) return;
    const previous = this.me; // set when this is a rejoin after a reconnect
    const localNow = this.now();
    this.limits = { ...DEFAULT_LIMITS, ...(w.limits ?? {}) };
    this.population = w.population || (w.snapshot?.members.length ?? 0);
    this.applyLimits();
    this.checkServer(w.protocolRevision ?? 0, w.serverVersion ?? '');
    const snapshot = w.snapshot ?? { serverTimeMs: 0, members: [] };
    if (snapshot.serverTimeMs > 0) this.clock.rough(snapshot.serverTimeMs, localNow);
    this.memberId = w.memberId;
    this.room = w.room;
    this.tokenExpiresAtMs = w.tokenExpiresAtMs || null;
    this.resumeToken = w.resumeToken || null;
    this.replaceMembers(snapshot.members, this.members.size > 0);
    this.me = this.members.get(w.memberId) ?? null;
    if (!this.me) {
      // The snapshot should include you; stand at the centre if it did not.
      this.me = new Member(w.memberId, this.wanted?.name ?? '', { isSelf: true, tuning: this.tuning });
      this.me.reset(this.serverNow(), this.limits.worldWidth >> 1, this.limits.worldHeight >> 1);
      this.members.set(w.memberId, this.me);
    }
    this.me.isSelf = true;
    // Fresh budgets: the server starts each member with full buckets.
    this.moveTokens = this.limits.moveBurst;
    this.moveTokensAt = localNow;
    this.lastFreeMoveAt = -Infinity;
    this.chatTokens = this.limits.chatBurst;
    this.chatTokensAt = localNow;
    this.dataTokens = this.limits.dataBurst;
    this.dataTokensAt = localNow;
    this.pending = null;
    this.lastSentStand = null;
    this.attempt = 0;
    this.setState(State.JOINED);
    if (previous) this.restoreSelf(previous);
    this.emit('welcome', {
      room: this.room,
      me: this.me,
      members: this.members,
      limits: this.limits,
      rejoined: previous !== null,
      resumed: w.resumed === true,
    });
  }

  /**
   * Notes the server's version and revision; a server older than this SDK
   * is warned about once (per version), with a `compatibility` event.
   */
  checkServer(revision, version) {
    this.serverRevision = revision > 0 ? revision : 1;
    this.serverVersion = version || null;
    const info = compatibility(revision, version);
    const key = `${version}/${this.serverRevision}`;
    // Bounded: after 16 releases named, no more warnings.
    if (info === null || this.warnedServers.has(key) || this.warnedServers.size >= 16) return;
    this.warnedServers.add(key);
    this.warn(info.text);
    this.emit('compatibility', info);
  }

  /** After a reconnect: carry on from where you were, and tell the server. */
  restoreSelf(previous) {
    const now = this.serverNow();
    const at = previous.positionAt(now, { x: 0, y: 0 });
    const x = clamp(Math.round(at.x), 0, this.limits.worldWidth);
    const y = clamp(Math.round(at.y), 0, this.limits.worldHeight);
    const target = { x: 0, y: 0 };
    this.me.reset(now, x, y);
    const walking = previous.walkTargetAt(now, target);
    const speed = walking ? Math.min(previous.keyframes[previous.keyframes.length - 1].speed, this.limits.maxSpeed) : 0;
    if (walking && speed >= 1 && target.x <= this.limits.worldWidth && target.y <= this.limits.worldHeight) {
      this.walkTo(target.x, target.y, { speed });
    } else {
      this.moveTo(x, y);
    }
  }

  applyLimits() {
    const l = this.limits;
    this.renderDelayMs = this.renderDelayOption ?? defaultRenderDelay(l);
    this.tuning.maxInterpolationMs = Math.round(l.moveIntervalMs * 1.5 + l.tickMs);
  }

  /**
   * Replaces the members with a snapshot's. Members still there keep their
   * object; with `ease`, their jump to the snapshot's motion is eased. Your
   * own motion stays as predicted locally.
   */
  replaceMembers(list, ease) {
    const old = this.members;
    const next = new Map();
    const easeAt = ease ? this.renderTime() : null;
    for (const m of list) {
      const kept = old.get(m.id);
      if (kept && kept.name === m.name && kept.isSelf === (m.id === this.memberId)) {
        if (!kept.isSelf) {
          const p = m.position ?? { x: 0, y: 0 };
          kept.reset(m.movedAtMs, p.x, p.y, m.walk, easeAt);
        }
        kept.setData(m.data);
        kept.user = m.user ? m.user : null;
        next.set(m.id, kept);
      } else {
        next.set(m.id, Member.fromWire(m, { isSelf: m.id === this.memberId, tuning: this.tuning }));
      }
    }
    this.members = next;
  }

  onJoined(j) {
    if (this.state !== State.JOINED) return;
    if (!j.member || j.member.id === this.memberId) return;
    const m = Member.fromWire(j.member, { tuning: this.tuning });
    this.members.set(m.id, m);
    this.emit('joined', m);
  }

  /** Spatial rooms: members that came into view (not arrivals: no `joined`). */
  onAppeared(a) {
    if (this.state !== State.JOINED) return;
    for (const wire of a.members) {
      if (wire.id === this.memberId) continue;
      const m = Member.fromWire(wire, { tuning: this.tuning });
      this.members.set(m.id, m);
      this.emit('appeared', m);
    }
  }

  /** Spatial rooms: members that went out of view (not departures: no `left`). */
  onDisappeared(d) {
    if (this.state !== State.JOINED) return;
    for (const id of d.memberIds) {
      const m = id === this.memberId ? undefined : this.members.get(id);
      if (!m) continue;
      this.members.delete(id);
      this.emit('disappeared', m);
    }
  }

  onFound(f) {
    if (this.state !== State.JOINED) return;
    this.emit('found', {
      prefix: f.prefix,
      members: f.members.map((w) => Member.fromWire(w, { tuning: this.tuning })),
      nextCursor: f.nextCursor,
      total: f.total,
    });
  }

  onPopulation(p) {
    if (this.state !== State.JOINED) return;
    this.population = p.members;
    this.emit('population', p.members);
  }

  onLeft(l) {
    if (this.state !== State.JOINED) return;
    if (l.memberId === this.memberId) return;
    const m = this.members.get(l.memberId);
    if (!m) return;
    this.members.delete(l.memberId);
    this.emit('left', m, l.reason);
  }

  onChat(c) {
    if (this.state !== State.JOINED) return;
    this.emit('chat', {
      member: this.members.get(c.memberId) ?? null,
      memberId: c.memberId,
      text: c.text,
      serverTimeMs: c.serverTimeMs,
    });
  }

  onSystem(m) {
    if (this.state !== State.JOINED) return;
    this.emit('system', { text: m.text, serverTimeMs: m.serverTimeMs, direct: m.direct });
  }

  onMemberData(d) {
    if (this.state !== State.JOINED) return;
    const m = this.members.get(d.memberId);
    if (!m) return;
    const previous = m.data;
    m.setData(d.data);
    this.emit('data', m, previous);
  }

  onPong(p) {
    this.rttMs = this.clock.sample(p.clientTimeMs, p.serverTimeMs, this.now());
    this.emit('pong', this.rttMs);
  }

  onError(e) {
    const info = { code: e.code, message: e.message, text: explainError(e.code, e.message), refused: false };
    if (e.code === ErrorCode.RATE_LIMITED) {
      info.retryInMs = retryAfterMs(e.message);
      const dataDropped = e.message.startsWith('data budget');
      if (info.retryInMs !== null && this.state === State.JOINED && !dataDropped) {
        // A chat the server dropped: wait as long as it says.
        const interval = this.limits.chatIntervalMs + PACING_SLACK_MS;
        this.chatTokens = Math.min(1 - this.chatWaitMs() / interval, 1 - info.retryInMs / interval);
        this.chatTokensAt = this.now();
      }
    }
    // Joined, a refused token is a RefreshToken's: the session goes on
    // (to the old expiry), and a later drop is still retried.
    if ((e.code === ErrorCode.UNAUTHENTICATED || e.code === ErrorCode.FORBIDDEN) && this.state === State.JOINED) {
      info.refresh = true;
    }
    this.lastError = info;
    if (REFUSALS.has(e.code) && this.state === State.JOINING) {
      // Refused: not worth retrying by itself; the socket stays open.
      info.refused = true;
      this.wanted = null;
      this.clearRoom();
      this.setState(State.OPEN);
    }
    this.emit('error', info);
  }

  onResync(snapshot) {
    if (this.state !== State.JOINED) return;
    this.replaceMembers(snapshot.members, true);
    if (this.me && !this.members.has(this.me.id)) this.members.set(this.me.id, this.me);
    this.emit('resync', this.members);
  }

  onMotion(motion) {
    if (this.state !== State.JOINED) return;
    const time = resolveMotionTime(motion[0], this.limits.motionTimeUnitMs, this.serverNow());
    const easeAt = this.renderTime();
    const walk = scratchWalk;
    let i = 1;
    while (i < motion.length) {
      const head = motion[i];
      const len = motionRecordLength(head);
      if (i + len > motion.length) {
        const err = new MotionError('motion record truncated');
        this.emit('error', { code: null, message: err.message, text: 'Received a damaged movement batch.', refused: false });
        return;
      }
      const id = head >>> 1;
      const member = id === this.memberId ? null : this.members.get(id);
      if (member) {
        let w = null;
        if (len === 6) {
          walk.target.x = motion[i + 3];
          walk.target.y = motion[i + 4];
          walk.speed = motion[i + 5];
          w = walk;
        }
        member.update(time, motion[i + 1], motion[i + 2], w, easeAt);
        this.stats.motionUpdatesIn++;
        this.emit('moved', member);
      }
      i += len;
    }
  }
}

const scratchWalk = { target: { x: 0, y: 0 }, speed: 0 };

/** Render others this far in the past: one move interval, one tick, and jitter room. */
export function defaultRenderDelay(limits) {
  return limits.moveIntervalMs + limits.tickMs + JITTER_MARGIN_MS;
}

/** Why a connection closed, in a sentence; `opened` false when it never opened. */
function closeReason(code, error, opened) {
  if (error) return explainError(error.code, error.message);
  if (!opened) return "Can't reach the server.";
  if (code === 1001) return 'The server went away.';
  if (code === 1013) return 'The server is busy.';
  if (code === CLOSE_REPLACED) return explainError(ErrorCode.REPLACED);
  if (code === CLOSE_TOKEN_EXPIRED) return explainError(ErrorCode.TOKEN_EXPIRED);
  if (code === CLOSE_KICKED) return explainError(ErrorCode.KICKED);
  if (code === CLOSE_BANNED) return explainError(ErrorCode.BANNED);
  if (code === CLOSE_ROOM_CLOSED) return explainError(ErrorCode.ROOM_CLOSED);
  if (code === 1000) return 'The server closed the connection.';
  return 'The connection was lost.';
}

function closeText(code, error, retryInMs, opened = true) {
  const why = closeReason(code, error, opened);
  if (retryInMs === null) return why;
  return `${why} Reconnecting in ${waitText(retryInMs)}…`;
}

/** A wait as people read it: "0.3 s" under 10 s (one decimal), else whole seconds. */
export function waitText(ms) {
  const s = Math.max(0, ms) / 1000;
  return s < 10 ? `${(Math.round(s * 10) / 10).toFixed(1)} s` : `${Math.round(s)} s`;
}

function detach(ws) {
  ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
}

function clamp(v, lo, hi) {
  return v < lo ? lo : v > hi ? hi : v;
}
