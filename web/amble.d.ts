// Types of amble.js, the amble client SDK. Written by hand for its public
// API, as docs/client.md documents it; web/test/types/usage.ts is checked
// against them with `tsc --noEmit --strict` (tests/it/node_sdk.rs). They need
// no DOM types, so they serve a page and a Node program alike.

import type { Limits, Position } from './codec.js';
import type { Member } from './member.js';

export { ErrorCode, LeaveReason, PROTOCOL_REVISION, SUBPROTOCOL } from './codec.js';
export type { Limits, Position } from './codec.js';
export { Member } from './member.js';

/** This SDK's version (the package's). */
export declare const VERSION: string;

/** What each protocol revision after the first added, by revision. */
export declare const REVISION_FEATURES: Readonly<Record<number, readonly string[]>>;

/** A server speaking an older protocol revision than this SDK: what it may lack. */
export interface Compatibility {
  /** The server's release, null when it did not say (before revision 2). */
  serverVersion: string | null;
  serverRevision: number;
  sdkVersion: string;
  sdkRevision: number;
  /** What the revisions between the server's and the SDK's added. */
  missing: string[];
  /** A sentence naming both versions and what may be missing. */
  text: string;
}

/** Null when a server at `serverRevision` speaks this SDK's revision or a newer one. */
export declare function compatibility(serverRevision: number, serverVersion?: string): Compatibility | null;

/** Connection states, in `client.state` and the `state` event. */
export declare const State: Readonly<{
  IDLE: 'idle';
  CONNECTING: 'connecting';
  OPEN: 'open';
  JOINING: 'joining';
  JOINED: 'joined';
  RECONNECTING: 'reconnecting';
  CLOSED: 'closed';
}>;
export type StateValue = (typeof State)[keyof typeof State];

/** Reconnect backoff: min(maxDelayMs, initialDelayMs × factor^attempt), less up to `jitter` of it. */
export interface ReconnectPolicy {
  initialDelayMs: number;
  maxDelayMs: number;
  factor: number;
  jitter: number;
}
export declare const DEFAULT_RECONNECT: Readonly<ReconnectPolicy>;
/** The delay (ms) before reconnect attempt `attempt` (0 for the first retry). */
export declare function backoffDelay(attempt: number, policy?: ReconnectPolicy, random?: () => number): number;

/** The limits assumed until the server's Welcome says otherwise (the server's defaults). */
export declare const DEFAULT_LIMITS: Readonly<Limits>;
/** How far in the past others are drawn by default: one move interval, one tick and 100 ms. */
export declare function defaultRenderDelay(limits: Limits): number;

/** Server time from Ping/Pong, slewed so that it never jumps or goes back. */
export declare class ServerClock {
  constructor(options?: { window?: number; slew?: number; snapMs?: number });
  /** Server time minus local time (ms), the newest estimate; null until known. */
  offsetMs: number | null;
  /** The newest Pong's round trip (ms); null until the first. */
  rttMs: number | null;
  rough(serverTimeMs: number, localMs: number): void;
  sample(sentMs: number, serverTimeMs: number, localMs: number): number;
  /** Server time at local time `localMs`; null while unknown. */
  now(localMs: number): number | null;
  reset(): void;
}

/** Why `text` breaks the rule for names and chat ('empty', 'blank' or a phrase), or null. */
export declare function textProblem(text: string, maxChars: number): string | null;
/** Why the server would refuse `name` (INVALID_NAME), or null. */
export declare function nameProblem(name: string, maxChars?: number): string | null;
/** Why the server would refuse `room` (INVALID_ROOM), or null. */
export declare function roomProblem(room: string, maxChars?: number): string | null;
/**
 * Why member data would be refused (INVALID_DATA), or null: `data` is key → value; with
 * `removals`, '' or null removes a key (setData).
 */
export declare function dataProblem(
  data: Record<string, string | null>,
  limits?: Partial<Limits>,
  options?: { removals?: boolean },
): string | null;
/** Why the server would refuse chat `text` (INVALID_CHAT), or null. */
export declare function chatProblem(text: string, maxChars?: number): string | null;
/** A sentence for a person about an Error code from the server. */
export declare function explainError(code: number, serverMessage?: string): string;
/** The wait (ms) a RATE_LIMITED message names, or null. */
export declare function retryAfterMs(serverMessage: string | null | undefined): number | null;
/** A wait as people read it: "0.3 s" under 10 s, else whole seconds. */
export declare function waitText(ms: number): string;

/**
 * What the client needs of a WebSocket: the browser's, Node's (22, or 20
 * with --experimental-websocket), or any other with the same shape. The
 * client sets its onopen, onmessage, onclose and onerror itself.
 */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  readonly extensions?: string;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketClass = new (url: string, protocols?: string | string[]) => WebSocketLike;

