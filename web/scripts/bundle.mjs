// Builds the versioned SDK bundle, web/dist/amble-<version>.js: amble.js and
// every module it imports (codec.js, member.js) in one ES module, exporting
// everything each of them exports, VERSION and PROTOCOL_REVISION included.
// Plus web/dist/amble-<version>.d.ts, its types (the hand-written .d.ts
// files beside the modules).
//
// Usage (from anywhere):
//   node web/scripts/bundle.mjs          writes the bundle, removes older ones
//   node web/scripts/bundle.mjs --check  exits 1 when the committed bundle differs
// web/test/bundle.test.js fails when the committed bundle is not what this
// script makes now.
//
// No packages: our modules are plain ES modules, so each module's text is
// kept as it is, wrapped in a function scope (so module-private names never
// meet), its `export` keywords taken off and its exports returned; its
// imports become destructurings of the modules bundled before it. Anything
// else (a default or namespace import, `as`, `export *`, `export let`,
// dynamic import, import.meta, a bare specifier, a cycle) is refused with
// an error naming the file and line: extend this script before using it.

import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The SDK's entry module, under web/. */
export const ENTRY = 'amble.js';

/** Something the bundler does not understand, or an inconsistent version. */
export class BundleError extends Error {
  constructor(message) {
    super(message);
    this.name = 'BundleError';
  }
}

const IDENT = /^[A-Za-z_$][\w$]*$/;
const DECLARATION = /^export (const|function|class|async function) ([A-Za-z_$][\w$]*)\b/;

/**
 * One module's imports ([{ names, from, line }]), exported names, and body
 * (the text with import statements removed and `export ` taken off
 * declarations and lists).
 */
export function parseModule(file, source) {
  const lines = source.split('\n');
  const imports = [];
  const exports = [];
  const body = [];
  const fail = (i, why) => {
    throw new BundleError(`${file}:${i + 1}: ${why}: ${lines[i].trim()}`);
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (/\bimport\s*\(|\bimport\.meta\b/.test(line)) fail(i, 'dynamic import and import.meta are not bundled');
    if (!/^\s*(import|export)\b/.test(line)) {
      body.push(line);
      continue;
    }
    if (/^\s/.test(line)) fail(i, 'an indented import or export');
    // A statement, possibly over several lines, up to its `;`.
    let statement = line;
    const first = i;
    while (!statement.trimEnd().endsWith(';') && !DECLARATION.test(statement) && i + 1 < lines.length) {
      statement += '\n' + lines[++i];
    }
    const declared = DECLARATION.exec(statement);
    if (declared) {
      exports.push(declared[2]);
      body.push(line.slice('export '.length));
      continue;
    }
    const imported = /^import\s*\{([^}]*)\}\s*from\s*'([^']+)';$/.exec(statement.trim());
    if (imported) {
      const from = imported[2];
      if (!/^\.\/[\w.-]+\.js$/.test(from)) fail(first, `only './name.js' beside ${file} can be bundled, not '${from}'`);
      imports.push({ names: names(imported[1], file, first, lines, fail), from: from.slice(2), line: first + 1 });
      continue;
    }
    const list = /^export\s*\{([^}]*)\};$/.exec(statement.trim());
    if (list) {
      exports.push(...names(list[1], file, first, lines, fail));
      continue;
    }
    fail(first, 'a form of import or export this bundler does not know');
  }
  return { imports, exports, body: body.join('\n') };
}

function names(list, file, i, lines, fail) {
  const out = list
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
  for (const n of out) if (!IDENT.test(n)) fail(i, `'${n}' is not a plain name (no 'as', no default)`);
  if (out.length === 0) fail(i, 'an empty name list');
  return out;
}

/** The modules `entry` needs under `webDir`, each after those it imports. */
function ordered(webDir, entry) {
  const done = new Map(); // file -> parsed
  const visiting = new Set();
  const visit = (file, chain) => {
    if (done.has(file)) return;
    if (visiting.has(file)) throw new BundleError(`an import cycle: ${[...chain, file].join(' -> ')}`);
    visiting.add(file);
    const full = path.join(webDir, file);
    if (!existsSync(full)) throw new BundleError(`${chain.at(-1) ?? 'entry'} imports ${file}, which is not in ${webDir}`);
    const parsed = parseModule(file, readFileSync(full, 'utf8'));
    for (const imp of parsed.imports) visit(imp.from, [...chain, file]);
    visiting.delete(file);
    done.set(file, parsed);
  };
  visit(entry, []);
  return done;
}

/** The variable holding module `file`'s exports in the bundle. */
const scopeName = (file) => `module_${file.replace(/\W/g, '_')}`;

