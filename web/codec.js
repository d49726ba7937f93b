// The amble.v1 wire format, hand-written for exactly the messages in
// proto/amble/v1/amble.proto: encoders and decoders for ClientMessage and
// ServerMessage, the packed motion batch, and the motion-time wrap.
//
// Decoded messages have the shape of the shared vectors (web/test/vectors.json):
// camelCase fields, the oneof flattened to its field name (absent when
// unset), absent sub-messages `null`, every scalar present (0 or ''), enums
// as numbers, uint64 as Numbers. Encoding follows proto3: fields in
// ascending order, default scalars not written, a present sub-message
// written even when empty, `motion` packed.
//
// No I/O and no clock here.

/**
 * FNV-1a 64 of the proto/amble/v1/amble.proto this codec was written for.
 * web/test/vectors.json records the same hash of the schema it was made
 * from; the codec test fails when the two differ, so a schema change cannot
 * slip past this hand-written codec.
 */
export const SCHEMA_FNV1A64 = '0ca8512417c288d8';

/** The WebSocket subprotocol. */
export const SUBPROTOCOL = 'amble.v1';

/**
 * The revision of amble.v1 this codec speaks (docs/protocol.md,
 * "Compatibility"): 1 the original schema; 2 added Join.start, member data
 * and Welcome.serverVersion / Welcome.protocolRevision; 3 token expiry
 * and refresh (RefreshToken, TokenExpiring, TokenRefreshed,
 * Welcome.tokenExpiresAtMs, TOKEN_EXPIRED); 4 the app's side
 * (SystemMessage, KICKED, BANNED, MUTED, ROOM_CLOSED, LeaveReason.ROOM_CLOSED)
 * and held places (Join.resumeToken, Welcome.resumeToken, Welcome.resumed,
 * Limits.resumeGraceMs, Renumbered); 5 spatial rooms (Appeared,
 * Disappeared, Population, Welcome.population, Limits.interestRadius,
 * interestCell, interestMargin). The server sends
 * its own in every Welcome; web/test/vectors.json records the server's,
 * and the codec test checks that the two agree.
 */
export const PROTOCOL_REVISION = 5;

/** Motion batch times are truncated to 7 bits (one varint byte). */
export const MOTION_TIME_MODULUS = 128;

/** Error codes of `amble.v1.Error` (see the proto for what each means). */
export const ErrorCode = Object.freeze({
  UNSPECIFIED: 0,
  MALFORMED: 1,
  UNKNOWN_MESSAGE: 2,
  NOT_JOINED: 3,
  ALREADY_JOINED: 4,
  INVALID_NAME: 5,
  INVALID_ROOM: 6,
  INVALID_POSITION: 7,
  INVALID_SPEED: 8,
  INVALID_CHAT: 9,
  RATE_LIMITED: 10,
  FLOOD: 11,
  ROOM_FULL: 12,
  SERVER_FULL: 13,
  TOO_BIG: 14,
  TEXT_FRAME: 15,
  SHUTTING_DOWN: 16,
  UNAUTHENTICATED: 17,
  FORBIDDEN: 18,
  REPLACED: 19,
  INVALID_DATA: 20,
  TOKEN_EXPIRED: 21,
  KICKED: 22,
  BANNED: 23,
  MUTED: 24,
  ROOM_CLOSED: 25,
});

/** Why a member left (`amble.v1.LeaveReason`). */
export const LeaveReason = Object.freeze({
  UNSPECIFIED: 0,
  LEFT: 1,
  DISCONNECTED: 2,
  TIMED_OUT: 3,
  KICKED: 4,
  SHUTDOWN: 5,
  REPLACED: 6,
  SERVER_LOST: 7,
  ROOM_CLOSED: 8,
});

const U32_MAX = 0xffff_ffff;

/** Bytes that are not a valid amble.v1 message. */
export class DecodeError extends Error {
  constructor(message) {
    super(message);
    this.name = 'DecodeError';
  }
}

// ------------------------------------------------------------------ checks

/**
 * Checks that `value` can be written as a uint32 and returns it.
 * `null`/`undefined` mean the default, 0. Anything else that is not an
 * integer in 0..=4294967295 (NaN, ±Infinity, negatives, fractions) throws a
 * RangeError naming the field.
 */
function u32(value, field) {
  if (value === undefined || value === null) return 0;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > U32_MAX) {
    throw new RangeError(`${field} must be an integer in 0..=${U32_MAX}, got ${describe(value)}`);
  }
  return value;
}

/** As `u32`, for uint64 fields held as Numbers: 0..=2^53-1. */
function u64(value, field) {
  if (value === undefined || value === null) return 0;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(
      `${field} must be an integer in 0..=${Number.MAX_SAFE_INTEGER}, got ${describe(value)}`,
    );
  }
  return value;
}

function bool(value, field) {
  if (value === undefined || value === null) return 0;
  if (typeof value !== 'boolean') {
    throw new TypeError(`${field} must be a boolean, got ${describe(value)}`);
  }
  return value ? 1 : 0;
}

function str(value, field) {
  if (value === undefined || value === null) return '';
  if (typeof value !== 'string') {
    throw new TypeError(`${field} must be a string, got ${describe(value)}`);
  }
  return value;
}

