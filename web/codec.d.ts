// Types of codec.js: the amble.v1 wire format. Written by hand for the
// public API; web/test/types/usage.ts is checked against them with
// `tsc --noEmit --strict` (tests/it/node_sdk.rs). Messages have the shape of
// web/test/vectors.json: camelCase fields, a oneof flattened to the name of
// the field that is set, absent sub-messages null, enums as numbers.

/** FNV-1a 64 (hex) of the proto/amble/v1/amble.proto this codec was written for. */
export declare const SCHEMA_FNV1A64: string;
/** The WebSocket subprotocol: "amble.v1". */
export declare const SUBPROTOCOL: 'amble.v1';
/** The revision of amble.v1 this codec speaks (docs/protocol.md, "Compatibility"). */
export declare const PROTOCOL_REVISION: number;
/** Motion batch times are truncated to 7 bits: 128. */
export declare const MOTION_TIME_MODULUS: number;

/** `amble.v1.ErrorCode`: what an Error from the server is about. */
export declare const ErrorCode: Readonly<{
  UNSPECIFIED: 0;
  MALFORMED: 1;
  UNKNOWN_MESSAGE: 2;
  NOT_JOINED: 3;
  ALREADY_JOINED: 4;
  INVALID_NAME: 5;
  INVALID_ROOM: 6;
  INVALID_POSITION: 7;
  INVALID_SPEED: 8;
  INVALID_CHAT: 9;
  RATE_LIMITED: 10;
  FLOOD: 11;
  ROOM_FULL: 12;
  SERVER_FULL: 13;
  TOO_BIG: 14;
  TEXT_FRAME: 15;
  SHUTTING_DOWN: 16;
  UNAUTHENTICATED: 17;
  FORBIDDEN: 18;
  REPLACED: 19;
  INVALID_DATA: 20;
  TOKEN_EXPIRED: 21;
  KICKED: 22;
  BANNED: 23;
  MUTED: 24;
  ROOM_CLOSED: 25;
}>;
/** A code the server may send (a newer server may send one this SDK does not name). */
export type ErrorCodeValue = number;

/** `amble.v1.LeaveReason`: why a member left. */
export declare const LeaveReason: Readonly<{
  UNSPECIFIED: 0;
  LEFT: 1;
  DISCONNECTED: 2;
  TIMED_OUT: 3;
  KICKED: 4;
  SHUTDOWN: 5;
  REPLACED: 6;
  SERVER_LOST: 7;
  ROOM_CLOSED: 8;
}>;
export type LeaveReasonValue = number;

/** Bytes that are not a valid amble.v1 message. */
export declare class DecodeError extends Error {
  constructor(message: string);
}
/** A motion batch that breaks its layout. */
export declare class MotionError extends Error {
  constructor(message: string);
}

/** A point in the world, in whole centimetres from the top-left corner. */
export interface Position {
  x: number;
  y: number;
}
/** A straight walk to `target` at `speed` cm/s. */
export interface Walk {
  target: Position | null;
  speed: number;
}
/** What `checkPosition`, `checkSpeed` and the encoders check against (the server's Limits have these). */
export interface Bounds {
  worldWidth: number;
  worldHeight: number;
  maxSpeed: number;
}

/** `amble.v1.Limits`, camelCase: the server's settings, sent in Welcome. */
export interface Limits {
  moveIntervalMs: number;
  moveBurst: number;
  tickMs: number;
  motionTimeUnitMs: number;
  worldWidth: number;
  worldHeight: number;
  maxSpeed: number;
  maxMessageBytes: number;
  maxNameChars: number;
  maxChatChars: number;
  roomCapacity: number;
  chatIntervalMs: number;
  chatBurst: number;
  /** Member data: at most this many entries, keys and values together at most maxDataBytes (UTF-8). */
  maxDataEntries: number;
  maxDataBytes: number;
  /** A value's length in characters. */
  maxDataValueChars: number;
  /** SetData budget: dataBurst changes, refilled one per dataIntervalMs. */
  dataIntervalMs: number;
  dataBurst: number;
  /** How long a dropped member's place is held for a resume, ms (0: never; before revision 4: 0). */
  resumeGraceMs: number;
  /** A spatial room's interest radius, cm (0: a plain room; before revision 5: 0). */
  interestRadius: number;
  /** A spatial room's grid: a cell's side, and how far past it a member's cell changes, cm. */
  interestCell: number;
  interestMargin: number;
}

