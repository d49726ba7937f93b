// The demo in real headless Chromium against the real server binary: two
// pages join one room; a click-to-walk in one arrives in the other; free
// movement with the keys; chat both ways (panel and bubble); leaving drops
// the member on the other page. Saves test/artifacts/room.png.
//
// Builds nothing: it runs the binary in AMBLE_BIN (default
// ../target/debug/amble relative to web/) on 127.0.0.1:0. Needs Chromium at
// /usr/bin/chromium; without it the test fails, it does not skip.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const WEB = fileURLToPath(new URL('..', import.meta.url));
const CHROMIUM = '/usr/bin/chromium';
const BIN = resolve(WEB, process.env.AMBLE_BIN ?? '../target/debug/amble');
const ARTIFACTS = join(WEB, 'test', 'artifacts');
const WAIT = { timeout: 15_000, polling: 50 };

/** Resolves with the value, or rejects after `ms` saying what did not happen. */
function within(ms, what, promise) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Room capacity for the test server: two, so a third visitor is refused. */
const CAPACITY = '2';

/** Starts the server (on a free port by default); `addr` resolves once it logs its address. */
function startServer(listen = '127.0.0.1:0') {
  const child = spawn(BIN, ['--listen', listen, '--room-capacity', CAPACITY], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'info' },
  });
  let log = '';
  const exited = new Promise((done) => child.once('exit', (code, signal) => done({ code, signal })));
  const addr = new Promise((ok, fail) => {
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      log += chunk;
      const m = /listening.*addr=([0-9.:]+)/.exec(log);
      if (m) ok(m[1]);
    });
    child.once('error', (err) => fail(new Error(`could not start ${BIN}: ${err.message}`)));
    exited.then(({ code, signal }) => fail(new Error(`server exited (${code ?? signal}) before listening:\n${log}`)));
  });
  return { child, exited, addr: within(10_000, 'the server to log its address', addr), log: () => log };
}

async function stopServer(server) {
  if (server.child.exitCode !== null || server.child.signalCode !== null) return;
  server.child.kill('SIGTERM');
  try {
    await within(5000, 'the server to exit on SIGTERM', server.exited);
  } catch {
    server.child.kill('SIGKILL');
    await within(2000, 'the server to exit on SIGKILL', server.exited);
  }
}