function describe(value) {
  if (typeof value === 'number') return String(value);
  if (typeof value === 'string') return JSON.stringify(value);
  return typeof value;
}

/**
 * Checks a position in centimetres against the world bounds and returns it
 * unchanged. Throws a RangeError for NaN, ±Infinity, fractions, negatives,
 * or a coordinate beyond `bounds.worldWidth` / `bounds.worldHeight`.
 */
export function checkPosition(x, y, bounds, field = 'position') {
  if (x === undefined || x === null || y === undefined || y === null) {
    throw new RangeError(`${field} needs both x and y`);
  }
  u32(x, `${field}.x`);
  u32(y, `${field}.y`);
  if (bounds) {
    if (x > bounds.worldWidth) {
      throw new RangeError(`${field}.x must be within 0..=${bounds.worldWidth} cm, got ${x}`);
    }
    if (y > bounds.worldHeight) {
      throw new RangeError(`${field}.y must be within 0..=${bounds.worldHeight} cm, got ${y}`);
    }
  }
}

/** Checks a walk speed (cm/s): an integer in 1..=bounds.maxSpeed. */
export function checkSpeed(speed, bounds, field = 'walk.speed') {
  u32(speed, field);
  if (bounds && (speed === undefined || speed === null || speed < 1 || speed > bounds.maxSpeed)) {
    throw new RangeError(`${field} must be within 1..=${bounds.maxSpeed} cm/s, got ${speed}`);
  }
}

// ------------------------------------------------------------------ writer

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder('utf-8', { fatal: true });

class Writer {
  constructor() {
    this.buf = new Uint8Array(64);
    this.len = 0;
  }

  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
  }

  /** An unsigned varint of a safe integer (0..=2^53-1). */
  varint(value) {
    this.reserve(10);
    let v = value;
    while (v > 0x7f) {
      this.buf[this.len++] = (v % 128) | 0x80;
      v = Math.floor(v / 128);
    }
    this.buf[this.len++] = v;
  }

  tag(field, wireType) {
    this.varint(field * 8 + wireType);
  }

  /** A varint field, skipped when it holds the default 0. */
  scalar(field, value) {
    if (value !== 0) {
      this.tag(field, 0);
      this.varint(value);
    }
  }

  bytes(field, bytes) {
    this.tag(field, 2);
    this.varint(bytes.length);
    this.reserve(bytes.length);
    this.buf.set(bytes, this.len);
    this.len += bytes.length;
  }

  /** A string field, skipped when empty. */
  string(field, value) {
    if (value !== '') this.bytes(field, utf8Encoder.encode(value));
  }

  /** A sub-message field, skipped when absent (null/undefined). */
  message(field, value, encode) {
    if (value === undefined || value === null) return;
    const sub = new Writer();
    encode(sub, value);
    this.bytes(field, sub.finish());
  }

  finish() {
    return this.buf.slice(0, this.len);
  }
}

// ------------------------------------------------------------------ reader

const WIRE_VARINT = 0;
const WIRE_I64 = 1;
const WIRE_LEN = 2;
const WIRE_I32 = 5;

class Reader {
  constructor(bytes) {
    this.buf = bytes;
    this.pos = 0;
  }

  /** A varint as uint32 (the low 32 bits, as protobuf does). */
  uint32() {
    let result = 0;
    let shift = 0;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.buf.length) throw new DecodeError('truncated varint');
      const b = this.buf[this.pos++];
      if (shift < 32) result |= (b & 0x7f) << shift;
      shift += 7;
      if (b < 0x80) return result >>> 0;
    }
    throw new DecodeError('varint longer than 10 bytes');
  }

  /** A varint as int32 (enums). */
  int32() {
    return this.uint32() | 0;
  }

  /** A varint as a Number; values above 2^53-1 are refused, not rounded. */
  uint64() {
    let result = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.buf.length) throw new DecodeError('truncated varint');
      const b = this.buf[this.pos++];
      result += (b & 0x7f) * scale;
      scale *= 128;
      if (b < 0x80) {
        if (result > Number.MAX_SAFE_INTEGER) {
          throw new DecodeError('uint64 value above 2^53-1 cannot be held exactly');
        }
        return result;
      }
    }
    throw new DecodeError('varint longer than 10 bytes');
  }

  /** The end offset of a length-delimited field that starts here. */
  lengthEnd() {
    const len = this.uint32();
    const end = this.pos + len;
    if (end > this.buf.length) throw new DecodeError('length-delimited field runs past the end');
    return end;
  }

  string() {
    const end = this.lengthEnd();
    const bytes = this.buf.subarray(this.pos, end);
    this.pos = end;
    try {
      return utf8Decoder.decode(bytes);
    } catch {
      throw new DecodeError('string field is not valid UTF-8');
    }
  }

  skip(wireType) {
    switch (wireType) {
      case WIRE_VARINT:
        this.uint32();
        return;
      case WIRE_I64:
        this.advance(8);
        return;
      case WIRE_LEN:
        this.pos = this.lengthEnd();
        return;
      case WIRE_I32:
        this.advance(4);
        return;
      default:
        throw new DecodeError(`unsupported wire type ${wireType}`);
    }
  }

  advance(n) {
    if (this.pos + n > this.buf.length) throw new DecodeError('truncated field');
    this.pos += n;
  }
}

