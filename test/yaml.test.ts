/*
 * The YAML reader of webhook.ts (parseYaml, scalarAsGoString) against the real thing: every case
 * must read as ghodss/yaml + gopkg.in/yaml.v2, exactly as vendored in adnanh/webhook 2.8.0, read it,
 * per test/yaml/golden.json. Cases and ground truth live in test/yaml/ (cases.ts, golden.ts,
 * probe.go); `node_modules/.bin/node test/yaml/golden.ts` regenerates golden.json.
 *
 * adnanh's own hook files are read from his source tree (adnanhSource() in peer.ts), never copied
 * here. Without that tree those cases are skipped with a loud message, or fail when CI is set; our
 * own cases always run. With Go and the tree, the probe is built and re-run live, to prove that
 * golden.json is current.
 *   node_modules/.bin/node --test test/yaml.test.ts
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { parseYaml, readJson, readYaml, scalarAsGoString, YamlError } from '../webhook.ts';
import { adnanhSource } from './peer.ts';
import {
  CORPUS_FILES, corpusCases, corpusName, type DocCase, ownCases, scalarCases, seededRandom, SEED_JSON, SEED_YAML,
} from './yaml/cases.ts';
import { buildProbe, findGo, type GoDoc, readGolden, runProbe, sha256 } from './yaml/golden.ts';

const CI = Boolean(process.env.CI);
const golden = readGolden();
const CORPUS_NAMES = CORPUS_FILES.map(corpusName);

const source = await adnanhSource().catch((e: Error) => e.message);
/** Why adnanh's hook files cannot be checked here, or false when they can. */
const noCorpus = typeof source === 'string' && `adnanh/webhook's source is unavailable: ${source}`;
const corpus = new Map(typeof source === 'string' ? [] : corpusCases(source.dir).map((c) => [c.name, c]));
const go = findGo();
const noProbe = noCorpus || (!go && 'no Go toolchain (go on PATH or /usr/local/go/bin) to build the probe');
for (const why of [noCorpus, noProbe !== noCorpus && noProbe]) {
  if (why) process.stderr.write(`\n#### YAML reader: ${CI ? 'FAILING' : 'SKIPPING'} cases that need it: ${why}\n\n`);
}

/**
 * Options for a test that needs a peer: skipped (loudly, above) without it, but run when CI is set,
 * so that it fails there instead.
 */
const needs = (why: string | false): { skip: string | false } => ({ skip: !CI && why });

/** A corpus case, or a failure saying why there is none. */
function corpusCase(name: string): DocCase {
  const c = corpus.get(name);
  if (!c) assert.fail(noCorpus || `no corpus file for ${name}`);
  return c;
}

function parseError(text: string): YamlError {
  try {
    parseYaml(text);
  } catch (e) {
    assert.ok(e instanceof YamlError, `expected a YamlError, got ${String(e)}`);
    return e;
  }
  assert.fail('expected a YamlError');
}

const STALE = 'golden.json is stale: node_modules/.bin/node test/yaml/golden.ts';

describe('golden.json is current', () => {
  test('it holds every case of ours, with the same text, and every corpus file by name', () => {
    const own = ownCases();
    assert.deepEqual(Object.keys(golden.docs).sort(), [...CORPUS_NAMES, ...own.map((c) => c.name)].sort(), STALE);
    for (const c of own) assert.equal(golden.docs[c.name].yaml, c.yaml, `${c.name}: ${STALE}`);
    assert.deepEqual(Object.keys(golden.scalars).sort(), [...new Set(scalarCases())].sort(), STALE);
  });
  test("it was made from adnanh's hook files as they are", needs(noCorpus), () => {
    for (const name of CORPUS_NAMES) {
      const version = typeof source === 'string' ? '?' : source.version;
      const why = `${name} (golden from adnanh ${golden.adnanh}, source is ${version}): ${STALE}`;
      assert.equal(golden.docs[name].sha256, sha256(corpusCase(name).yaml), why);
    }
  });
  test('the Go probe, built from adnanh\'s vendored ghodss/yaml + yaml.v2, still says the same', needs(noProbe), () => {
    if (typeof source === 'string' || !go) assert.fail(String(noProbe));
    assert.deepEqual(runProbe(buildProbe(go, source), source), golden, STALE);
  });
});

