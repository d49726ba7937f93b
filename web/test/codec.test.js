// The hand-written amble.v1 codec against the vectors the Rust side
// generates (web/test/vectors.json), in both directions, plus the proto3
// corner cases and the input checks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import {
  DecodeError,
  MotionError,
  PROTOCOL_REVISION,
  SCHEMA_FNV1A64,
  checkPosition,
  decodeClientMessage,
  decodeMotion,
  decodeServerMessage,
  encodeClientMessage,
  encodeMotion,
  encodeServerMessage,
  motionTime,
  resolveMotionTime,
  websocketHeaderBytes,
} from '../codec.js';

const doc = JSON.parse(readFileSync(new URL('./vectors.json', import.meta.url), 'utf8'));
const schema = readFileSync(new URL('../../proto/amble/v1/amble.proto', import.meta.url));

const hex = (bytes) => Buffer.from(bytes).toString('hex');
const unhex = (s) => new Uint8Array(Buffer.from(s, 'hex'));

function fnv1a64(bytes) {
  let h = 0xcbf29ce484222325n;
  for (const b of bytes) h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  return h.toString(16).padStart(16, '0');
}

const codecs = {
  ClientMessage: { decode: decodeClientMessage, encode: (m) => encodeClientMessage(m) },
  ServerMessage: { decode: decodeServerMessage, encode: encodeServerMessage },
};

test('the codec was written for the schema the vectors were made from', () => {
  assert.equal(
    doc.schema_fnv1a64,
    SCHEMA_FNV1A64,
    'vectors.json comes from another schema: update web/codec.js, then SCHEMA_FNV1A64',
  );
  assert.equal(fnv1a64(schema), SCHEMA_FNV1A64, 'proto/amble/v1/amble.proto changed: update web/codec.js');
});

test('the codec speaks the protocol revision of the server the vectors come from', () => {
  assert.equal(
    PROTOCOL_REVISION,
    doc.protocol_revision,
    'src/protocol/mod.rs and web/codec.js disagree on PROTOCOL_REVISION: docs/protocol.md "Compatibility"',
  );
});

test('the vectors cover every message body', () => {
  const bodies = { ClientMessage: new Set(), ServerMessage: new Set() };
  for (const v of doc.vectors) {
    for (const key of Object.keys(v.json)) if (key !== 'motion') bodies[v.type].add(key);
    if (v.type === 'ServerMessage' && v.json.motion.length > 0) bodies[v.type].add('motion');
  }
  assert.deepEqual([...bodies.ClientMessage].sort(), [
    'chat', 'join', 'leave', 'move', 'ping', 'refresh', 'setData',
  ]);
  assert.deepEqual([...bodies.ServerMessage].sort(), [
    'appeared', 'chat', 'disappeared', 'error', 'joined', 'left', 'memberData', 'motion',
    'pong', 'population', 'renumbered', 'resync', 'system', 'tokenExpiring', 'tokenRefreshed',
    'welcome',
  ]);
});

for (const v of doc.vectors) {
  test(`vector ${v.type} ${v.name}: decodes to its JSON`, () => {
    // The decoder produces exactly the serde shape, so no normaliser is needed.
    assert.deepStrictEqual(codecs[v.type].decode(unhex(v.hex)), v.json);
  });

  test(`vector ${v.type} ${v.name}: encodes byte for byte`, () => {
    assert.equal(hex(codecs[v.type].encode(v.json)), v.hex);
  });

  test(`vector ${v.type} ${v.name}: decodes from an ArrayBuffer and a DataView too`, () => {
    const bytes = unhex(v.hex);
    const copy = bytes.slice().buffer;
    assert.deepStrictEqual(codecs[v.type].decode(copy), v.json);
    assert.deepStrictEqual(codecs[v.type].decode(new DataView(copy)), v.json);
  });
}

test('a present sub-message with default fields is written empty, an absent one not at all', () => {
  const origin = encodeClientMessage({ move: { position: { x: 0, y: 0 }, walk: null, seq: 0, clientTimeMs: 0 } });
  assert.equal(hex(origin), '12020a00');
  assert.equal(hex(encodeClientMessage({ move: { walk: null } })), '1200');
  assert.deepEqual(decodeClientMessage(unhex('1200')), {
    move: { clientTimeMs: 0, position: null, seq: 0, walk: null },
  });
  assert.equal(hex(encodeClientMessage({ leave: {} })), '2a00');
  assert.deepEqual(decodeClientMessage(new Uint8Array()), {});
  assert.deepEqual(decodeServerMessage(new Uint8Array()), { motion: [] });
});