/**
 * Reads the fields of one message up to `end`, calling `field(r, number,
 * wireType)` for each; it returns false for a field it does not know, which
 * is then skipped (proto3: unknown fields are ignored).
 */
function readFields(r, end, field) {
  while (r.pos < end) {
    const key = r.uint32();
    const number = key >>> 3;
    const wireType = key & 7;
    if (number === 0) throw new DecodeError('field number 0');
    if (!field(r, number, wireType)) r.skip(wireType);
  }
  if (r.pos !== end) throw new DecodeError('sub-message runs past its length');
}

function expect(wireType, want, name) {
  if (wireType !== want) throw new DecodeError(`${name}: wire type ${wireType}, expected ${want}`);
}

/**
 * Reads a sub-message field into `into` (a repeated sub-message field in
 * proto3 merges into the one already read) and returns it.
 */
function readMessage(r, wireType, name, into, decodeFields) {
  expect(wireType, WIRE_LEN, name);
  const end = r.lengthEnd();
  const target = into ?? decodeFields.empty();
  readFields(r, end, (rr, n, wt) => decodeFields(rr, n, wt, target));
  return target;
}

/** Declares the default value of a message kind on its field decoder. */
function kind(empty, decodeFields) {
  decodeFields.empty = empty;
  return decodeFields;
}

// ---------------------------------------------------------------- messages
// Each message has `encodeX(writer, value)` and a field decoder
// `decodeX(reader, number, wireType, target) -> known`, with its default
// value as `decodeX.empty()`.

function readU32(r, wt, name) {
  expect(wt, WIRE_VARINT, name);
  return r.uint32();
}

function readU64(r, wt, name) {
  expect(wt, WIRE_VARINT, name);
  return r.uint64();
}

function readBool(r, wt, name) {
  expect(wt, WIRE_VARINT, name);
  return r.uint64() !== 0;
}

function readEnum(r, wt, name) {
  expect(wt, WIRE_VARINT, name);
  return r.int32();
}

function readString(r, wt, name) {
  expect(wt, WIRE_LEN, name);
  return r.string();
}

/** Enums are int32 on the wire; amble's enums have no negative values. */
function enumValue(value, field) {
  if (value === undefined || value === null) return 0;
  if (!Number.isInteger(value) || value < 0 || value > 0x7fff_ffff) {
    throw new RangeError(`${field} must be an enum value in 0..=2147483647, got ${describe(value)}`);
  }
  return value;
}

function encodePosition(w, p, field = 'position') {
  w.scalar(1, u32(p.x, `${field}.x`));
  w.scalar(2, u32(p.y, `${field}.y`));
}

const decodePosition = kind(
  () => ({ x: 0, y: 0 }),
  (r, n, wt, p) => {
    switch (n) {
      case 1: p.x = readU32(r, wt, 'Position.x'); return true;
      case 2: p.y = readU32(r, wt, 'Position.y'); return true;
      default: return false;
    }
  },
);

function encodeWalk(w, walk, field = 'walk') {
  w.message(1, walk.target, (ww, t) => encodePosition(ww, t, `${field}.target`));
  w.scalar(2, u32(walk.speed, `${field}.speed`));
}

const decodeWalk = kind(
  () => ({ speed: 0, target: null }),
  (r, n, wt, walk) => {
    switch (n) {
      case 1: walk.target = readMessage(r, wt, 'Walk.target', walk.target, decodePosition); return true;
      case 2: walk.speed = readU32(r, wt, 'Walk.speed'); return true;
      default: return false;
    }
  },
);

function encodeDataEntry(w, e, field = 'data') {
  w.string(1, str(e.key, `${field}.key`));
  w.string(2, str(e.value, `${field}.value`));
}

const decodeDataEntry = kind(
  () => ({ key: '', value: '' }),
  (r, n, wt, e) => {
    switch (n) {
      case 1: e.key = readString(r, wt, 'DataEntry.key'); return true;
      case 2: e.value = readString(r, wt, 'DataEntry.value'); return true;
      default: return false;
    }
  },
);

/** Writes repeated DataEntry field `number` from `entries` ([{ key, value }]). */
function encodeData(w, number, entries, field) {
  if (entries === undefined || entries === null) return;
  if (!Array.isArray(entries)) throw new TypeError(`${field} must be an array of { key, value }`);
  entries.forEach((e, i) => w.message(number, e, (ww, x) => encodeDataEntry(ww, x, `${field}[${i}]`)));
}

/** Repeated: each occurrence is one more entry, not a merge. */
function readDataEntry(r, wt, name) {
  return readMessage(r, wt, name, null, decodeDataEntry);
}

function encodeJoin(w, join) {
  w.string(1, str(join.room, 'join.room'));
  w.string(2, str(join.name, 'join.name'));
  w.string(3, str(join.token, 'join.token'));
  w.message(4, join.start, (ww, p) => encodePosition(ww, p, 'join.start'));
  w.string(5, str(join.resumeToken, 'join.resumeToken'));
  encodeData(w, 6, join.data, 'join.data');
}