function hasNonFinite(v: unknown): boolean {
  if (typeof v === 'number') return !Number.isFinite(v);
  return v !== null && typeof v === 'object' && Object.values(v).some(hasNonFinite);
}

/** A random document: the same as Go, or a divergence of ours that is allowed. */
function checkFuzz(c: DocCase, go: GoDoc): void {
  let value: unknown;
  try {
    value = parseYaml(c.yaml).value;
  } catch (e) {
    assert.ok(e instanceof YamlError, String(e));
    if (go.json !== undefined) assert.match(e.message, /duplicate key|not supported/);
    return;
  }
  if (go.json !== undefined) assert.deepEqual(value, JSON.parse(go.json));
  else assert.ok(/json: unsupported value/.test(go.err ?? '') && hasNonFinite(value), `Go: ${go.err}`);
}

/** One case against what Go made of it, allowing for the divergences cases.ts declares. */
function checkCase(c: DocCase): void {
  const go = golden.docs[c.name];
  if (c.diverge === 'fuzz') {
    checkFuzz(c, go);
  } else if (c.diverge === 'duplicate') {
    assert.ok(go.json !== undefined, 'adnanh accepts it');
    assert.match(parseError(c.yaml).message, /duplicate key/);
  } else if (c.diverge === 'refused') {
    assert.match(parseError(c.yaml).message, /not supported/);
  } else if (c.diverge === 'nonfinite') {
    assert.match(go.err ?? '', /json: unsupported value/);
    assert.deepEqual(parseYaml(c.yaml).value, c.expect);
  } else if (go.json !== undefined) {
    assert.deepEqual(parseYaml(c.yaml).value, JSON.parse(go.json));
  } else {
    parseError(c.yaml); // adnanh refuses it: so do we
  }
}

describe('reads what adnanh reads, as adnanh reads it', () => {
  for (const name of CORPUS_NAMES) test(name, needs(noCorpus), () => checkCase(corpusCase(name)));
  for (const c of ownCases()) test(c.name, () => checkCase(c));
});

describe('scalarAsGoString', () => {
  test('renders every scalar as ghodss does into a Go string field', () => {
    for (const s of scalarCases()) {
      const go = golden.scalars[s];
      assert.ok(go.str !== undefined, `Go reads ${s}`);
      const holder = parseYaml(`v: ${s}`).value as Record<string, unknown>;
      // Go leaves a string field empty for null: we say undefined.
      assert.equal(scalarAsGoString(holder.v, holder, 'v') ?? '', go.str, `v: ${s}`);
    }
  });
  test('works from the value alone where the value tells', () => {
    assert.equal(scalarAsGoString(1), '1');
    assert.equal(scalarAsGoString(-42), '-42');
    assert.equal(scalarAsGoString(true), 'true');
    assert.equal(scalarAsGoString(false), 'false');
    assert.equal(scalarAsGoString(1.5), '1.5');
    assert.equal(scalarAsGoString(0.1), '0.1');
    assert.equal(scalarAsGoString(3.14159265358979), '3.1415927'); // through float32, as Go does
    assert.equal(scalarAsGoString(1e21), '1e+21');
    assert.equal(scalarAsGoString(1e-5), '1e-05');
    assert.equal(scalarAsGoString(-0), '-0');
    assert.equal(scalarAsGoString(Infinity), '+Inf');
    assert.equal(scalarAsGoString(-Infinity), '-Inf');
    assert.equal(scalarAsGoString(NaN), 'NaN');
    assert.equal(scalarAsGoString('text'), 'text');
    assert.equal(scalarAsGoString(null), undefined);
    assert.equal(scalarAsGoString(undefined), undefined);
    assert.equal(scalarAsGoString({}), undefined);
    assert.equal(scalarAsGoString([]), undefined);
  });
  test('holder and key give Go exact text where a JS number cannot', () => {
    const doc = parseYaml('f: 1234567.0\ni: 1234567\nbig: 12345678901234567890\nlist: [1e+6, 7]\n').value as {
      f: number; i: number; big: number; list: number[];
    };
    assert.equal(doc.f, doc.i);
    assert.equal(scalarAsGoString(doc.f, doc, 'f'), '1.234567e+06');
    assert.equal(scalarAsGoString(doc.i, doc, 'i'), '1234567');
    assert.equal(scalarAsGoString(doc.big, doc, 'big'), '12345678901234567890');
    assert.equal(scalarAsGoString(doc.list[0], doc.list, 0), '1e+06');
    assert.equal(scalarAsGoString(doc.list[1], doc.list, 1), '7');
    assert.equal(scalarAsGoString('other', doc, 'f'), 'other', 'a value that is not the one read is rendered alone');
  });
});