test('default scalars are omitted and fields come in ascending order', () => {
  // seq before position in the object: the bytes still start with field 1.
  const bytes = encodeClientMessage({ move: { seq: 7, clientTimeMs: 0, walk: { speed: 5, target: { x: 1, y: 0 } }, position: { y: 2, x: 0 } } });
  // Move{position{y:2}, walk{target{x:1}, speed:5}, seq:7}; clientTimeMs 0 and x 0 not written.
  assert.equal(hex(bytes), '120e' + '0a021002' + '12060a0208011005' + '1807');
});

test('unknown fields of every wire type are skipped', () => {
  // Ping with extra fields 9 (varint), 10 (fixed64), 11 (bytes), 12 (fixed32) around field 1.
  const body = '4801' + '510102030405060708' + '5a03616263' + '6501020304' + '0805';
  const bytes = unhex(`22${(body.length / 2).toString(16).padStart(2, '0')}${body}` + 'f80100');
  assert.deepEqual(decodeClientMessage(bytes), { ping: { clientTimeMs: 5 } });
});

test('a repeated sub-message merges; a different oneof member replaces', () => {
  // Two Position fields in one Move: x from the first, y from the second.
  assert.deepEqual(decodeClientMessage(unhex('12080a0208010a021002')).move.position, { x: 1, y: 2 });
  // join then ping: the last oneof member wins.
  assert.deepEqual(decodeClientMessage(unhex('0a030a01612202080a')), { ping: { clientTimeMs: 10 } });
});

test('motion accepts packed and unpacked encodings and concatenates occurrences', () => {
  assert.deepEqual(decodeServerMessage(unhex('42020306' + '4204c4138201')).motion, [3, 6, 2500, 130]);
  assert.deepEqual(decodeServerMessage(unhex('40034006')).motion, [3, 6]);
  assert.deepEqual(decodeServerMessage(unhex('420103' + '4006')).motion, [3, 6]);
});

test('truncated or malformed frames throw DecodeError', () => {
  const bad = [
    '0a', // tag without length
    '0a05616263', // length past the end
    '2a0208', // Leave with a truncated inner varint
    '22028080', // varint runs to the end of the sub-message
    'ffffffffffffffffffffff01', // varint over 10 bytes
    '0b', // start-group wire type
    '00', // field number 0
    '0a0380', // Join truncated inside
    '0a0212ff', // string with a length past the sub-message
    '0a030a01ff', // room that is not UTF-8
    '220a08ffffffffffffffff01', // uint64 above 2^53
    '2a010c', // Leave carrying an end-group wire type
  ];
  for (const h of bad) {
    assert.throws(() => decodeClientMessage(unhex(h)), DecodeError, `client ${h}`);
  }
  assert.throws(() => decodeServerMessage(unhex('4203030680')), DecodeError, 'packed motion truncated');
  assert.throws(() => decodeServerMessage(unhex('4202038006')), DecodeError, 'packed varint crossing its length');
  assert.throws(() => decodeServerMessage(unhex('0a020801' + '0a0110')), DecodeError);
  assert.throws(() => decodeServerMessage(unhex('1a020a00')), DecodeError, 'wrong wire type for Left.memberId');
  assert.throws(() => decodeClientMessage('0a00'), TypeError);
});

test('the encoder throws a RangeError naming the field for NaN, Infinity, negatives, fractions, overflow', () => {
  const move = (x, y, walk = null) => ({ move: { position: { x, y }, walk, seq: 1, clientTimeMs: 1 } });
  const cases = [
    [move(NaN, 0), /move\.position\.x .*NaN/],
    [move(0, Infinity), /move\.position\.y .*Infinity/],
    [move(-Infinity, 0), /move\.position\.x/],
    [move(-1, 0), /move\.position\.x .*-1/],
    [move(1.5, 0), /move\.position\.x .*1\.5/],
    [move(2 ** 32, 0), /move\.position\.x .*4294967296/],
    [move('12', 0), /move\.position\.x/],
    [move(1, 1, { target: { x: NaN, y: 1 }, speed: 10 }), /move\.walk\.target\.x/],
    [move(1, 1, { target: { x: 1, y: 1 }, speed: -3 }), /move\.walk\.speed/],
    [{ move: { position: { x: 1, y: 1 }, seq: -1 } }, /move\.seq/],
    [{ move: { position: { x: 1, y: 1 }, clientTimeMs: 2 ** 53 } }, /move\.clientTimeMs/],
    [{ ping: { clientTimeMs: NaN } }, /ping\.clientTimeMs/],
  ];
  for (const [msg, message] of cases) {
    assert.throws(() => encodeClientMessage(msg), { name: 'RangeError', message }, JSON.stringify(msg));
  }
  assert.throws(() => encodeServerMessage({ motion: [1, -2] }), { name: 'RangeError', message: /motion\[1\]/ });
  assert.throws(() => encodeServerMessage({ error: { code: -1 } }), RangeError);
  assert.throws(() => encodeClientMessage({ join: { room: 5, name: 'x' } }), TypeError);
  assert.throws(() => encodeClientMessage({ join: { room: 'a' }, ping: {} }), TypeError);
});