const decodeJoin = kind(
  () => ({ data: [], name: '', resumeToken: '', room: '', start: null, token: '' }),
  (r, n, wt, join) => {
    switch (n) {
      case 1: join.room = readString(r, wt, 'Join.room'); return true;
      case 2: join.name = readString(r, wt, 'Join.name'); return true;
      case 3: join.token = readString(r, wt, 'Join.token'); return true;
      case 4: join.start = readMessage(r, wt, 'Join.start', join.start, decodePosition); return true;
      case 5: join.resumeToken = readString(r, wt, 'Join.resumeToken'); return true;
      case 6: join.data.push(readDataEntry(r, wt, 'Join.data')); return true;
      default: return false;
    }
  },
);

function encodeSetData(w, set) {
  encodeData(w, 1, set.data, 'setData.data');
}

const decodeSetData = kind(
  () => ({ data: [] }),
  (r, n, wt, set) => {
    if (n !== 1) return false;
    set.data.push(readDataEntry(r, wt, 'SetData.data'));
    return true;
  },
);

function encodeRefreshToken(w, refresh) {
  w.string(1, str(refresh.token, 'refresh.token'));
}

const decodeRefreshToken = kind(
  () => ({ token: '' }),
  (r, n, wt, refresh) => {
    if (n !== 1) return false;
    refresh.token = readString(r, wt, 'RefreshToken.token');
    return true;
  },
);

function encodeMove(w, mv) {
  w.message(1, mv.position, (ww, p) => encodePosition(ww, p, 'move.position'));
  w.message(2, mv.walk, (ww, walk) => encodeWalk(ww, walk, 'move.walk'));
  w.scalar(3, u32(mv.seq, 'move.seq'));
  w.scalar(4, u64(mv.clientTimeMs, 'move.clientTimeMs'));
}

const decodeMove = kind(
  () => ({ clientTimeMs: 0, position: null, seq: 0, walk: null }),
  (r, n, wt, mv) => {
    switch (n) {
      case 1: mv.position = readMessage(r, wt, 'Move.position', mv.position, decodePosition); return true;
      case 2: mv.walk = readMessage(r, wt, 'Move.walk', mv.walk, decodeWalk); return true;
      case 3: mv.seq = readU32(r, wt, 'Move.seq'); return true;
      case 4: mv.clientTimeMs = readU64(r, wt, 'Move.clientTimeMs'); return true;
      default: return false;
    }
  },
);

function encodeSendChat(w, chat) {
  w.string(1, str(chat.text, 'chat.text'));
}

const decodeSendChat = kind(
  () => ({ text: '' }),
  (r, n, wt, chat) => {
    if (n !== 1) return false;
    chat.text = readString(r, wt, 'SendChat.text');
    return true;
  },
);

function encodePing(w, ping) {
  w.scalar(1, u64(ping.clientTimeMs, 'ping.clientTimeMs'));
}

const decodePing = kind(
  () => ({ clientTimeMs: 0 }),
  (r, n, wt, ping) => {
    if (n !== 1) return false;
    ping.clientTimeMs = readU64(r, wt, 'Ping.clientTimeMs');
    return true;
  },
);

const decodeLeave = kind(
  () => ({}),
  () => false,
);

/** Limits fields in field-number order (field n is LIMIT_FIELDS[n - 1]). */
const LIMIT_FIELDS = [
  'moveIntervalMs',
  'moveBurst',
  'tickMs',
  'motionTimeUnitMs',
  'worldWidth',
  'worldHeight',
  'maxSpeed',
  'maxMessageBytes',
  'maxNameChars',
  'maxChatChars',
  'roomCapacity',
  'chatIntervalMs',
  'chatBurst',
  'maxDataEntries',
  'maxDataBytes',
  'maxDataValueChars',
  'dataIntervalMs',
  'dataBurst',
  'resumeGraceMs',
  'interestRadius',
  'interestCell',
  'interestMargin',
];

function encodeLimits(w, limits) {
  for (let i = 0; i < LIMIT_FIELDS.length; i++) {
    const name = LIMIT_FIELDS[i];
    w.scalar(i + 1, u32(limits[name], `limits.${name}`));
  }
}

const decodeLimits = kind(
  () => Object.fromEntries(LIMIT_FIELDS.map((name) => [name, 0])),
  (r, n, wt, limits) => {
    const name = LIMIT_FIELDS[n - 1];
    if (name === undefined) return false;
    limits[name] = readU32(r, wt, `Limits.${name}`);
    return true;
  },
);

function encodeMember(w, m) {
  w.scalar(1, u32(m.id, 'member.id'));
  w.string(2, str(m.name, 'member.name'));
  w.message(3, m.position, (ww, p) => encodePosition(ww, p, 'member.position'));
  w.message(4, m.walk, (ww, walk) => encodeWalk(ww, walk, 'member.walk'));
  w.scalar(5, u64(m.movedAtMs, 'member.movedAtMs'));
  encodeData(w, 6, m.data, 'member.data');
  w.string(7, str(m.user ?? '', 'member.user'));
}