describe('the seed hook', () => {
  test('reads the same from JSON and from YAML, and as JSON.parse reads it', () => {
    const fromJson = parseYaml(SEED_JSON).value;
    assert.deepEqual(fromJson, JSON.parse(SEED_JSON));
    assert.deepEqual(parseYaml(SEED_YAML).value, fromJson);
  });
  test('adnanh reads both the same too', () => {
    assert.deepEqual(JSON.parse(golden.docs['seed hook yaml'].json ?? ''), JSON.parse(SEED_JSON));
  });
});

/** Inputs, where their error is reported, and what it says. */
const POSITIONED_ERRORS: [string, number, number, RegExp][] = [
  ['a: 1\n b: 2\n', 2, 3, /mapping values are not allowed in this context/],
  ['a: 1\nb\n', 2, 1, /could not find expected ':'/],
  ['\ta: 1\n', 1, 1, /found character that cannot start any token/],
  ['a:\n\tb: 1\n', 2, 1, /found character that cannot start any token/],
  ['a:\n  - b\n  c: d\n', 3, 3, /did not find expected '-' indicator/],
  ['a: b: c\n', 1, 5, /mapping values are not allowed/],
  ['a: [1, 2\n', 2, 1, /did not find expected ',' or '\]'/],
  ['a: 1\na: 2\n', 2, 1, /^line 2, column 1: duplicate key "a"$/],
  ['x:\n  k: 1\n  "k": 2\n', 3, 3, /duplicate key "k"/],
  ['x:\n  y: 1\n  yes: 2\n', 3, 3, /duplicate key "true"/], // YAML 1.1: both are the boolean true
  ['a: *nope\n', 1, 4, /unknown anchor 'nope' referenced/],
  ['a: |0\n  x\n', 1, 5, /indentation indicator equal to 0/],
  ['a: |\n\tx\n', 2, 1, /tab character where an indentation space is expected/],
  ['a: 1\n...\nb: 2\n', 3, 1, /did not find expected <document start>/],
  ['{a: http://x}\n', 1, 9, /found unexpected ':'/],
  ['? [a]\n: v\n', 1, 3, /cannot be a mapping key/],
  ['~: v\n', 1, 1, /mapping key may not be null/],
  ['a: \u0001\n', 1, 4, /control characters are not allowed/],
  ['a:\n  b: "x\n', 3, 1, /found unexpected end of stream \(while scanning a quoted scalar at line 2, column 6\)/],
];