test('two browsers in one room: walk, keys, chat, room full, reconnect, leave', { timeout: 60_000 }, async (t) => {
  assert.ok(
    existsSync(CHROMIUM),
    `Chromium is missing at ${CHROMIUM}: install it (apt-get install chromium); this test does not skip`,
  );
  assert.ok(existsSync(BIN), `no server binary at ${BIN}: run \`cargo build\` first, or set AMBLE_BIN`);

  let server = startServer();
  let browser = null;
  const pageErrors = [];
  try {
    const addr = await server.addr;
    let third = null;
    // Playwright gives each launch a fresh temporary profile.
    browser = await within(20_000, 'Chromium to launch', chromium.launch({
      executablePath: CHROMIUM,
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
      timeout: 20_000,
    }));

    const open = async (label) => {
      // Separate contexts: separate storage, like two people.
      const context = await browser.newContext({ viewport: { width: 1280, height: 720 } });
      const page = await context.newPage();
      page.on('pageerror', (err) => pageErrors.push(`${label}: ${err.message}`));
      page.on('console', (msg) => {
        if (msg.type() === 'error') pageErrors.push(`${label} console: ${msg.text()}`);
      });
      await page.goto(`http://${addr}/`, { timeout: 10_000 });
      return page;
    };
    const members = (page) => page.evaluate(() => window.ambleDemo.members());
    const find = async (page, name) => (await members(page)).find((m) => m.name === name);

    const ada = await open('ada');
    const bo = await open('bo');

    await t.test('both join the same room from the lobby', async () => {
      for (const [page, name] of [[ada, 'Ada'], [bo, 'Bo']]) {
        await page.fill('#name', name);
        await page.fill('#room', 'browser-test');
        await page.click('#join');
        await page.waitForFunction(() => window.ambleDemo.state() === 'joined', null, WAIT);
      }
      for (const page of [ada, bo]) {
        await page.waitForFunction(() => window.ambleDemo.members().length === 2, null, WAIT);
        assert.equal(await page.isVisible('#room-view'), true);
        assert.equal(await page.textContent('#room-name'), 'browser-test');
      }
      // Let any step off the shared arrival point finish, as both pages see it.
      await ada.waitForFunction(() => window.ambleDemo.members().every((m) => !m.walking), null, WAIT);
      await bo.waitForFunction(() => window.ambleDemo.members().every((m) => !m.walking), null, WAIT);
      // The lobby of a third visitor lists the room with its two members.
      const rooms = await (await fetch(`http://${addr}/api/rooms`)).json();
      assert.deepEqual(rooms.rooms.find((r) => r.name === 'browser-test'), { name: 'browser-test', members: 2 });
    });

    await t.test('a click to walk in one page arrives at the target in the other', async () => {
      const me = await find(ada, 'Ada');
      const limits = await ada.evaluate(() => window.ambleDemo.limits());
      const goal = {
        x: Math.min(limits.worldWidth - 100, me.x + 350),
        y: Math.max(100, me.y - 200),
      };
      const point = await ada.evaluate(({ x, y }) => window.ambleDemo.worldToCanvas(x, y), goal);
      const box = await ada.locator('#floor').boundingBox();
      await ada.mouse.click(box.x + point.x, box.y + point.y);
      const walk = await ada.waitForFunction(
        () => window.ambleDemo.members().find((m) => m.self && m.walking)?.target,
        null,
        WAIT,
      );
      const target = await walk.jsonValue();
      assert.ok(Math.abs(target.x - goal.x) < 10 && Math.abs(target.y - goal.y) < 10, `walk to ${JSON.stringify(target)}`);
      // The other page animates the walk (seen under way), then shows the arrival.
      await bo.waitForFunction(
        ({ x, y }) => {
          const a = window.ambleDemo.members().find((m) => m.name === 'Ada');
          return a && a.walking && a.target && a.target.x === x && a.target.y === y;
        },
        target,
        WAIT,
      );
      const midway = await find(bo, 'Ada');
      assert.ok(Math.hypot(midway.x - target.x, midway.y - target.y) > 1, 'seen before arriving');
      await bo.waitForFunction(
        ({ x, y }) => {
          const a = window.ambleDemo.members().find((m) => m.name === 'Ada');
          return a && !a.walking && Math.abs(a.x - x) < 0.5 && Math.abs(a.y - y) < 0.5;
        },
        target,
        WAIT,
      );
      // The walk was one message.
      const stats = await ada.evaluate(() => window.ambleDemo.stats());
      assert.ok(stats.movesOut >= 1 && stats.movesOut <= 3, `moves sent: ${stats.movesOut}`);
    });

    await t.test('free movement with the keys shows up on the other page', async () => {
      const start = await find(bo, 'Bo');
      const before = (await bo.evaluate(() => window.ambleDemo.stats())).movesOut;
      await bo.keyboard.down('d');
      await bo.keyboard.down('s');
      await bo.waitForFunction(
        (x0) => window.ambleDemo.members().find((m) => m.self).x >= x0 + 200,
        start.x,
        WAIT,
      );
      await bo.keyboard.up('d');
      await bo.keyboard.up('s');
      const end = await find(bo, 'Bo');
      assert.ok(end.y > start.y + 100, 'moved down-right');
      const sent = (await bo.evaluate(() => window.ambleDemo.stats())).movesOut - before;
      assert.ok(sent >= 1, 'free movement sent moves');
      await ada.waitForFunction(
        ({ x, y }) => {
          const b = window.ambleDemo.members().find((m) => m.name === 'Bo');
          return b && Math.abs(b.x - x) < 1.5 && Math.abs(b.y - y) < 1.5;
        },
        end,
        WAIT,
      );
      const seen = await find(ada, 'Bo');
      assert.ok(Math.hypot(seen.x - start.x, seen.y - start.y) > 200);
      // At most one move per interval (plus the burst) for the whole run.
      const after = (await bo.evaluate(() => window.ambleDemo.stats())).movesOut - before;
      const limits = await bo.evaluate(() => window.ambleDemo.limits());
      assert.ok(after <= 2 + limits.moveBurst + 2, `moves sent: ${after}`);
    });

    await t.test('chat goes both ways, in the panel and as a bubble', async () => {
      const say = async (page, text) => {
        await page.fill('#chat-input', text);
        await page.press('#chat-input', 'Enter');
      };
      await say(ada, 'hello from Ada');
      await bo.waitForFunction(
        (text) => document.querySelector('#messages').textContent.includes(text),
        'hello from Ada',
        WAIT,
      );
      assert.equal((await find(bo, 'Ada')).bubble, 'hello from Ada');
      await say(bo, 'hi Ada, Bo here');
      await ada.waitForFunction(
        (text) => window.ambleDemo.members().find((m) => m.name === 'Bo')?.bubble === text,
        'hi Ada, Bo here',
        WAIT,
      );
      assert.match(await ada.textContent('#messages'), /Bo\s*hi Ada, Bo here/);
      assert.equal(await ada.inputValue('#chat-input'), '', 'the input is cleared after sending');
    });

    await t.test('the HUD shows measured figures', async () => {
      await ada.waitForFunction(() => /\d/.test(document.querySelector('#hud-rtt').textContent), null, WAIT);
      assert.equal(await ada.textContent('#hud-members'), '2');
      assert.equal(await ada.textContent('#hud-state'), 'Connected');
      const stats = await ada.evaluate(() => window.ambleDemo.stats());
      assert.ok(stats.bytesIn > 0 && stats.wireBytesIn > stats.bytesIn);
      mkdirSync(ARTIFACTS, { recursive: true });
      await ada.screenshot({ path: join(ARTIFACTS, 'room.png') });
    });

    await t.test('a third visitor is refused with a clear message: the room is full', async () => {
      third = await open('cy');
      await third.fill('#name', 'Cy');
      await third.fill('#room', 'browser-test');
      await third.click('#join');
      await third.waitForSelector('#lobby-error', { state: 'visible', timeout: WAIT.timeout });
      assert.match(await third.textContent('#lobby-error'), /room is full/);
      assert.equal(await third.isVisible('#lobby'), true);
      assert.equal(await third.evaluate(() => window.ambleDemo.state()), 'open', 'the socket stays open');
      assert.equal((await members(ada)).length, 2);
      await third.context().close();
    });

    await t.test('after a server restart both pages reconnect, rejoin, and keep their places', async () => {
      const adaBefore = await find(ada, 'Ada');
      const boBefore = await find(bo, 'Bo');
      await stopServer(server);
      await ada.waitForFunction(
        () => /Reconnecting/.test(document.querySelector('#banner').textContent),
        null,
        WAIT,
      );
      assert.equal(await ada.isVisible('#room-view'), true, 'the room stays on screen meanwhile');
      // The same port again, so the pages' URL still holds.
      server = startServer(addr);
      await server.addr;
      for (const page of [ada, bo]) {
        await page.waitForFunction(
          () => window.ambleDemo.state() === 'joined' && window.ambleDemo.members().length === 2,
          null,
          { ...WAIT, timeout: 20_000 },
        );
      }
      // The new server put everyone at its arrival point; each page sent its own place back.
      await bo.waitForFunction(
        ({ x, y }) => {
          const a = window.ambleDemo.members().find((m) => m.name === 'Ada');
          return a && Math.abs(a.x - x) < 1.5 && Math.abs(a.y - y) < 1.5;
        },
        adaBefore,
        WAIT,
      );
      await ada.waitForFunction(
        ({ x, y }) => {
          const b = window.ambleDemo.members().find((m) => m.name === 'Bo');
          return b && Math.abs(b.x - x) < 1.5 && Math.abs(b.y - y) < 1.5;
        },
        boBefore,
        WAIT,
      );
      await ada.waitForFunction(() => document.querySelector('#banner').hidden, null, WAIT);
      assert.match(await ada.textContent('#messages'), /Reconnected\./);
    });

    await t.test('leaving drops the member on the other page', async () => {
      await bo.click('#leave');
      await bo.waitForSelector('#lobby', { state: 'visible', timeout: WAIT.timeout });
      await ada.waitForFunction(() => !window.ambleDemo.members().some((m) => m.name === 'Bo'), null, WAIT);
      await ada.waitForFunction(() => !document.querySelector('#people').textContent.includes('Bo'), null, WAIT);
      await ada.waitForFunction(() => document.querySelector('#messages').textContent.includes('Bo left.'), null, WAIT);
    });

    assert.deepEqual(pageErrors, [], 'no errors in the pages');
  } finally {
    if (browser) await within(10_000, 'Chromium to close', browser.close()).catch(() => {});
    await stopServer(server);
  }
});