const decodeMember = kind(
  () => ({ data: [], id: 0, movedAtMs: 0, name: '', position: null, user: '', walk: null }),
  (r, n, wt, m) => {
    switch (n) {
      case 1: m.id = readU32(r, wt, 'Member.id'); return true;
      case 2: m.name = readString(r, wt, 'Member.name'); return true;
      case 3: m.position = readMessage(r, wt, 'Member.position', m.position, decodePosition); return true;
      case 4: m.walk = readMessage(r, wt, 'Member.walk', m.walk, decodeWalk); return true;
      case 5: m.movedAtMs = readU64(r, wt, 'Member.movedAtMs'); return true;
      case 6: m.data.push(readDataEntry(r, wt, 'Member.data')); return true;
      case 7: m.user = readString(r, wt, 'Member.user'); return true;
      default: return false;
    }
  },
);

function encodeSnapshot(w, s) {
  w.scalar(1, u64(s.serverTimeMs, 'snapshot.serverTimeMs'));
  for (const m of s.members ?? []) w.message(2, m, encodeMember);
}

const decodeSnapshot = kind(
  () => ({ members: [], serverTimeMs: 0 }),
  (r, n, wt, s) => {
    switch (n) {
      case 1: s.serverTimeMs = readU64(r, wt, 'Snapshot.serverTimeMs'); return true;
      // Repeated: each occurrence is one more member, not a merge.
      case 2: s.members.push(readMessage(r, wt, 'Snapshot.members', null, decodeMember)); return true;
      default: return false;
    }
  },
);

function encodeWelcome(w, wel) {
  w.scalar(1, u32(wel.memberId, 'welcome.memberId'));
  w.string(2, str(wel.room, 'welcome.room'));
  w.message(3, wel.limits, encodeLimits);
  w.message(4, wel.snapshot, encodeSnapshot);
  w.string(5, str(wel.serverVersion, 'welcome.serverVersion'));
  w.scalar(6, u32(wel.protocolRevision, 'welcome.protocolRevision'));
  w.scalar(7, u64(wel.tokenExpiresAtMs, 'welcome.tokenExpiresAtMs'));
  w.string(8, str(wel.resumeToken, 'welcome.resumeToken'));
  w.scalar(9, bool(wel.resumed, 'welcome.resumed'));
  w.scalar(10, u32(wel.population, 'welcome.population'));
}

const decodeWelcome = kind(
  () => ({
    limits: null, memberId: 0, protocolRevision: 0, room: '', serverVersion: '', snapshot: null,
    population: 0, resumeToken: '', resumed: false, tokenExpiresAtMs: 0,
  }),
  (r, n, wt, wel) => {
    switch (n) {
      case 1: wel.memberId = readU32(r, wt, 'Welcome.memberId'); return true;
      case 2: wel.room = readString(r, wt, 'Welcome.room'); return true;
      case 3: wel.limits = readMessage(r, wt, 'Welcome.limits', wel.limits, decodeLimits); return true;
      case 4: wel.snapshot = readMessage(r, wt, 'Welcome.snapshot', wel.snapshot, decodeSnapshot); return true;
      case 5: wel.serverVersion = readString(r, wt, 'Welcome.serverVersion'); return true;
      case 6: wel.protocolRevision = readU32(r, wt, 'Welcome.protocolRevision'); return true;
      case 7: wel.tokenExpiresAtMs = readU64(r, wt, 'Welcome.tokenExpiresAtMs'); return true;
      case 8: wel.resumeToken = readString(r, wt, 'Welcome.resumeToken'); return true;
      case 9: wel.resumed = readBool(r, wt, 'Welcome.resumed'); return true;
      case 10: wel.population = readU32(r, wt, 'Welcome.population'); return true;
      default: return false;
    }
  },
);

function encodeJoined(w, j) {
  w.message(1, j.member, encodeMember);
}

const decodeJoined = kind(
  () => ({ member: null }),
  (r, n, wt, j) => {
    if (n !== 1) return false;
    j.member = readMessage(r, wt, 'Joined.member', j.member, decodeMember);
    return true;
  },
);

function encodeLeft(w, l) {
  w.scalar(1, u32(l.memberId, 'left.memberId'));
  w.scalar(2, enumValue(l.reason, 'left.reason'));
}

const decodeLeft = kind(
  () => ({ memberId: 0, reason: 0 }),
  (r, n, wt, l) => {
    switch (n) {
      case 1: l.memberId = readU32(r, wt, 'Left.memberId'); return true;
      case 2: l.reason = readEnum(r, wt, 'Left.reason'); return true;
      default: return false;
    }
  },
);

function encodeChatMessage(w, c) {
  w.scalar(1, u32(c.memberId, 'chat.memberId'));
  w.string(2, str(c.text, 'chat.text'));
  w.scalar(3, u64(c.serverTimeMs, 'chat.serverTimeMs'));
}

