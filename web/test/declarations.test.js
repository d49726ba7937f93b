// The hand-written TypeScript declarations (amble.d.ts, codec.d.ts,
// member.d.ts) declare exactly the values each module exports, so a new
// export cannot ship untyped and a removed one cannot linger in the types.
// That the types are right is tsc's job (tests/it/node_sdk.rs checks
// web/test/types/usage.ts against the packed package with --strict).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

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
