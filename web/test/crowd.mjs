// A crowd for the demo: N bots (default 499, so the room holds 500 with
// the viewer) walk and move freely in one room while headless Chromium
// renders it at 1280x720, zoomed out so that every avatar is on screen.
// Prints what the page measured: frames per second and the script time of
// each frame. A measuring tool, not a test: `npm run crowd`.
//
//   node --experimental-websocket test/crowd.mjs [--bots 499] [--seconds 20] [--headed]
//
// Runs the server binary in AMBLE_BIN (default ../target/debug/amble) on
// 127.0.0.1:0, like the browser test. Traffic stays on loopback.
import { spawn } from 'node:child_process';
import { resolve, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { mkdirSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';
import { decodeServerMessage, encodeClientMessage } from '../codec.js';

const WEB = fileURLToPath(new URL('..', import.meta.url));
const BIN = resolve(WEB, process.env.AMBLE_BIN ?? '../target/debug/amble');
const { values: opts } = parseArgs({
  options: {
    bots: { type: 'string', default: '499' },
    seconds: { type: 'string', default: '20' },
    screenshot: { type: 'string', default: join(WEB, 'test', 'artifacts', 'crowd.png') },
  },
});
const BOTS = Number(opts.bots);
const SECONDS = Number(opts.seconds);

if (typeof WebSocket !== 'function') {
  console.error('needs a WebSocket client: run with node --experimental-websocket');
  process.exit(2);
}

const server = spawn(BIN, ['--listen', '127.0.0.1:0'], { stdio: ['ignore', 'ignore', 'pipe'] });
const addr = await new Promise((ok, fail) => {
  let log = '';
  const timer = setTimeout(() => fail(new Error(`no address logged:\n${log}`)), 10_000);
  server.stderr.setEncoding('utf8');
  server.stderr.on('data', (c) => {
    log += c;
    const m = /listening.*addr=([0-9.:]+)/.exec(log);
    if (m) {
      clearTimeout(timer);
      ok(m[1]);
    }
  });
  server.once('exit', (code) => fail(new Error(`server exited ${code}:\n${log}`)));
});

const rand = (lo, hi) => lo + Math.random() * (hi - lo);
const clamp = (v, lo, hi) => Math.max(lo, Math.min(hi, v));

/** One bot: joins, then walks (half of them) or moves freely, at most one move a second. */
function bot(i) {
  return new Promise((joined, failed) => {
    const ws = new WebSocket(`ws://${addr}/ws`, 'amble.v1');
    ws.binaryType = 'arraybuffer';
    let limits = null;
    let x = 0;
    let y = 0;
    let seq = 0;
    const walker = i % 2 === 0;
    let heading = rand(0, Math.PI * 2);
    const send = (msg) => ws.readyState === 1 && ws.send(encodeClientMessage(msg, limits));
    const step = () => {
      if (ws.readyState !== 1) return;
      const W = limits.worldWidth;
      const H = limits.worldHeight;
      if (walker) {
        const tx = Math.round(clamp(x + rand(-800, 800), 0, W));
        const ty = Math.round(clamp(y + rand(-800, 800), 0, H));
        const speed = Math.round(rand(110, 220));
        send({ move: { position: { x, y }, walk: { target: { x: tx, y: ty }, speed }, seq: ++seq, clientTimeMs: 0 } });
        const ms = (Math.hypot(tx - x, ty - y) / speed) * 1000;
        x = tx;
        y = ty;
        setTimeout(step, ms + rand(300, 2500));
      } else {
        heading += rand(-0.6, 0.6);
        const d = rand(150, 250); // cm in this second
        let nx = x + Math.cos(heading) * d;
        let ny = y + Math.sin(heading) * d;
        if (nx < 0 || nx > W || ny < 0 || ny > H) heading += Math.PI;
        x = Math.round(clamp(nx, 0, W));
        y = Math.round(clamp(ny, 0, H));
        send({ move: { position: { x, y }, walk: null, seq: ++seq, clientTimeMs: 0 } });
        setTimeout(step, rand(1000, 1150));
      }
    };
    ws.onopen = () => send({ join: { room: 'crowd', name: `bot ${i}` } });
    ws.onmessage = (ev) => {
      if (limits) return; // the rest is not read: only the page's figures matter here
      const msg = decodeServerMessage(ev.data);
      if (msg.error) failed(new Error(`bot ${i}: ${msg.error.message}`));
      if (!msg.welcome) return;
      limits = msg.welcome.limits;
      x = Math.round(rand(0, limits.worldWidth));
      y = Math.round(rand(0, limits.worldHeight));
      send({ move: { position: { x, y }, walk: null, seq: ++seq, clientTimeMs: 0 } });
      setTimeout(step, rand(1000, 2000));
      joined(ws);
    };
    ws.onerror = () => failed(new Error(`bot ${i}: socket error`));
  });
}

let browser;
const sockets = [];
try {
  for (let i = 0; i < BOTS; i += 50) {
    const batch = [];
    for (let j = i; j < Math.min(BOTS, i + 50); j++) batch.push(bot(j));
    sockets.push(...(await Promise.all(batch)));
  }
  console.error(`${sockets.length} bots in room crowd`);
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 720 } })).newPage();
  page.on('pageerror', (err) => console.error(`page: ${err.message}`));
  await page.goto(`http://${addr}/#crowd`);
  await page.fill('#name', 'Viewer');
  await page.click('#join');
  await page.waitForFunction(() => window.ambleDemo.state() === 'joined', null, { timeout: 15_000 });
  for (let i = 0; i < 12; i++) await page.evaluate(() => window.ambleDemo.zoom(1 / 1.25));
  const samples = [];
  for (let s = 0; s < SECONDS; s++) {
    await new Promise((r) => setTimeout(r, 1000));
    samples.push(await page.evaluate(() => ({ ...window.ambleDemo.frameStats(), members: window.ambleDemo.members().length, stats: window.ambleDemo.stats() })));
  }
  mkdirSync(join(WEB, 'test', 'artifacts'), { recursive: true });
  await page.screenshot({ path: opts.screenshot });
  const steady = samples.slice(3);
  const first = steady[0].stats;
  const last = steady[steady.length - 1].stats;
  const secs = steady.length - 1;
  console.log(JSON.stringify({
    members: steady[steady.length - 1].members,
    fps_min: Math.min(...steady.map((x) => x.fps)),
    fps_avg: steady.reduce((n, x) => n + x.fps, 0) / steady.length,
    frame_script_ms_avg: steady.reduce((n, x) => n + x.workMsAvg, 0) / steady.length,
    frame_script_ms_max: Math.max(...steady.map((x) => x.workMsMax)),
    updates_in_per_s: (last.motionUpdatesIn - first.motionUpdatesIn) / secs,
    wire_bytes_in_per_s: (last.wireBytesIn - first.wireBytesIn) / secs,
    screenshot: opts.screenshot,
  }, null, 2));
} finally {
  for (const ws of sockets) ws.close();
  await browser?.close();
  server.kill('SIGTERM');
}