describe('errors', () => {
  for (const [text, line, column, what] of POSITIONED_ERRORS) {
    test(`${JSON.stringify(text)} -> line ${line}, column ${column}`, () => {
      const e = parseError(text);
      assert.match(e.message, what);
      assert.equal(e.line, line, e.message);
      assert.equal(e.column, column, e.message);
      assert.ok(e.message.startsWith(`line ${line}, column ${column}: `), e.message);
    });
  }

  test('never show the content of a scalar', () => {
    const secret = 'Zq9-hunter2';
    const texts = [
      `token: "${secret}`,
      `token: '${secret}`,
      `token: "${secret}\\q"`,
      `token: "${secret}\\x4"`,
      `token: "${secret}\\ud800"`,
      `token: !!int ${secret}`,
      `token: !!float "${secret}"`,
      `token: ${secret}\n  bad: indentation`,
      `token: ${secret}: x`,
      `{token: ${secret}:x}`,
      `- ${secret}\nk: v`,
      `token: "${secret}"\n\tx: 1`,
      `token: |\n  ${secret}\n\tx`,
      `token: "${secret}\n---\n"`,
      `[${secret}`,
      `${secret}\n${secret}: x`,
      `token: ${secret} "x"\nk`,
    ];
    for (const text of texts) {
      const e = parseError(text);
      assert.ok(!e.message.includes(secret.slice(0, 5)), `${JSON.stringify(text)} gave ${e.message}`);
    }
  });

  test('refuse nesting too deep for the stack', () => {
    assert.match(parseError('['.repeat(5000)).message, /nesting deeper than 1000 levels/);
    assert.match(parseError('- '.repeat(3000) + 'x\n').message, /nesting deeper than 1000 levels/);
  });

  test('refuse aliases that blow the document up', () => {
    const levels = ['a: &a [x, x, x, x, x, x, x, x, x, x]'];
    for (let i = 1; i < 8; i++) {
      const prev = String.fromCharCode(96 + i);
      const name = String.fromCharCode(97 + i);
      levels.push(`${name}: &${name} [${Array(10).fill(`*${prev}`).join(', ')}]`);
    }
    assert.match(parseError(levels.join('\n') + '\n').message, /aliases expand the document past 1000000 nodes/);
  });
});

describe('the LineMap', () => {
  test('gives the line of every key and every item', () => {
    const text = [
      '# hooks', //                1
      '- id: a', //                2
      '  cmd: x', //               3
      '  args:', //                4
      '    - one', //              5
      '    -', //                  6
      '      two: 2', //           7
      '    - [p,', //              8
      '       q]', //              9
      '', //                       10
      '- id: b', //                11
      '  env: {k: v,', //          12
      '        "j":', //           13
      '           w}', //          14
    ].join('\n');
    const { value, lines } = parseYaml(text);
    const hooks = value as { id: string; args: unknown[]; env: object }[];
    assert.deepEqual([...lines.get(hooks)!], [['0', 2], ['1', 11]]);
    assert.deepEqual([...lines.get(hooks[0])!], [['id', 2], ['cmd', 3], ['args', 4]]);
    assert.deepEqual([...lines.get(hooks[0].args)!], [['0', 5], ['1', 7], ['2', 8]]);
    assert.deepEqual([...lines.get(hooks[0].args[2] as object)!], [['0', 8], ['1', 9]]);
    assert.deepEqual([...lines.get(hooks[1].env)!], [['k', 12], ['j', 13]]);
  });
  test('works for JSON', () => {
    const { value, lines } = parseYaml('{"a": [1,\n 2],\n "b":\n {"c": 3}}');
    const doc = value as { a: number[]; b: object };
    assert.deepEqual([...lines.get(doc)!], [['a', 1], ['b', 3]]);
    assert.deepEqual([...lines.get(doc.a)!], [['0', 1], ['1', 2]]);
    assert.deepEqual([...lines.get(doc.b)!], [['c', 4]]);
  });
  test("works for adnanh's JSON test file, YAML flow syntax included", needs(noCorpus), () => {
    const tmpl = parseYaml(corpusCase(corpusName('test/hooks.json.tmpl')).yaml);
    const hooks = tmpl.value as { id: string; 'trigger-rule': { and: object[] } }[];
    const multi = hooks[1]['trigger-rule'].and;
    assert.equal(tmpl.lines.get(hooks)!.get('1'), 58);
    assert.equal(tmpl.lines.get(hooks[1])!.get('id'), 59);
    assert.equal(tmpl.lines.get(multi)!.get('0'), 88); // the `"or": [` pair inside a flow sequence
    assert.equal(tmpl.lines.get(multi[0])!.get('or'), 88);
  });
  test('gives merged keys the line where they are written', () => {
    const { value, lines } = parseYaml('base: &b\n  x: 1\n  z: 2\nhook:\n  <<: *b\n  z: 3\n');
    const hook = (value as { hook: object }).hook;
    assert.deepEqual(hook, { x: 1, z: 3 });
    assert.deepEqual(Object.fromEntries(lines.get(hook)!), { x: 2, z: 6 });
  });
});