test('with bounds the encoder checks the world and the speed', () => {
  const bounds = { worldWidth: 5000, worldHeight: 4000, maxSpeed: 1000 };
  const move = (x, y, walk = null) => ({ move: { position: { x, y }, walk, seq: 1, clientTimeMs: 1 } });
  assert.equal(hex(encodeClientMessage(move(5000, 4000), bounds)), hex(encodeClientMessage(move(5000, 4000))));
  assert.throws(() => encodeClientMessage(move(5001, 0), bounds), { name: 'RangeError', message: /0\.\.=5000 cm, got 5001/ });
  assert.throws(() => encodeClientMessage(move(0, 4001), bounds), { name: 'RangeError', message: /0\.\.=4000 cm/ });
  assert.throws(() => encodeClientMessage(move(0, 0, { target: { x: 6000, y: 0 }, speed: 10 }), bounds), {
    name: 'RangeError',
    message: /move\.walk\.target\.x/,
  });
  assert.throws(() => encodeClientMessage(move(0, 0, { target: { x: 1, y: 0 }, speed: 0 }), bounds), {
    name: 'RangeError',
    message: /1\.\.=1000 cm\/s, got 0/,
  });
  assert.throws(() => encodeClientMessage(move(0, 0, { target: { x: 1, y: 0 }, speed: 1001 }), bounds), RangeError);
  assert.throws(() => encodeClientMessage({ move: { walk: null } }, bounds), { name: 'RangeError', message: /position is required/ });
  assert.throws(() => checkPosition(undefined, 1, bounds), RangeError);
  assert.doesNotThrow(() => checkPosition(0, 0, bounds));
});

test('motion batches split into records and back', () => {
  const v = doc.vectors.find((x) => x.name === 'motion_mixed');
  const { time, records } = decodeMotion(v.json.motion);
  assert.equal(time, 3);
  assert.deepEqual(records, [
    { memberId: 0, x: 5000, y: 5000, walk: null },
    { memberId: 70, x: 1, y: 2, walk: { target: { x: 4000, y: 3000 }, speed: 140 } },
    { memberId: 499, x: 127, y: 128, walk: null },
  ]);
  assert.deepEqual(encodeMotion(time, records), v.json.motion);
  assert.deepEqual(decodeMotion([1]), { time: 1, records: [] });
  assert.throws(() => decodeMotion([]), MotionError);
  assert.throws(() => decodeMotion([1, 4, 10]), MotionError);
  assert.throws(() => decodeMotion([1, 5, 10, 10, 1]), MotionError);
});

test('motion times resolve across the 7-bit wrap as resolve_motion_time does', () => {
  const unit = 100;
  let t = 12_799 * 100;
  assert.equal(resolveMotionTime(motionTime(t, unit), unit, 12_801 * 100), t);
  t = 12_801 * 100;
  assert.equal(resolveMotionTime(motionTime(t, unit), unit, 12_799 * 100), t);
  assert.equal(resolveMotionTime(5, unit, 0), 500);
  // The vector's batch time: 1_764_600_000_300 ms in units of 100 ms.
  assert.equal(motionTime(1_764_600_000_300, unit), 3);
  assert.equal(resolveMotionTime(3, unit, 1_764_600_000_000), 1_764_600_000_300);
  assert.equal(resolveMotionTime(3, unit, 1_764_600_006_000), 1_764_600_000_300);
  // Up to 63 units either way resolves exactly, whatever the sub-unit part.
  for (const base of [1_764_600_000_300, 12_800 * 100, 64 * 100]) {
    for (let d = -63; d <= 63; d++) {
      const estimate = base + d * unit + 37;
      assert.equal(resolveMotionTime(motionTime(base, unit), unit, estimate), base, `d=${d}`);
    }
  }
  // A tie of 64 units goes to the earlier value, like Rust's min_by_key.
  assert.equal(resolveMotionTime(66, 1, 130), 66, 'tie between the lower and the middle candidate');
  assert.equal(resolveMotionTime(0, 1, 64), 0, 'tie between the middle and the upper candidate');
  assert.equal(resolveMotionTime(0, 0, 64), 0, 'unit 0 is treated as 1');
});

test('WebSocket header sizes follow RFC 6455', () => {
  assert.equal(websocketHeaderBytes(0, false), 2);
  assert.equal(websocketHeaderBytes(125, false), 2);
  assert.equal(websocketHeaderBytes(126, false), 4);
  assert.equal(websocketHeaderBytes(65535, false), 4);
  assert.equal(websocketHeaderBytes(65536, false), 10);
  assert.equal(websocketHeaderBytes(125, true), 6);
  assert.equal(websocketHeaderBytes(126, true), 8);
});