export interface AmbleClientOptions {
  /** The server's WebSocket endpoint, or several (a cluster's nodes); required outside a browser. */
  url?: string | readonly string[];
  /** The same as an array (give `url` or `urls`, not both). */
  urls?: readonly string[];
  /** cm/s for walkTo when no speed is given (capped at limits.maxSpeed); 300. */
  walkSpeed?: number;
  /** How far in the past others are drawn (ms); from the limits by default. */
  renderDelayMs?: number;
  /** How long a late free mover keeps going past its last update (ms); 200. */
  maxExtrapolationMs?: number;
  /** How long a jump takes to ease out (ms); 400. */
  easeMs?: number;
  /**
   * In a browser: leave the room and close the socket on `pagehide`, rejoin
   * on `pageshow` from the back/forward cache; true.
   */
  pageLifecycle?: boolean;
  /** Where the pagehide/pageshow listeners go (globalThis in a browser). */
  pageTarget?: {
    addEventListener(type: string, listener: (event: { persisted?: boolean }) => void): void;
    removeEventListener(type: string, listener: (event: { persisted?: boolean }) => void): void;
  };
  /** Ping period (ms): clock sync, round trip, keepalive; 2000. */
  pingIntervalMs?: number;
  /** The backoff (any part of it), or false for no reconnect. */
  reconnect?: Partial<ReconnectPolicy> | false;
  /** A signed token (JWT) sent in every Join. */
  token?: string;
  /**
   * Asked for a fresh token before every Join (so again on each reconnect), and with
   * `refresh: true` when the server says the member's token is about to expire (sent as
   * RefreshToken).
   */
  getToken?: (wanted: { room: string; name: string; refresh?: boolean }) => string | Promise<string>;
  /** The WebSocket class (the global one by default). */
  WebSocket?: WebSocketClass;
  /** A monotonic millisecond clock (performance.now by default). */
  now?: () => number;
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (id: any) => void;
  random?: () => number;
  /** Where exceptions thrown by event handlers go (reportError by default). */
  reportError?: (err: unknown) => void;
  /** Where the one warning about a server older than the SDK goes (console.warn by default). */
  warn?: (text: string) => void;
}

/** An Error from the server, or a failed getToken (code null). */
export interface ErrorInfo {
  code: number | null;
  message: string;
  /** A sentence for a person. */
  text: string;
  /** True when it refused a Join (the socket stays open). */
  refused: boolean;
  /** RATE_LIMITED: the wait the server named, or null. */
  retryInMs?: number | null;
  /** True when it is about a token refresh (refused, or getToken failing): the room stays. */
  refresh?: boolean;
}

/** The server's TokenExpiring: `refreshing` when getToken is being asked for a fresh token. */
export interface TokenExpiringInfo {
  expiresAtMs: number;
  refreshing: boolean;
}

/** The server took a refreshed token: the session ends at `expiresAtMs` now (0: never). */
export interface TokenRefreshedInfo {
  expiresAtMs: number;
}

export interface CloseInfo {
  code: number;
  reason: string;
  error: ErrorInfo | null;
  willReconnect: boolean;
  retryInMs: number | null;
  /** The server this connection was to, and the one the retry goes to (null: none). */
  url: string | null;
  nextUrl: string | null;
  /** False when the socket never opened: the server could not be reached. */
  opened?: boolean;
  /** Why, and whether it retries, in a sentence. */
  text: string;
}

export interface WelcomeInfo {
  room: string;
  me: Member;
  members: Map<number, Member>;
  limits: Limits;
  /** True after a reconnect. */
  rejoined: boolean;
  /** True when the server gave back the place it held since the drop: the others saw nothing (revision 4). */
  resumed: boolean;
}

export interface ChatInfo {
  /** Null when the member has left. */
  member: Member | null;
  memberId: number;
  text: string;
  serverTimeMs: number;
}

/** A message from the app that hosts the world, not from a member (protocol revision 4). */
export interface SystemInfo {
  text: string;
  serverTimeMs: number;
  /** For you alone, not the whole room. */
  direct: boolean;
}

/** The answer to `find`. */
export interface FoundInfo {
  prefix: string;
  /** Matches by id, with their positions (members out of view included). */
  members: Member[];
  /** Pass as `cursor` for the next page; 0 on the last. */
  nextCursor: number;
  /** Matches in all (counted up to 1,000). */
  total: number;
}

