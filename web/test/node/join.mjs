// The SDK under Node (issue #19): joins ROOM as NAME on the amble server at
// URL with Node's own WebSocket, prints the Welcome as one JSON line, then
// waits for a chat from anyone in the room, prints it, and leaves.
// Usage: node --experimental-websocket join.mjs URL ROOM NAME
// (Node 22 has WebSocket without the flag; Node 20 needs it.)
import { AmbleClient } from '../../amble.js';

const [url, room, name] = process.argv.slice(2);
if (!url || !room || !name) {
  console.error('usage: node --experimental-websocket join.mjs URL ROOM NAME');
  process.exit(64);
}
if (typeof WebSocket !== 'function') {
  console.error('this Node has no WebSocket: use Node 22, or Node 20 with --experimental-websocket');
  process.exit(69);
}
const client = new AmbleClient({ url, reconnect: false });
const give_up = setTimeout(() => {
  console.error(`no answer within 10 s (state ${client.state})`);
  process.exit(1);
}, 10_000);
client.on('welcome', ({ me, members }) => {
  console.log(JSON.stringify({ welcome: { me: me.name, members: [...members.values()].map((m) => m.name).sort() } }));
});
client.on('chat', ({ member, text }) => {
  console.log(JSON.stringify({ chat: { from: member?.name ?? null, text } }));
  clearTimeout(give_up);
  client.close();
});
client.on('error', ({ text }) => console.error(`error: ${text}`));
client.on('closed', ({ text, opened }) => {
  if (opened === false) {
    console.error(`closed: ${text}`);
    process.exit(2);
  }
  process.exit(0);
});
client.join(room, name);
