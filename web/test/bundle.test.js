// The versioned bundle, web/dist/amble-<version>.js (web/scripts/bundle.mjs):
// the committed file is what the script makes from the SDK's modules now,
// it exports what they export, and its codec round-trips the shared vectors.
// The package carries the repository's licence texts.
// The bundler refuses what it does not understand.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

import { BundleError, WEB_DIR, bundle, parseModule } from '../scripts/bundle.mjs';

const built = bundle(WEB_DIR);
const pkg = JSON.parse(readFileSync(path.join(WEB_DIR, 'package.json'), 'utf8'));
const vectors = JSON.parse(readFileSync(new URL('./vectors.json', import.meta.url), 'utf8'));

test('the committed bundle is what web/scripts/bundle.mjs makes now', () => {
  const dist = path.join(WEB_DIR, 'dist');
  const stale = 'web/dist is stale: run `node web/scripts/bundle.mjs` and commit web/dist';
  assert.equal(built.name, `amble-${pkg.version}.js`);
  assert.deepEqual(readdirSync(dist).sort(), [`amble-${pkg.version}.d.ts`, built.name], stale);
  assert.ok(readFileSync(path.join(dist, built.name), 'utf8') === built.text, stale);
  assert.equal(readFileSync(path.join(dist, `amble-${pkg.version}.d.ts`), 'utf8'), built.types, stale);
});

test('the package exports the bundle under ./bundle, with its types', () => {
  assert.deepEqual(pkg.exports['./bundle'], {
    types: `./dist/amble-${pkg.version}.d.ts`,
    default: `./dist/${built.name}`,
  });
});

test("the package's licence files are the repository's", () => {
  for (const name of ['LICENSE-MIT', 'LICENSE-APACHE']) {
    const copy = readFileSync(path.join(WEB_DIR, name), 'utf8');
    assert.ok(copy === readFileSync(path.join(WEB_DIR, '..', name), 'utf8'), `copy ../${name} to web/${name}`);
    assert.ok(pkg.files.includes(name), name);
  }
});

const sdk = await import(`../dist/${built.name}`);

test('the bundle exports its version and protocol revision, and everything the modules export', async () => {
  assert.equal(sdk.VERSION, pkg.version);
  assert.equal(sdk.PROTOCOL_REVISION, vectors.protocol_revision);
  const names = new Set();
  for (const m of ['amble.js', 'codec.js', 'member.js']) {
    for (const [name, value] of Object.entries(await import(`../${m}`))) {
      names.add(name);
      assert.equal(typeof sdk[name], typeof value, name);
    }
  }
  assert.deepEqual(Object.keys(sdk).sort(), [...names].sort());
});

test("the bundle's codec round-trips every shared vector", () => {
  const codecs = {
    ClientMessage: [sdk.decodeClientMessage, (m) => sdk.encodeClientMessage(m)],
    ServerMessage: [sdk.decodeServerMessage, sdk.encodeServerMessage],
  };
  for (const v of vectors.vectors) {
    const [decode, encode] = codecs[v.type];
    const msg = decode(new Uint8Array(Buffer.from(v.hex, 'hex')));
    assert.deepEqual(msg, v.json, v.name);
    assert.equal(Buffer.from(encode(msg)).toString('hex'), v.hex, v.name);
  }
  assert.throws(() => sdk.decodeServerMessage(new Uint8Array([0xff])), sdk.DecodeError);
});

test("the bundle's client is the SDK's: it speaks the subprotocol and checks names", () => {
  const opened = [];
  class FakeSocket {
    constructor(url, protocol) {
      opened.push([url, protocol]);
    }
  }
  const client = new sdk.AmbleClient({ url: 'ws://test/ws', WebSocket: FakeSocket, setTimeout: () => 0 });
  assert.throws(() => client.join('no spaces', 'Me'), RangeError);
  client.join('lobby', 'Me');
  assert.deepEqual(opened, [['ws://test/ws', 'amble.v1']]);
  assert.equal(client.state, sdk.State.CONNECTING);
});

test('the bundler refuses what it does not understand, naming the file and line', () => {
  const refused = (source, why) =>
    assert.throws(() => parseModule('x.js', source), (err) => err instanceof BundleError && why.test(err.message), source);
  refused("import a from './a.js';", /x\.js:1: a form of import or export/);
  refused("import * as a from './a.js';", /x\.js:1: a form/);
  refused("const x = 1;\nimport { a as b } from './a.js';", /x\.js:2: 'a as b' is not a plain name/);
  refused("import { a } from 'some-package';", /only '\.\/name\.js'/);
  refused("import { a } from '../a.js';", /only '\.\/name\.js'/);
  refused("import './side-effect.js';", /a form/);
  refused('export default 1;', /a form/);
  refused("export * from './a.js';", /a form/);
  refused('export let x = 1;', /a form/);
  refused('const a = 1;\nexport { a as b };', /not a plain name/);
  refused("export { a } from './a.js';", /a form/);
  refused("const m = await import('./a.js');", /dynamic import/);
  refused('const u = import.meta.url;', /import\.meta/);
  refused('  export const x = 1;', /indented/);
});

test('the bundler reads multi-line imports and export lists, and refuses a cycle', () => {
  const m = parseModule('x.js', "import {\n  a,\n  b,\n} from './a.js';\nexport const c = a + b;\nexport { a };\n");
  assert.deepEqual(m.imports, [{ names: ['a', 'b'], from: 'a.js', line: 1 }]);
  assert.deepEqual(m.exports, ['c', 'a']);
  assert.equal(m.body, 'const c = a + b;\n');
  const dir = mkdtempSync(path.join(tmpdir(), 'amble-bundle-'));
  writeFileSync(path.join(dir, 'package.json'), '{"version":"1.0.0"}');
  writeFileSync(path.join(dir, 'amble.js'), "import { b } from './b.js';\nexport const VERSION = '1.0.0';\n");
  writeFileSync(path.join(dir, 'b.js'), "import { VERSION } from './amble.js';\nexport const b = 1;\n");
  assert.throws(() => bundle(dir), /an import cycle: amble\.js -> b\.js -> amble\.js/);
  writeFileSync(path.join(dir, 'b.js'), 'export const b = 1;\n');
  writeFileSync(path.join(dir, 'package.json'), '{"version":"1.0.1"}');
  assert.throws(() => bundle(dir), /VERSION '1\.0\.0' but web\/package\.json has 1\.0\.1/);
});