const decodeChatMessage = kind(
  () => ({ memberId: 0, serverTimeMs: 0, text: '' }),
  (r, n, wt, c) => {
    switch (n) {
      case 1: c.memberId = readU32(r, wt, 'ChatMessage.memberId'); return true;
      case 2: c.text = readString(r, wt, 'ChatMessage.text'); return true;
      case 3: c.serverTimeMs = readU64(r, wt, 'ChatMessage.serverTimeMs'); return true;
      default: return false;
    }
  },
);

function encodeMemberData(w, d) {
  w.scalar(1, u32(d.memberId, 'memberData.memberId'));
  encodeData(w, 2, d.data, 'memberData.data');
}

const decodeMemberData = kind(
  () => ({ data: [], memberId: 0 }),
  (r, n, wt, d) => {
    switch (n) {
      case 1: d.memberId = readU32(r, wt, 'MemberData.memberId'); return true;
      case 2: d.data.push(readDataEntry(r, wt, 'MemberData.data')); return true;
      default: return false;
    }
  },
);

/** TokenExpiring and TokenRefreshed: one `expiresAtMs`. */
function encodeTokenExpiry(name) {
  return (w, t) => w.scalar(1, u64(t.expiresAtMs, `${name}.expiresAtMs`));
}

function decodeTokenExpiry(type) {
  return kind(
    () => ({ expiresAtMs: 0 }),
    (r, n, wt, t) => {
      if (n !== 1) return false;
      t.expiresAtMs = readU64(r, wt, `${type}.expiresAtMs`);
      return true;
    },
  );
}

function encodeSystemMessage(w, m) {
  w.string(1, str(m.text, 'system.text'));
  w.scalar(2, u64(m.serverTimeMs, 'system.serverTimeMs'));
  w.scalar(3, bool(m.direct, 'system.direct'));
}

const decodeSystemMessage = kind(
  () => ({ direct: false, serverTimeMs: 0, text: '' }),
  (r, n, wt, m) => {
    switch (n) {
      case 1: m.text = readString(r, wt, 'SystemMessage.text'); return true;
      case 2: m.serverTimeMs = readU64(r, wt, 'SystemMessage.serverTimeMs'); return true;
      case 3: m.direct = readBool(r, wt, 'SystemMessage.direct'); return true;
      default: return false;
    }
  },
);

function encodeAppeared(w, a) {
  for (const m of a.members ?? []) w.message(1, m, encodeMember);
}

const decodeAppeared = kind(
  () => ({ members: [] }),
  (r, n, wt, a) => {
    if (n !== 1) return false;
    a.members.push(readMessage(r, wt, 'Appeared.members', null, decodeMember));
    return true;
  },
);

function encodeDisappeared(w, d) {
  const ids = d.memberIds ?? [];
  if (ids.length === 0) return;
  const packed = new Writer();
  ids.forEach((id, i) => packed.varint(u32(id, `disappeared.memberIds[${i}]`)));
  w.bytes(1, packed.finish());
}

const decodeDisappeared = kind(
  () => ({ memberIds: [] }),
  (r, n, wt, d) => {
    if (n !== 1) return false;
    // Packed (as the server sends it), or one varint per occurrence.
    if (wt === WIRE_LEN) {
      const end = r.lengthEnd();
      while (r.pos < end) d.memberIds.push(r.uint32());
      if (r.pos !== end) throw new DecodeError('packed Disappeared.memberIds runs past its length');
    } else {
      d.memberIds.push(readU32(r, wt, 'Disappeared.memberIds'));
    }
    return true;
  },
);

function encodePopulation(w, p) {
  w.scalar(1, u32(p.members, 'population.members'));
}

const decodePopulation = kind(
  () => ({ members: 0 }),
  (r, n, wt, p) => {
    if (n !== 1) return false;
    p.members = readU32(r, wt, 'Population.members');
    return true;
  },
);

function encodeRenumbered(w, m) {
  w.scalar(1, u32(m.oldId, 'renumbered.oldId'));
  w.scalar(2, u32(m.newId, 'renumbered.newId'));
}

const decodeRenumbered = kind(
  () => ({ newId: 0, oldId: 0 }),
  (r, n, wt, m) => {
    switch (n) {
      case 1: m.oldId = readU32(r, wt, 'Renumbered.oldId'); return true;
      case 2: m.newId = readU32(r, wt, 'Renumbered.newId'); return true;
      default: return false;
    }
  },
);

function encodePong(w, p) {
  w.scalar(1, u64(p.clientTimeMs, 'pong.clientTimeMs'));
  w.scalar(2, u64(p.serverTimeMs, 'pong.serverTimeMs'));
}

const decodePong = kind(
  () => ({ clientTimeMs: 0, serverTimeMs: 0 }),
  (r, n, wt, p) => {
    switch (n) {
      case 1: p.clientTimeMs = readU64(r, wt, 'Pong.clientTimeMs'); return true;
      case 2: p.serverTimeMs = readU64(r, wt, 'Pong.serverTimeMs'); return true;
      default: return false;
    }
  },
);

function encodeError(w, e) {
  w.scalar(1, enumValue(e.code, 'error.code'));
  w.string(2, str(e.message, 'error.message'));
}