describe('values', () => {
  test('keys are own, plain properties, "__proto__" included', () => {
    const value = parseYaml('__proto__: {polluted: 1}\nconstructor: x\n').value as Record<string, unknown>;
    assert.equal(Object.getPrototypeOf(value), Object.prototype);
    assert.ok(Object.hasOwn(value, '__proto__'));
    assert.deepEqual(Object.keys(value), ['__proto__', 'constructor']);
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
    const d = Object.getOwnPropertyDescriptor(value, 'constructor');
    assert.deepEqual(d, { value: 'x', writable: true, enumerable: true, configurable: true });
  });
  test('an alias gives a copy, as in Go', () => {
    const doc = parseYaml('a: &x {k: [1]}\nb: *x\n').value as { a: { k: number[] }; b: { k: number[] } };
    assert.deepEqual(doc.a, doc.b);
    assert.notEqual(doc.a, doc.b);
    assert.notEqual(doc.a.k, doc.b.k);
  });
  test('only the first document counts', () => {
    assert.deepEqual(parseYaml('a: 1\n---\nb: 2\n').value, { a: 1 });
    assert.deepEqual(parseYaml('--- 1\n--- 2\n').value, 1);
  });
  test('empty input, comments only, or an empty document are null', () => {
    for (const text of ['', '\n', '# x\n', '---\n', '--- ~\n']) assert.equal(parseYaml(text).value, null, text);
  });
});