/**
 * The bundle of the SDK under `webDir`: { name, text, types, version,
 * revision }, `name` its file name in web/dist/, `types` the text of its
 * .d.ts. Throws a BundleError for anything it does not understand, or when
 * amble.js's VERSION is not package.json's version.
 */
export function bundle(webDir) {
  const pkg = JSON.parse(readFileSync(path.join(webDir, 'package.json'), 'utf8'));
  const version = pkg.version;
  if (typeof version !== 'string' || !/^\d+\.\d+\.\d+(-[\w.]+)?$/.test(version)) {
    throw new BundleError(`web/package.json has no version like 1.2.3: ${JSON.stringify(version)}`);
  }
  const modules = ordered(webDir, ENTRY);
  const constant = (file, name) => {
    const m = new RegExp(`^export const ${name} = (.+);$`, 'm').exec(readFileSync(path.join(webDir, file), 'utf8'));
    if (!m) throw new BundleError(`${file} has no \`export const ${name} = ...;\``);
    return JSON.parse(m[1].replaceAll("'", '"'));
  };
  const sdkVersion = constant(ENTRY, 'VERSION');
  if (sdkVersion !== version) {
    throw new BundleError(`${ENTRY} has VERSION '${sdkVersion}' but web/package.json has ${version}: make them one`);
  }
  const revision = constant('codec.js', 'PROTOCOL_REVISION');
  const files = [...modules.keys()];

  const out = [
    `// amble SDK ${version} (protocol amble.v1, revision ${revision}): ${files.join(', ')} in one ES module.`,
    '// Generated by web/scripts/bundle.mjs from those files: do not edit it, change them and run',
    '// `node web/scripts/bundle.mjs`. docs/client.md documents the SDK; each module keeps its own',
    '// scope here, and exports what it exports.',
    '',
  ];
  for (const [file, mod] of modules) {
    out.push(`// ---------------------------------------------------------------- ${file}`);
    out.push(`const ${scopeName(file)} = (() => {`);
    for (const imp of mod.imports) out.push(`const { ${imp.names.join(', ')} } = ${scopeName(imp.from)};`);
    out.push(mod.body.replace(/\n+$/, ''));
    out.push(`return { ${mod.exports.join(', ')} };`);
    out.push('})();');
    out.push('');
  }
  // Every module's exports, the entry's first; a name re-exported by
  // another module is the same value.
  const exported = new Set();
  out.push('// ---------------------------------------------------------------- exports');
  for (const file of [ENTRY, ...files.filter((f) => f !== ENTRY)]) {
    const fresh = modules.get(file).exports.filter((n) => !exported.has(n));
    for (const n of fresh) exported.add(n);
    if (fresh.length > 0) out.push(`export const { ${fresh.join(', ')} } = ${scopeName(file)};`);
  }
  const text = out.join('\n') + '\n';
  const types = [
    `// Types of amble-${version}.js: the hand-written declarations beside the modules it holds.`,
    '// Generated by web/scripts/bundle.mjs.',
    ...files.map((f) => `export * from '../${f}';`),
    '',
  ].join('\n');
  return { name: `amble-${version}.js`, text, types, version, revision };
}

/** The web/ directory this script is in. */
export const WEB_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

function main(args) {
  const b = bundle(WEB_DIR);
  const dist = path.join(WEB_DIR, 'dist');
  const target = path.join(dist, b.name);
  const typesTarget = target.replace(/\.js$/, '.d.ts');
  if (args.includes('--check')) {
    const same = (file, text) => existsSync(file) && readFileSync(file, 'utf8') === text;
    if (!same(target, b.text) || !same(typesTarget, b.types)) {
      console.error(`web/dist/${b.name} is not what the SDK's modules make now: run \`node web/scripts/bundle.mjs\``);
      process.exit(1);
    }
    return;
  }
  mkdirSync(dist, { recursive: true });
  for (const old of readdirSync(dist)) {
    if (/^amble-.*\.(js|d\.ts)$/.test(old) && old !== b.name && old !== path.basename(typesTarget)) {
      rmSync(path.join(dist, old));
      console.log(`removed web/dist/${old}`);
    }
  }
  writeFileSync(target, b.text);
  writeFileSync(typesTarget, b.types);
  console.log(`wrote web/dist/${b.name} (${b.text.length} bytes) and its .d.ts`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  try {
    main(process.argv.slice(2));
  } catch (err) {
    if (!(err instanceof BundleError)) throw err;
    console.error(`bundle: ${err.message}`);
    process.exit(1);
  }
}