const decodeError = kind(
  () => ({ code: 0, message: '' }),
  (r, n, wt, e) => {
    switch (n) {
      case 1: e.code = readEnum(r, wt, 'Error.code'); return true;
      case 2: e.message = readString(r, wt, 'Error.message'); return true;
      default: return false;
    }
  },
);

// ----------------------------------------------------------------- oneofs

const CLIENT_BODIES = [
  // [field number, name, encode, decode]
  [1, 'join', encodeJoin, decodeJoin],
  [2, 'move', encodeMove, decodeMove],
  [3, 'chat', encodeSendChat, decodeSendChat],
  [4, 'ping', encodePing, decodePing],
  [5, 'leave', () => {}, decodeLeave],
  [6, 'setData', encodeSetData, decodeSetData],
  [7, 'refresh', encodeRefreshToken, decodeRefreshToken],
];

const SERVER_BODIES = [
  [1, 'welcome', encodeWelcome, decodeWelcome],
  [2, 'joined', encodeJoined, decodeJoined],
  [3, 'left', encodeLeft, decodeLeft],
  [4, 'chat', encodeChatMessage, decodeChatMessage],
  [5, 'pong', encodePong, decodePong],
  [6, 'error', encodeError, decodeError],
  [7, 'resync', encodeSnapshot, decodeSnapshot],
  // 8 is the motion batch (SERVER_MOTION_FIELD).
  [9, 'memberData', encodeMemberData, decodeMemberData],
  [10, 'tokenExpiring', encodeTokenExpiry('tokenExpiring'), decodeTokenExpiry('TokenExpiring')],
  [11, 'tokenRefreshed', encodeTokenExpiry('tokenRefreshed'), decodeTokenExpiry('TokenRefreshed')],
  [12, 'system', encodeSystemMessage, decodeSystemMessage],
  [13, 'renumbered', encodeRenumbered, decodeRenumbered],
  [14, 'appeared', encodeAppeared, decodeAppeared],
  [15, 'disappeared', encodeDisappeared, decodeDisappeared],
  [16, 'population', encodePopulation, decodePopulation],
];

/** A oneof's bodies by field number. */
const byNumber = (bodies) => new Map(bodies.map((b) => [b[0], b]));
const CLIENT_BY_NUMBER = byNumber(CLIENT_BODIES);
const SERVER_BY_NUMBER = byNumber(SERVER_BODIES);

const SERVER_MOTION_FIELD = 8;

/** The one body a message sets; TypeError if it sets more than one. */
function oneBody(msg, bodies, type) {
  let found = null;
  for (const body of bodies) {
    const value = msg[body[1]];
    if (value === undefined || value === null) continue;
    if (found) throw new TypeError(`${type} sets both ${found[0][1]} and ${body[1]}`);
    found = [body, value];
  }
  return found;
}

function encodeBody(w, found) {
  if (!found) return;
  const [[number, , encode], value] = found;
  w.message(number, value, encode);
}

/**
 * Encodes a ClientMessage such as `{ join: { room, name } }` or
 * `{ move: { position: { x, y }, walk: null, seq, clientTimeMs } }`.
 *
 * With `bounds` (`{ worldWidth, worldHeight, maxSpeed }`, e.g. the server's
 * Limits) a Move's position and walk target must lie in the world and its
 * speed in 1..=maxSpeed; otherwise only the uint32 range is checked. Bad
 * numbers throw a RangeError that names the field.
 */
export function encodeClientMessage(msg, bounds) {
  const found = oneBody(msg, CLIENT_BODIES, 'ClientMessage');
  if (found && bounds && found[0][1] === 'move') checkMove(found[1], bounds);
  const w = new Writer();
  encodeBody(w, found);
  return w.finish();
}

function checkMove(mv, bounds) {
  if (!mv.position) throw new RangeError('move.position is required');
  checkPosition(mv.position.x, mv.position.y, bounds, 'move.position');
  if (mv.walk) {
    if (!mv.walk.target) throw new RangeError('move.walk.target is required');
    checkPosition(mv.walk.target.x, mv.walk.target.y, bounds, 'move.walk.target');
    checkSpeed(mv.walk.speed, bounds, 'move.walk.speed');
  }
}

/** Decodes a ClientMessage (bytes: Uint8Array or ArrayBuffer). */
export function decodeClientMessage(bytes) {
  const r = new Reader(asBytes(bytes));
  const msg = {};
  let current = null;
  readFields(r, r.buf.length, (rr, n, wt) => {
    const body = CLIENT_BY_NUMBER.get(n);
    if (!body) return false;
    current = readBody(rr, wt, msg, current, body);
    return true;
  });
  return msg;
}

/**
 * Encodes a ServerMessage: a body such as `{ pong: {...} }` and/or
 * `motion: [time, ...records]` (packed; omitted when empty).
 */
export function encodeServerMessage(msg) {
  const found = oneBody(msg, SERVER_BODIES, 'ServerMessage');
  const w = new Writer();
  encodeBody(w, found);
  const motion = msg.motion ?? [];
  if (motion.length > 0) {
    const packed = new Writer();
    for (let i = 0; i < motion.length; i++) packed.varint(u32(motion[i], `motion[${i}]`));
    w.bytes(SERVER_MOTION_FIELD, packed.finish());
  }
  return w.finish();
}