describe('JSON read directly (readJson)', () => {
  type Reading = ReturnType<typeof readYaml>;
  /** readJson's reading of `text` is the three stages' one: values, every line and every Go rendering. */
  const assertSameReading = (text: string, direct: Reading) => {
    const stages = readYaml(text);
    assert.deepEqual(direct.value, stages.value);
    const walk = (x: unknown, y: unknown, where: string): void => {
      if (typeof x !== 'object' || x === null) return;
      assert.deepEqual([...direct.lines.get(x)!], [...stages.lines.get(y as object)!], `lines of ${where}`);
      const [a, b] = [x as Record<string, unknown>, y as Record<string, unknown>];
      for (const k of Object.keys(a)) {
        assert.equal(scalarAsGoString(a[k], a, k), scalarAsGoString(b[k], b, k), `Go text of ${where}.${k}`);
        walk(a[k], b[k], `${where}.${k}`);
      }
    };
    walk(direct.value, stages.value, '(top)');
  };
  /** parseYaml gives what the stages give: the same reading, or the same error. */
  const assertLeftToStages = (text: string) => {
    assert.equal(readJson(text), undefined, JSON.stringify(text.slice(0, 80)));
    let stages: Reading | Error;
    try {
      stages = readYaml(text);
    } catch (e) {
      stages = e as Error;
    }
    if (stages instanceof Error) assert.throws(() => parseYaml(text), { message: stages.message });
    else assert.deepEqual(parseYaml(text).value, stages.value);
  };

  test('reads every case it takes exactly as the three stages do', () => {
    const cases = [...ownCases(), ...corpus.values()];
    const direct = cases.flatMap((c) => readJson(c.yaml) ?? []);
    cases.forEach((c) => ((reading) => reading && assertSameReading(c.yaml, reading))(readJson(c.yaml)));
    assert.ok(direct.length >= 6, `only ${direct.length} of ${cases.length} cases were read directly`);
  });

  test('never takes a text the three stages refuse or read otherwise (JSON fuzz)', () => {
    const { random, pick } = seededRandom(0x3c6ef372);
    const fragments = ['"', '\\', '\\/', '\\u00e9', '\\ud800', '\\x41', ':', ',', '[', ']', '{', '}', ' ', '\n',
      '\r', '\t', '#', '-', '0', '1.5', 'e3', 'true', 'null', '---\n', '...', '\u2028', '\u00e9', '\x7f', '&a ', '*a',
      '!!str ', '? ', '<<', '"k": ', '"k": 1, ', 'k'.repeat(1030)];
    const small = '{"a": [1, -0.5e1, "x"], "b": {"c": null}}';
    const seeds = [SEED_JSON, JSON.stringify(JSON.parse(SEED_JSON), null, 2), small];
    let direct = 0;
    for (let i = 0; i < 3000; i++) {
      const chars = Array.from(pick(seeds));
      for (let k = Math.floor(random() * 3); k >= 0; k--) {
        const at = Math.floor(random() * (chars.length + 1));
        if (random() < 0.5) chars.splice(at, 0, pick(fragments));
        else chars.splice(at, 1 + Math.floor(random() * 2));
      }
      const text = chars.join('');
      const reading = readJson(text);
      if (reading === undefined) continue;
      direct++;
      assertSameReading(text, reading); // readYaml throws if the stages refuse it
    }
    assert.ok(direct >= 300, `only ${direct} fuzzed texts were read directly`);
  });

  test('reads JSON hook files directly, however they are laid out', () => {
    const root = path.resolve(import.meta.dirname, '..');
    const files = ['examples/hooks/web.json', 'examples/hooks/echo.json', 'deploy/hooks/web.json'];
    const rendered = files.map((f) =>
      fs.readFileSync(path.join(root, f), 'utf8').replaceAll('{{ getenv \\"HOOK_TOKEN\\" }}', 'token-from-env'),
    );
    const seed = JSON.parse(SEED_JSON) as unknown;
    const layouts = [SEED_JSON, ...[0, 2, 4, '\t'].map((indent) => JSON.stringify(seed, null, indent))];
    const texts = [...rendered, ...layouts, ...layouts.map((t) => t.replaceAll('\n', '\r\n') + '\r\n')];
    texts.push('{"n": [0, -0, 1.50, 1e3, -2E-2, 9007199254740993, 123456789012345678901234567890], "w": [true, null]}');
    texts.push(`{"${'k'.repeat(1022)}": 1}`); // the ':' 1024 characters after the key's start: YAML's limit
    texts.push('{"s": "tab\\t \\"q\\" \\\\ \\u00e9 \\u0000 caf\u00e9 \u20ac", "__proto__": {"x": 1}, "": ""}\n');
    for (const text of texts) {
      const reading = readJson(text);
      assert.ok(reading, `not read directly: ${JSON.stringify(text.slice(0, 80))}`);
      assertSameReading(text, reading);
    }
  });

  test('leaves to the three stages what YAML reads its own way or refuses', () => {
    const texts = [
      '\t[1]', // a tab before the document
      '[1]\n\t', // and after it
      '["a\\/b"]', // an escape yaml.v2 refuses
      '["\\ud83d\\ude00"]', // surrogate escapes
      '["\u2028"]', // a line break to YAML
      '["\u0085"]',
      '["\u007f"]', // a control character
      '\ufeff[1]', // a byte order mark
      '["\u{1F600}"]', // outside the BMP
      '{"a"\n: 1}', // a key's ':' on a later line
      `{"${'k'.repeat(1023)}": 1}`, // or past YAML's simple-key limit (1025 characters after the key's start)
      '{"a": 1, "a": 2}', // a repeated key
      '[1,]', // not JSON: a trailing comma,
      '[1] # note', // a comment,
      '[1]\n---\n[2]\n', // a second document,
      '[a]', // a plain word,
      '"top"', // a scalar document
      '1',
      `${'['.repeat(150)}${']'.repeat(150)}`, // nesting past the direct reader's limit
    ];
    for (const text of texts) assertLeftToStages(text);
  });
});
