// Uses the SDK's public API as an app written in TypeScript would, through
// the package's name: tests/it/node_sdk.rs installs the packed package and
// checks this file with `tsc --noEmit --strict`. Each @ts-expect-error is a
// misuse the declarations must refuse.
import {
  AmbleClient,
  ErrorCode,
  LeaveReason,
  Member,
  PROTOCOL_REVISION,
  State,
  VERSION,
  compatibility,
  nameProblem,
  type CloseInfo,
  type Compatibility,
  type Limits,
  type StateValue,
} from '@amble/client';
import { SUBPROTOCOL, decodeServerMessage, encodeClientMessage, type ServerMessage } from '@amble/client/codec';
import { DEFAULT_TUNING } from '@amble/client/member';
import * as bundled from '@amble/client/bundle';

const version: string = VERSION;
const revision: number = PROTOCOL_REVISION;
const protocol: 'amble.v1' = SUBPROTOCOL;

const client = new AmbleClient({
  url: ['ws://127.0.0.1:3000/ws', 'ws://127.0.0.1:3001/ws'],
  WebSocket, // the browser's (lib "dom")
  reconnect: { maxDelayMs: 5000 },
  getToken: async ({ room, refresh }) => `token-for-${room}${refresh ? '-renewed' : ''}`,
  warn: (text) => console.info(text),
});
const stop: () => void = client.on('welcome', ({ me, members, limits, rejoined }) => {
  const self: Member = me;
  const width: number = limits.worldWidth;
  for (const m of members.values()) m.positionAt(client.renderTime(m), { x: 0, y: 0 });
  console.log(self.name, width, rejoined, client.serverVersion, client.serverRevision);
});
stop();
client.on('state', (state: StateValue, previous) => state === State.JOINED && previous !== state);
client.on('left', (member, reason) => reason === LeaveReason.REPLACED && member.name);
client.on('chat', ({ member, text }) => console.log(member?.name ?? 'someone who left', text));
client.on('error', ({ code, refused, text }) => code === ErrorCode.ROOM_FULL && refused && text);
client.on('closed', (info: CloseInfo) => info.willReconnect && info.nextUrl);
client.on('compatibility', (info: Compatibility) => console.warn(info.text, info.missing.join(', ')));
client.on('data', (member, previous) => member.data.status !== previous.status && member.user);
client.on('tokenExpiring', ({ expiresAtMs, refreshing }) => refreshing || expiresAtMs - client.serverNow());
client.on('tokenRefreshed', ({ expiresAtMs }) => expiresAtMs === client.tokenExpiresAtMs);
client.join('lobby', 'Ada', { start: { x: 2500, y: 2500 }, data: { colour: '#e4572e' } }).connect();
const dataSent: boolean = client.setData({ status: 'busy', colour: null });
console.log(dataSent, client.reconnectNow());
if (client.state === 'joined') {
  client.walkTo(100, 200, { speed: 300 });
  client.moveTo(10, 10);
  const sent: boolean = client.chat('hello');
  console.log(sent, client.chatWaitMs(), client.serverNow(), client.stats.wireBytesIn);
}
const at = client.me?.positionAt(client.serverNow());
console.log(at?.x, nameProblem('   '), compatibility(1, '0.0.9')?.text, DEFAULT_TUNING.easeMs);
const limits: Limits = client.limits;
console.log(limits.roomCapacity, version, revision, protocol);

const bytes: Uint8Array = encodeClientMessage({ join: { room: 'lobby', name: 'Ada' } }, limits);
const msg: ServerMessage = decodeServerMessage(bytes);
console.log(msg.welcome?.protocolRevision, msg.motion.length);

const fromBundle = new bundled.AmbleClient({ url: 'ws://127.0.0.1:3000/ws', reconnect: false });
console.log(fromBundle.state, bundled.VERSION, bundled.decodeMotion([0]).records);

// The page lifecycle: off, or listened to on a target of your own (the window's fits).
new AmbleClient({ pageLifecycle: false });
new AmbleClient({ pageTarget: window });
// @ts-expect-error: pageLifecycle is a boolean
new AmbleClient({ pageLifecycle: 'on' });
// @ts-expect-error: no such event
client.on('nope', () => {});
// @ts-expect-error: a `moved` handler gets a Member
client.on('moved', (m: string) => m);
// @ts-expect-error: a position is numbers
client.walkTo('1', 2);
// @ts-expect-error: the state is read-only
client.state = 'open';
// @ts-expect-error: reconnect is a policy or false
new AmbleClient({ reconnect: true });