/**
 * Decodes a ServerMessage into `{ <body>: {...}, motion: [...] }`; the body
 * key is missing when the frame carries only motion.
 */
export function decodeServerMessage(bytes) {
  const r = new Reader(asBytes(bytes));
  const msg = {};
  const motion = [];
  let current = null;
  readFields(r, r.buf.length, (rr, n, wt) => {
    if (n === SERVER_MOTION_FIELD) {
      if (wt === WIRE_LEN) {
        const end = rr.lengthEnd();
        while (rr.pos < end) motion.push(rr.uint32());
        if (rr.pos !== end) throw new DecodeError('packed motion runs past its length');
      } else {
        expect(wt, WIRE_VARINT, 'ServerMessage.motion');
        motion.push(rr.uint32());
      }
      return true;
    }
    const body = SERVER_BY_NUMBER.get(n);
    if (!body) return false;
    current = readBody(rr, wt, msg, current, body);
    return true;
  });
  msg.motion = motion;
  return msg;
}

/** Reads a oneof member: a different member replaces, the same one merges. */
function readBody(r, wt, msg, current, body) {
  const name = body[1];
  if (current && current !== name) delete msg[current];
  msg[name] = readMessage(r, wt, name, current === name ? msg[name] : null, body[3]);
  return name;
}

function asBytes(bytes) {
  if (bytes instanceof Uint8Array) return bytes;
  if (bytes instanceof ArrayBuffer) return new Uint8Array(bytes);
  if (ArrayBuffer.isView(bytes)) return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  throw new TypeError('expected a Uint8Array or an ArrayBuffer');
}

// ----------------------------------------------------------------- motion

/** A motion batch that breaks the layout (see the proto). */
export class MotionError extends Error {
  constructor(message) {
    super(message);
    this.name = 'MotionError';
  }
}

/** Truncates a server time to the 7-bit motion time. */
export function motionTime(serverTimeMs, unitMs) {
  const unit = Math.max(unitMs, 1);
  return Math.floor(serverTimeMs / unit) % MOTION_TIME_MODULUS;
}

/**
 * Resolves a truncated motion time to the full server time (ms) nearest
 * `estimateMs`, the receiver's estimate of the server clock: of the values
 * congruent to `truncated` mod 128 units, the closest one (ties to the
 * earlier), exactly as `resolve_motion_time` in src/protocol.rs.
 */
export function resolveMotionTime(truncated, unitMs, estimateMs) {
  const unit = Math.max(unitMs, 1);
  const estimate = Math.floor(Math.max(estimateMs, 0) / unit);
  const base = estimate - (estimate % MOTION_TIME_MODULUS) + truncated;
  let best = base;
  let bestDistance = Math.abs(base - estimate);
  if (base >= MOTION_TIME_MODULUS) {
    const below = base - MOTION_TIME_MODULUS;
    const d = Math.abs(below - estimate);
    // The earlier candidate wins a tie, as min_by_key keeps the first minimum.
    if (d <= bestDistance) {
      best = below;
      bestDistance = d;
    }
  }
  const above = base + MOTION_TIME_MODULUS;
  if (Math.abs(above - estimate) < bestDistance) best = above;
  return best * unit;
}

/** The number of array elements in a motion record whose head is `head`. */
export function motionRecordLength(head) {
  return head % 2 === 1 ? 6 : 3;
}

/**
 * Splits a motion batch into its truncated time and records
 * `{ memberId, x, y, walk: { target: { x, y }, speed } | null }`.
 * Throws a MotionError for an empty batch or a truncated record.
 */
export function decodeMotion(motion) {
  if (motion.length === 0) throw new MotionError('motion batch is empty');
  const records = [];
  let i = 1;
  while (i < motion.length) {
    const head = motion[i];
    const len = motionRecordLength(head);
    if (i + len > motion.length) throw new MotionError('motion record truncated');
    records.push({
      memberId: Math.floor(head / 2),
      x: motion[i + 1],
      y: motion[i + 2],
      walk:
        len === 6
          ? { target: { x: motion[i + 3], y: motion[i + 4] }, speed: motion[i + 5] }
          : null,
    });
    i += len;
  }
  return { time: motion[0], records };
}

/** Builds the motion array for `time` and records shaped as `decodeMotion` returns. */
export function encodeMotion(time, records) {
  const motion = [time];
  for (const r of records) {
    motion.push(r.memberId * 2 + (r.walk ? 1 : 0), r.x, r.y);
    if (r.walk) motion.push(r.walk.target.x, r.walk.target.y, r.walk.speed);
  }
  return motion;
}

// ------------------------------------------------------------ frame sizes

/**
 * The WebSocket frame header size (RFC 6455 §5.2) of an unfragmented frame
 * with `payloadBytes` of payload and no extensions: 2 bytes up to 125, 4 up
 * to 65535, else 10; plus the 4-byte masking key when `masked` (every
 * client-to-server frame is masked).
 */
export function websocketHeaderBytes(payloadBytes, masked) {
  const base = payloadBytes < 126 ? 2 : payloadBytes < 65536 ? 4 : 10;
  return masked ? base + 4 : base;
}
