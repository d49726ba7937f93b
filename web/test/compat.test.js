// The protocol revision at Welcome (docs/client.md, "Versions and the
// protocol revision"): a server older than the SDK is named once, in a
// `compatibility` event and a warning, and the SDK works on.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { AmbleClient, PROTOCOL_REVISION, State, VERSION, compatibility } from '../amble.js';
import { encodeServerMessage } from '../codec.js';

test('a server at this revision or a newer one is fine', () => {
  assert.equal(PROTOCOL_REVISION, 5);
  assert.equal(compatibility(5, '0.1.0'), null);
  assert.equal(compatibility(6, '9.0.0'), null);
});

test('a server at revision 4 lacks only spatial rooms', () => {
  assert.deepEqual(compatibility(4, '0.1.0').missing, ['spatial rooms (area of interest)']);
  assert.equal(compatibility(4, '0.1.0').sdkRevision, 5);
});

test('a server at revision 3 lacks held places and system messages too', () => {
  assert.deepEqual(compatibility(3, '0.1.0').missing, [
    'resuming a held place after a drop', "the app's system messages",
    'spatial rooms (area of interest)',
  ]);
});

test('a server at revision 2 lacks token refresh too', () => {
  assert.deepEqual(compatibility(2, '0.1.0').missing, [
    'token expiry notices and RefreshToken', 'resuming a held place after a drop',
    "the app's system messages", 'spatial rooms (area of interest)',
  ]);
});

test('a server before revision 2 sends no revision: it reads as 1 and lacks what 2 to 5 added', () => {
  assert.deepEqual(compatibility(0, ''), {
    serverVersion: null,
    serverRevision: 1,
    sdkVersion: VERSION,
    sdkRevision: 5,
    missing: [
      'Join.start (where to appear)', 'member data', 'the server version in Welcome',
      'token expiry notices and RefreshToken', 'resuming a held place after a drop',
      "the app's system messages", 'spatial rooms (area of interest)',
    ],
    text:
      "this amble server (a release before 0.1.0) speaks protocol revision 1, older than this SDK's 5 " +
      `(amble SDK ${VERSION}): it may not support Join.start (where to appear), member data, ` +
      'the server version in Welcome, token expiry notices and RefreshToken, resuming a held place ' +
      "after a drop, the app's system messages, spatial rooms (area of interest). The SDK works on " +
      'without them.',
  });
  assert.equal(compatibility(1, '0.0.9').serverVersion, '0.0.9');
  assert.match(compatibility(1, '0.0.9').text, /^amble server 0\.0\.9 speaks protocol revision 1/);
});

/** A client whose sockets open at once; `welcome(w)` answers its Join. */
function client() {
  const sockets = [];
  class FakeSocket {
    constructor(url, protocol) {
      this.url = url;
      this.protocol = protocol;
      this.readyState = 0;
      sockets.push(this);
    }
    send() {}
    close() {
      this.readyState = 3;
    }
  }
  const warnings = [];
  const events = [];
  const c = new AmbleClient({
    url: 'ws://test/ws',
    WebSocket: FakeSocket,
    now: () => 0,
    setTimeout: () => 0,
    clearTimeout: () => {},
    warn: (text) => warnings.push(text),
  });
  c.on('compatibility', (info) => events.push(info));
  const welcome = (fields) => {
    const ws = sockets[sockets.length - 1];
    if (ws.readyState === 0) {
      ws.readyState = 1;
      ws.onopen({});
    }
    const bytes = encodeServerMessage({
      welcome: { memberId: 1, room: 'lobby', snapshot: { serverTimeMs: 1, members: [] }, ...fields },
    });
    ws.onmessage({ data: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) });
  };
  return { c, welcome, warnings, events, sockets };
}

test('an older server is warned about once, and the client joins all the same', () => {
  const { c, welcome, warnings, events } = client();
  c.join('lobby', 'Me');
  welcome({});
  assert.equal(c.state, State.JOINED);
  assert.equal(c.serverRevision, 1);
  assert.equal(c.serverVersion, null);
  assert.equal(warnings.length, 1);
  assert.equal(events.length, 1);
  assert.equal(warnings[0], events[0].text);
  assert.deepEqual(events[0].missing, compatibility(0).missing);
  // A rejoin to the same server: no second warning.
  c.join('lobby', 'Me');
  welcome({});
  assert.equal(warnings.length, 1);
  // Another old release (a cluster's other node): named once too.
  c.join('lobby', 'Me');
  welcome({ serverVersion: '0.0.9', protocolRevision: 1 });
  assert.equal(warnings.length, 2);
  assert.match(warnings[1], /^amble server 0\.0\.9 /);
});

test('a server at the SDK revision is noted and not warned about', () => {
  const { c, welcome, warnings, events } = client();
  c.join('lobby', 'Me');
  welcome({ serverVersion: '0.1.0', protocolRevision: PROTOCOL_REVISION });
  assert.equal(c.state, State.JOINED);
  assert.equal(c.serverVersion, '0.1.0');
  assert.equal(c.serverRevision, PROTOCOL_REVISION);
  assert.deepEqual([warnings, events], [[], []]);
});

test('at most 16 releases are warned about', () => {
  const { c, welcome, warnings } = client();
  for (let i = 0; i < 20; i++) {
    c.join('lobby', 'Me');
    welcome({ serverVersion: `0.0.${i}`, protocolRevision: 1 });
  }
  assert.equal(warnings.length, 16);
  assert.equal(c.serverVersion, '0.0.19');
});