/** The events of `client.on(type, fn)` and their handlers. */
export interface AmbleEvents {
  state: (state: StateValue, previous: StateValue) => void;
  welcome: (info: WelcomeInfo) => void;
  joined: (member: Member) => void;
  left: (member: Member, reason: number) => void;
  moved: (member: Member) => void;
  /** A member's data changed (yours too, once the server applied it); `previous` is the data before. */
  data: (member: Member, previous: Readonly<Record<string, string>>) => void;
  chat: (info: ChatInfo) => void;
  system: (info: SystemInfo) => void;
  /** Spatial rooms: someone came into your view (not an arrival). */
  appeared: (member: Member) => void;
  /** Spatial rooms: someone went out of your view (still in the room). */
  disappeared: (member: Member) => void;
  /** Spatial rooms: the room's member count changed (at most once a second). */
  population: (members: number) => void;
  /** The answer to `find`: a page of the members whose name starts with `prefix`. */
  found: (info: FoundInfo) => void;
  resync: (members: Map<number, Member>) => void;
  /** A member's id changed (it resumed its place through another node): the same member, now `member.id`; no `left`, no `joined`. */
  renumbered: (member: Member, oldId: number) => void;
  pong: (rttMs: number) => void;
  error: (info: ErrorInfo) => void;
  closed: (info: CloseInfo) => void;
  compatibility: (info: Compatibility) => void;
  tokenExpiring: (info: TokenExpiringInfo) => void;
  tokenRefreshed: (info: TokenRefreshedInfo) => void;
}

/** The counters in `client.stats`, all measured. */
export interface Stats {
  framesIn: number;
  framesOut: number;
  bytesIn: number;
  bytesOut: number;
  wireBytesIn: number;
  wireBytesOut: number;
  motionUpdatesIn: number;
  movesOut: number;
  chatsOut: number;
  undecodable: number;
  extensions: string;
}

/** One connection to an amble server, in at most one room at a time. */
export declare class AmbleClient {
  constructor(options?: AmbleClientOptions);
  /** The servers to connect to, in order (frozen). */
  readonly urls: readonly string[];
  /** The server in use, or tried next; setting it replaces the list with that one. */
  get url(): string;
  set url(value: string);
  readonly state: StateValue;
  readonly room: string | null;
  readonly memberId: number | null;
  /** Your own member (its motion predicted locally); null outside a room. */
  readonly me: Member | null;
  /** The room's members by id, you included. */
  readonly members: Map<number, Member>;
  /** Members in the room, you included (in a spatial room, in view or not); 0 outside one. */
  readonly population: number;
  /** The server's limits (the defaults until a Welcome). */
  readonly limits: Limits;
  readonly rttMs: number | null;
  readonly renderDelayMs: number;
  readonly clock: ServerClock;
  readonly lastError: ErrorInfo | null;
  readonly lastClose: CloseInfo | null;
  readonly stats: Stats;
  /** The server's release and protocol revision, from its newest Welcome; null before. */
  readonly serverVersion: string | null;
  readonly serverRevision: number | null;
  /** When the member's token expires (ms since the epoch, server time); null without one. */
  readonly tokenExpiresAtMs: number | null;
  /** The newest Welcome's resume token, sent with the Join of every reconnect and failover to the room; null without one. */
  readonly resumeToken: string | null;
  walkSpeed: number;
  token: string | null;
  getToken: AmbleClientOptions['getToken'] | null;

  /** Opens the connection, and keeps reopening it until close(). */
  connect(): this;
  /** Joins `room` as `name`; throws a RangeError for a name or room the server would refuse. */
  join(
    room: string,
    name?: string,
    options?: { start?: Position | null; data?: Record<string, string> | null },
  ): this;
  /** Leaves the room; the connection stays open. */
  leave(): void;
  /** Closes for good. */
  close(): void;
  /**
   * While `reconnecting` and waiting out the backoff: the next attempt now.
   * False, doing nothing, when no attempt is waiting.
   */
  reconnectNow(): boolean;
  /** Click-to-move: one message for a straight walk to (x, y) cm. */
  walkTo(x: number, y: number, options?: { speed?: number }): void;
  /** Free movement: you stand at (x, y) cm now; sent at most once per move interval. */
  moveTo(x: number, y: number): void;
  /** Sends a chat message; false, sending nothing, when the chat budget is spent. */
  chat(text: string): boolean;
  /**
   * Sets entries of your member data (a value of '' or null removes the key); throws a
   * RangeError for entries the server would refuse. False, sending nothing, when the data
   * budget is spent.
   */
  /** Finds room members by name prefix (answered by a `found` event); false outside a room. */
  find(prefix?: string, options?: { cursor?: number }): boolean;
  setData(changes: Record<string, string | null>): boolean;
  /** How long (ms) until chat() may send again. */
  chatWaitMs(): number;
  /** The estimated server time (ms since the epoch) at local time `localMs` (now). */
  serverNow(localMs?: number): number;
  /** The time to pass to member.positionAt: server time, less the render delay for others. */
  renderTime(member?: Member | null, localMs?: number): number;
  /** Subscribes `fn` to `type`; returns the function that unsubscribes it. */
  on<K extends keyof AmbleEvents>(type: K, fn: AmbleEvents[K]): () => void;
}
