// The hand-written TypeScript declarations (amble.d.ts, codec.d.ts,
// member.d.ts) declare exactly the values each module exports, so a new
// export cannot ship untyped and a removed one cannot linger in the types.
// Every field of every shared vector, and every ErrorCode and LeaveReason,
// is declared in codec.d.ts, so a schema change reaches the types too.
// That the types are right is tsc's job (tests/it/node_sdk.rs checks
// web/test/types/usage.ts against the packed package with --strict).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { ErrorCode, LeaveReason } from '../codec.js';

/** The value names a .d.ts exports: declared consts, functions and classes, and value re-exports. */
function declaredValues(file) {
  const text = readFileSync(new URL(`../${file}`, import.meta.url), 'utf8');
  const names = new Set();
  for (const m of text.matchAll(/^export declare (?:const|function|class) ([A-Za-z_$][\w$]*)/gm)) names.add(m[1]);
  for (const m of text.matchAll(/^export \{([^}]*)\} from '[^']+';$/gm)) {
    for (const n of m[1].split(',')) if (n.trim()) names.add(n.trim());
  }
  return [...names].sort();
}

for (const module of ['amble', 'codec', 'member']) {
  test(`${module}.d.ts declares every value ${module}.js exports, and no other`, async () => {
    const exported = Object.keys(await import(`../${module}.js`)).sort();
    assert.deepEqual(declaredValues(`${module}.d.ts`), exported, `update web/${module}.d.ts`);
  });
}

const codecTypes = readFileSync(new URL('../codec.d.ts', import.meta.url), 'utf8');

test('codec.d.ts declares every field the shared vectors have', () => {
  const doc = JSON.parse(readFileSync(new URL('./vectors.json', import.meta.url), 'utf8'));
  const keys = new Set();
  const walk = (v) => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object') {
      for (const [k, inner] of Object.entries(v)) {
        keys.add(k);
        walk(inner);
      }
    }
  };
  for (const v of doc.vectors) walk(v.json);
  const missing = [...keys].filter((k) => !new RegExp(`\\b${k}\\??:`).test(codecTypes)).sort();
  assert.deepEqual(missing, [], 'fields of the vectors that web/codec.d.ts does not declare');
});

for (const [name, values] of Object.entries({ ErrorCode, LeaveReason })) {
  test(`codec.d.ts declares ${name} as codec.js has it`, () => {
    const block = new RegExp(`export declare const ${name}: Readonly<\\{([^}]*)\\}>;`).exec(codecTypes);
    assert.ok(block, `no ${name} in codec.d.ts`);
    const declared = Object.fromEntries([...block[1].matchAll(/(\w+): (\d+);/g)].map((m) => [m[1], Number(m[2])]));
    assert.deepEqual(declared, { ...values });
  });
}