/** One entry of a member's data (`amble.v1.DataEntry`); members carry them sorted by key. */
export interface DataEntry {
  key: string;
  value: string;
}

/** `amble.v1.Member`: a member in a snapshot or a Joined. */
export interface WireMember {
  id: number;
  name: string;
  position: Position | null;
  walk: Walk | null;
  /** The server time (ms since the epoch) `position` applies to. */
  movedAtMs: number;
  /** The app's data, sorted by key. */
  data: DataEntry[];
  /** The token's `sub` when the token's `share_sub` claim allows it, else ''. */
  user: string;
}
export interface Snapshot {
  serverTimeMs: number;
  members: WireMember[];
}

// ------------------------------------------------------------- client → server

export interface Join {
  room: string;
  name: string;
  token: string;
  /** Where to appear (cm), or null for the server's spawn rule. */
  start: Position | null;
  /** An earlier Welcome's resumeToken, to get that held place back ('' for a fresh join). */
  resumeToken: string;
  /** The member's data at the start (a token's `data` claim wins). */
  data: DataEntry[];
}
export interface Move {
  position: Position | null;
  walk: Walk | null;
  seq: number;
  clientTimeMs: number;
}
export interface SendChat {
  text: string;
}
export interface Ping {
  clientTimeMs: number;
}
export type Leave = Record<string, never>;
/** Entries to set; an empty value removes its key. */
export interface SetData {
  data: DataEntry[];
}

/** A fresh token for the member's session (protocol revision 3). */
export interface RefreshToken {
  token: string;
}

/** A decoded ClientMessage: exactly one body. When encoding, fields left out are their defaults. */
export type ClientMessage =
  | { join: Join }
  | { move: Move }
  | { chat: SendChat }
  | { ping: Ping }
  | { leave: Leave }
  | { setData: SetData }
  | { refresh: RefreshToken };

/** What `encodeClientMessage` takes: a body whose fields may be left out (then their default). */
export type ClientMessageInput =
  | { join: Partial<Join> }
  | { move: Partial<Move> }
  | { chat: Partial<SendChat> }
  | { ping: Partial<Ping> }
  | { leave: Leave }
  | { setData: Partial<SetData> }
  | { refresh: Partial<RefreshToken> };

// ------------------------------------------------------------- server → client

export interface Welcome {
  memberId: number;
  room: string;
  limits: Limits | null;
  snapshot: Snapshot | null;
  /** The server's release ('' from a server before protocol revision 2). */
  serverVersion: string;
  /** The protocol revision the server speaks (0 from a server before revision 2: read it as 1). */
  protocolRevision: number;
  /** When the member's token expires, ms since the Unix epoch (0 without a token or keys, or before revision 3). */
  tokenExpiresAtMs: number;
  /** Send as Join.resumeToken to get this place back after a drop ('' when places are not held). */
  resumeToken: string;
  /** This Welcome gave back a held place (revision 4). */
  resumed: boolean;
  /** Members in the room, you included (revision 5; in a spatial room the snapshot holds only those in view). */
  population: number;
}
export interface Joined {
  member: WireMember | null;
}
export interface Left {
  memberId: number;
  reason: LeaveReasonValue;
}
export interface ChatMessage {
  memberId: number;
  text: string;
  serverTimeMs: number;
}
export interface Pong {
  clientTimeMs: number;
  serverTimeMs: number;
}
/** A member's whole data after a change. */
export interface MemberData {
  memberId: number;
  data: DataEntry[];
}
/** The member's token expires at `expiresAtMs`: send RefreshToken before then. */
export interface TokenExpiring {
  expiresAtMs: number;
}
/** A RefreshToken was accepted: the session ends at `expiresAtMs` now (0: never). */
export interface TokenRefreshed {
  expiresAtMs: number;
}
/** A message from the app (its backend), not from a member (revision 4). */
export interface SystemMessage {
  text: string;
  serverTimeMs: number;
  /** To this member's user alone, not to the whole room. */
  direct: boolean;
}
/** A member's id changed (it resumed through another node): the same member (revision 4). */
export interface Renumbered {
  oldId: number;
  newId: number;
}
/** Spatial rooms (revision 5): members that came into view, each with its whole state. Not a Joined. */
export interface Appeared {
  members: WireMember[];
}
/** Spatial rooms (revision 5): members that went out of view. Not a Left: they are still in the room. */
export interface Disappeared {
  memberIds: number[];
}
/** The room's member count changed (revision 5; at most one a second). */
export interface Population {
  members: number;
}
export interface ServerError {
  code: ErrorCodeValue;
  message: string;
}

/** A decoded ServerMessage: at most one body, and the packed motion batch (empty when none). */
export interface ServerMessage {
  welcome?: Welcome;
  joined?: Joined;
  left?: Left;
  chat?: ChatMessage;
  pong?: Pong;
  error?: ServerError;
  resync?: Snapshot;
  memberData?: MemberData;
  tokenExpiring?: TokenExpiring;
  tokenRefreshed?: TokenRefreshed;
  system?: SystemMessage;
  renumbered?: Renumbered;
  appeared?: Appeared;
  disappeared?: Disappeared;
  population?: Population;
  motion: number[];
}

/** One record of a motion batch, as `decodeMotion` returns it. */
export interface MotionRecord {
  memberId: number;
  x: number;
  y: number;
  walk: { target: Position; speed: number } | null;
}

/** Throws a RangeError for a position that is not whole cm within `bounds` (when given). */
export declare function checkPosition(x: number, y: number, bounds?: Bounds | null, field?: string): void;
/** Throws a RangeError for a speed outside 1..=bounds.maxSpeed (when given). */
export declare function checkSpeed(speed: number, bounds?: Bounds | null, field?: string): void;

/** Encodes a ClientMessage; with `bounds`, a Move's position and speed are checked against them. */
export declare function encodeClientMessage(msg: ClientMessageInput, bounds?: Bounds | null): Uint8Array;
/** Decodes a ClientMessage; throws a DecodeError for bytes that are not one. */
export declare function decodeClientMessage(bytes: Uint8Array | ArrayBuffer | DataView): ClientMessage;
/** Encodes a ServerMessage (for tests and tools: a server speaks it). */
export declare function encodeServerMessage(msg: Partial<ServerMessage>): Uint8Array;
/** Decodes a ServerMessage; throws a DecodeError for bytes that are not one. */
export declare function decodeServerMessage(bytes: Uint8Array | ArrayBuffer | DataView): ServerMessage;

/** Truncates a server time to the 7-bit motion time, in units of `unitMs`. */
export declare function motionTime(serverTimeMs: number, unitMs: number): number;
/** The full server time (ms) a truncated motion time stands for, nearest `estimateMs`. */
export declare function resolveMotionTime(truncated: number, unitMs: number, estimateMs: number): number;
/** How many numbers the motion record with this head takes: 3 standing, 6 walking. */
export declare function motionRecordLength(head: number): number;
/** Splits a motion batch; throws a MotionError for an empty batch or a truncated record. */
export declare function decodeMotion(motion: ArrayLike<number>): { time: number; records: MotionRecord[] };
/** Builds a motion batch from a time and records shaped as decodeMotion returns them. */
export declare function encodeMotion(time: number, records: MotionRecord[]): number[];
/** The RFC 6455 header bytes of one unfragmented frame of `payloadBytes`. */
export declare function websocketHeaderBytes(payloadBytes: number, masked: boolean): number;
