/*
 * The inputs the YAML reader of webhook.ts is checked on against the real thing (ghodss/yaml +
 * gopkg.in/yaml.v2 as vendored in adnanh/webhook 2.8.0, run by probe.go): adnanh's own hook files,
 * read from its source tree at test time (they are adnanh's, not ours to copy), the seed hook
 * operators use, and our small cases for each YAML feature and its edges.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

/**
 * Where we knowingly differ from adnanh:
 *  duplicate  adnanh keeps the last of repeated keys; we refuse the file.
 *  nonfinite  adnanh's generic YAML->JSON step fails on .inf/.nan (they only load into string
 *             fields, see the scalar cases); we return Infinity/NaN and `expect` says how.
 *  refused    adnanh loads it; we refuse it (!!binary).
 *  fuzz       random input: any of the above may apply.
 */
export type Divergence = 'duplicate' | 'nonfinite' | 'refused' | 'fuzz';

export interface DocCase {
  name: string;
  yaml: string;
  diverge?: Divergence;
  expect?: unknown;
}

const HOOKECHO = '/usr/local/bin/hookecho';

/** adnanh's example and test hook files, relative to the top of its source tree. */
export const CORPUS_FILES = [
  'hooks.json.example',
  'hooks.json.tmpl.example',
  'hooks.yaml.example',
  'hooks.yaml.tmpl.example',
  'test/hooks.json.tmpl',
  'test/hooks.yaml.tmpl',
];

/** The case name of a corpus file: golden.json keys its expected output by it. */
export const corpusName = (file: string): string => `adnanh ${file}`;

/** A hook file with its template actions rendered as adnanh's tests render them. */
function render(text: string): string {
  return text.replaceAll('{{ .Hookecho }}', HOOKECHO).replaceAll('{{ getenv "XXXTEST_SECRET" | js }}', 'mysecret');
}

/** adnanh's hook files, read from its source tree `dir` (see adnanhSource() in test/peer.ts). */
export function corpusCases(dir: string): DocCase[] {
  return CORPUS_FILES.map((file) => ({
    name: corpusName(file),
    yaml: render(fs.readFileSync(path.join(dir, file), 'utf8')),
  }));
}

export const SEED_JSON = `[{"id":"web","execute-command":"/webhooks.sh","command-working-directory":"/home",\
"include-command-output-in-response":true,"include-command-output-in-response-on-error":true,
"pass-arguments-to-command":[{"source":"url","name":"ns"},{"source":"url","name":"workload"},\
{"source":"url","name":"container"},{"source":"url","name":"repo_type"},{"source":"url","name":"net_type"},\
{"source":"entire-payload"}],
"pass-environment-to-command":[{"source":"string","envname":"MAIL_TO","name":"ops@example.com"}],
"trigger-rule":{"match":{"type":"value","value":"{{ getenv \\"HOOK_TOKEN\\" }}",\
"parameter":{"source":"url","name":"token"}}}}]
`;

/** The seed hook as an operator would write it in YAML. */
export const SEED_YAML = `# the image-push hook
- id: web
  execute-command: /webhooks.sh
  command-working-directory: /home
  include-command-output-in-response: true
  include-command-output-in-response-on-error: true
  pass-arguments-to-command:
    - source: url
      name: ns
    - {source: url, name: workload}
    - source: url
      name: container
    - source: url
      name: repo_type
    - source: url
      name: net_type
    - source: entire-payload
  pass-environment-to-command:
    - source: string
      envname: MAIL_TO
      name: ops@example.com
  trigger-rule:
    match:
      type: value
      value: '{{ getenv "HOOK_TOKEN" }}'
      parameter:
        source: url
        name: token
`;

const c = (name: string, yaml: string, extra: Partial<DocCase> = {}): DocCase => ({ name, yaml, ...extra });

const BLOCK: DocCase[] = [
  c('block mapping', 'a: 1\nb: two\n'),
  c('nested mappings', 'a:\n  b:\n    c: d\n  e: f\ng: h\n'),
  c('sequence of scalars', '- a\n- b\n- c\n'),
  c('sequence of mappings', '- a: 1\n  b: 2\n- a: 3\n'),
  c('indentless sequence', 'k:\n- a\n- b\nj: c\n'),
  c('nested sequences', '- - a\n  - b\n- - c\n'),
  c('triple nested sequences', '- - - deep\n'),
  c('indented sequence in mapping', 'k:\n  - a\n  - b\n'),
  c('mapping on the line after dash', '-\n  a: 1\n  b: 2\n'),
  c('empty sequence items', '- \n-\n- a\n'),
  c('empty values', 'a:\nb: \nc: ~\nd:\n'),
  c('comments', '# top\na: 1 # after\n# between\nb: "x" # after quoted\nc: x#not-a-comment\n  # indented\n'),
  c('quoted keys', '"a b": 1\n\'c\': 2\n"": 3\n'),
  c('url value with colons', 'url: http://example.com:8080/path?x=1#frag\n'),
  c('trailing spaces', 'a: hello world   \nb: x\t\n'),
  c('multiline plain', 'a: one\n  two\n\n  three\nb: x\n'),
  c('multiline plain in sequence', '- one\n  two\n- three\n'),
  c('multiline plain continuation at key level', 'key: value\n  continuation\n'),
  c('plain starting with indicator chars', 'a: -x\nb: -1\nc: :x\nd: ?x\ne: x:y\n'),
  c('space before colon', 'a : 1\n'),
  c('no space after colon', 'a:1\n'),
  c('dash scalars', '- -1\n- -\n- --x\n'),
  c('document scalar', 'hello\n'),
  c('document number', '42\n'),
  c('unicode', 'ключ: значение 😀\nemoji: "\\U0001F600"\n'),
  c('crlf line endings', 'a: 1\r\nb: |\r\n  x\r\n  y\r\nc: "p\r\n  q"\r\n'),
  c('byte order mark', '\uFEFFa: 1\n'),
  c('line separator folding', 'a: x\u2028y\nb: x\u0085y\n'),
  c('proto keys', '__proto__: 1\nconstructor: 2\ntoString: 3\n'),
  c('proto key in json', '{"__proto__": {"polluted": true}, "a": {"__proto__": []}}'),
  c('quoted scalar at column 0', 'a: "x\ny"\n'),
  c('tab after colon', 'a:\t1\nb: [1,\t2]\n'),
  c('long simple key', `${'k'.repeat(1100)}: v\n`),
  c('key of 1000 chars', `${'k'.repeat(1000)}: v\n`),
  c('deep flow nesting', `${'['.repeat(200)}${']'.repeat(200)}\n`),
  c('explicit key', '? complex\n: value\n? other\n'),
];

const DOCUMENTS: DocCase[] = [
  c('document start', '---\na: 1\n'),
  c('document start and end', '--- \na: 1\n...\n'),
  c('second document ignored', '---\na: 1\n---\nb: 2\n'),
  c('broken second document ignored', 'a: 1\n---\nb: [\n'),
  c('content after document end', 'a: 1\n...\nb: 2\n'),
  c('document end then start', 'a: 1\n...\n---\nb: 2\n'),
  c('root block scalar', '--- |\n  text\n'),
  c('root flow sequence', '--- [a, b]\n'),
  c('empty input', ''),
  c('comments only', '# nothing\n\n# here\n'),
  c('empty document', '---\n'),
  c('document end alone', '...\n'),
  c('yaml directive', '%YAML 1.1\n---\na: 1\n'),
  c('yaml 1.2 directive', '%YAML 1.2\n---\na: 1\n'),
  c('tag directive', '%TAG !e! tag:example.com,2000:\n---\na: !e!x 1\n'),
];

const FLOW: DocCase[] = [
  c('flow mapping', '{a: 1, b: [x, y], c: {d: e}}\n'),
  c('flow spanning lines', '{\n  a: 1,\n  b: [\n    1,\n    2\n  ]\n}\n'),
  c('trailing commas', 'a: [1, 2, ]\nb: {x: 1, }\n'),
  c('single pair in flow sequence', '[a: 1, b, "c": d]\n'),
  c('json document', '{"a":1,"b":[true,false,null],"c":"x","d":{"e":-1.5e3}}'),
  c('json with tabs', '{\n\t"a": 1,\n\t\t"b": [\n\t2 ]\n}\n'),
  c('flow in block', 'a: [1, 2]\nb: {c: d}\nc:\n  - [x]\n  - {y: z}\n'),
  c('colon in flow plain scalar', '{a: http://x}\n'),
  c('flow pair without space', '[a:1]\n'),
  c('json key then plain value', '{"a":b}\n'),
  c('flow keys without values', '{a, b: c}\n'),
  c('flow multiline plain', '[a\n  b, c]\n'),
  c('empty flow collections', '[[], {}, [{}], {a: []}]\n'),
  c('explicit key in flow mapping', '{? a : b, ? c}\n'),
  c('empty value in flow mapping', '{a: , b: }\n'),
  c('json slash escape', '{"a": "x\\/y"}\n'),
  c('flow sequence of pairs like hooks.json.tmpl', '["or": [1], {"x": 2}]\n'),
];

const QUOTED: DocCase[] = [
  c('single quoted', "a: 'it''s'\nb: ''\nc: 'x # not a comment'\n"),
  c('single quoted multiline', "a: 'one\n  two\n\n  three'\n"),
  c('double quoted simple escapes', String.raw`a: "\t|\n|\r|\\|\"|\'|\ |\0|\a|\b|\e|\v|\f|\N|\_|\L|\P"` + '\n'),
  c('double quoted tab escape', 'a: "x\\\ty"\n'),
  c('double quoted hex escapes', String.raw`a: "\x41\xe9\u00e9\u20AC\U0001F600\x80"` + '\n'),
  c('double quoted folding', 'a: "one\n  two\n\n  three"\n'),
  c('double quoted escaped line break', 'a: "one \\\n  two"\n'),
  c('double quoted trailing spaces on a line', 'a: "x  \n  y"\n'),
  c('unknown escape', 'a: "\\q"\n'),
  c('surrogate escape', 'a: "\\ud800"\n'),
  c('short hex escape', 'a: "\\x4"\n'),
  c('unterminated double quote', 'a: "abc\n'),
  c('unterminated single quote', "a: 'abc\n"),
  c('document marker inside quotes', 'a: "x\n---\ny"\n'),
  c('text after quoted scalar', 'a: "x" y\n'),
  c('comment right after quote', 'a: "x"#c\n'),
];

const BLOCK_SCALARS: DocCase[] = [
  c('literal clip', 'a: |\n  l1\n  l2\n\nb: 1\n'),
  c('literal strip', 'a: |-\n  l1\n\n'),
  c('literal keep', 'a: |+\n  l1\n\n\nb: 1\n'),
  c('literal keep at end', 'a: |+\n  l1\n\n'),
  c('folded', 'a: >\n  one\n  two\n\n  three\n   indented\n  back\n'),
  c('folded strip', 'a: >-\n  one\n  two\n'),
  c('folded keep', 'a: >+\n  one\n  two\n\n'),
  c('explicit indentation', 'a: |2\n   three-space\n  two\n'),
  c('indicators chomp then indent', 'a: |-2\n   x\n\n'),
  c('indicators indent then chomp', 'a: >2+\n   x\n\n'),
  c('block scalar at end without newline', 'a: |\n  text'),
  c('block scalar header at end of file', 'a: |'),
  c('block scalar header then newline at end', 'a: >\n'),
  c('leading empty lines', 'a: |\n\n  x\n'),
  c('more indented first line', 'a: |\n\n    x\n  y\n'),
  c('header comment', 'a: | # comment\n  x\n'),
  c('block scalars in sequence', '- |\n  x\n- >\n  y\n'),
  c('tab inside content', 'a: |\n  \tx\n'),
  c('zero indentation indicator', 'a: |0\n  x\n'),
  c('text after header', 'a: | x\n  y\n'),
  c('less indented line ends scalar', 'a: |\n    x\n  y: 1\n'),
  c('root literal with explicit indent', '--- |1\n  two spaces\n'),
  c('tab as block scalar indentation', 'a: |\n\tx\n'),
];

const ALIASES: DocCase[] = [
  c('anchor and alias', 'a: &x 1\nb: *x\n'),
  c('merge', 'base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n'),
  c('merge after explicit key overrides it', 'base: &b {x: 1}\nd:\n  x: 0\n  <<: *b\n'),
  c('merge list earlier wins', 'a: &a {x: 1, y: 1}\nb: &b {x: 2, z: 2}\nc:\n  <<: [*a, *b]\n'),
  c('merge inline mapping', 'c:\n  <<: {x: 1}\n  y: 2\n'),
  c('merge of scalar', 'a: &a 1\nb:\n  <<: *a\n'),
  c('merge of list with scalar', 'a: &a 1\nb:\n  <<: [*a]\n'),
  c('merge of plain scalar', 'b:\n  <<: 1\n'),
  c('unknown alias', 'a: *nope\n'),
  c('alias contains itself', 'a: &a [*a]\n'),
  c('redefined anchors: last wins everywhere', 'a: *x\nb: &x 1\nc: &x 2\nd: *x\n'),
  c('nested redefined anchor', 'a: &x [&x 1]\nb: *x\n'),
  c('alias of sequence', 'a: &s [1, 2]\nb: *s\n'),
  c('alias as key', 'k: &k key\n*k : v\n'),
  c('alias as key without space', 'k: &k key\n*k: v\n'),
  c('quoted merge key is a plain key', '"<<": 1\n'),
  c('merge key as value', 'a: <<\n'),
  c('merge tag', 'a: &a {x: 1}\nb:\n  !!merge <<: *a\n'),
  c('anchored empty value', 'a: &e\nb: *e\n'),
  c('anchor and tag', 'a: &x !!str 1\nb: !!str &y 2\nc: [*x, *y]\n'),
  c('anchor name with bad char', 'a: &x.y 1\n'),
  c('merge inside anchor', 'a: &a {x: 1}\nb: &b {<<: *a, y: 2}\nc: {<<: *b}\n'),
];

const NUMBERS: DocCase[] = [
  c('integers', [
    'a: 0', 'b: -0', 'c: +12', 'd: 1_000', 'e: 0x1F', 'f: 0o17', 'g: 017', 'h: 0b101', 'i: -0b11', 'j: 08',
    'k: 0x', 'l: 9223372036854775807', 'm: 9223372036854775808', 'n: -9223372036854775808',
    'o: -9223372036854775809', 'p: 18446744073709551615', 'q: 18446744073709551616', 'r: 0X1f', 's: 1__0',
    't: _1', 'u: 1_', 'v: +0x10', 'w: 0b', 'x: 00', 'y: 09.5', 'z: 0xg',
  ].join('\n') + '\n'),
  c('floats', [
    'a: 1.5', 'b: -1.5', 'c: .5', 'd: -.5', 'e: 1e+3', 'f: 1e3', 'g: 1.5E-3', 'h: 1.', 'i: 1_000.5',
    'j: 1e+400', 'k: 1e-400', 'l: .5e3', 'm: 0.1', 'nn2: 6.02e+23', 'o: ._5', 'p: +.5', 'q: 00.5', 'r: 1.0',
    's: .5_0', 't: .', 'u: -.', 'v: 1.5e', 'w: 99999999999999999999', 'x: 1e+21', 'yy: -0.0', 'z: .5e999',
    'nn: 1.0e+0', 'aa: .5e3_0', 'bb: .5_e3', 'cc: .5e_3', 'dd: .5__0', 'ee: .5_', 'ff: .5E+3', 'gg: .5e-3_',
  ].join('\n') + '\n'),
  c('strings that look numeric', 'a: 1:20\nb: 2001-12-14\nc: 1.2.3\nd: 0.1.2\ne: 1,000\nf: 12e\ng: 0x1p3\n'),
  c('special float words as strings', 'a: -.nan\nb: +.nan\nc: .Nan\nd: .iNF\ne: inf\nf: NaN\n'),
  c('infinities', 'a: .inf\nb: -.inf\nc: +.INF\n', {
    diverge: 'nonfinite',
    expect: { a: Infinity, b: -Infinity, c: Infinity },
  }),
  c('not a number', 'a: .NaN\n', { diverge: 'nonfinite', expect: { a: NaN } }),
];

const WORDS: DocCase[] = [
  c('booleans', 'a: [y, Y, yes, Yes, YES, n, N, no, No, NO, true, True, TRUE, false, False, FALSE]\n' +
    'b: [on, On, ON, off, Off, OFF, tRUE, yES, oN, Off2, yess]\n'),
  c('nulls', '[~, null, Null, NULL, nULL, "", "null", NUL, "~"]\n'),
  c('scalar keys become strings', 'true: a\nno: b\n1: c\n1.5: d\n0x10: e\n-1: f\n.inf: g\n-.inf: h\noff2: i\n' +
    '1e+3: j\n0.1: k\n1234567.0: l\n'),
  c('nan key', '.nan: x\n'),
  c('null key', '~: a\n'),
  c('empty key in flow', '{: x}\n'),
  c('collection key', '[a]: 1\n'),
  c('mapping key', '{a: 1}: 2\n'),
  c('complex key collection', '? [a]\n: v\n'),
  c('uint key', '18446744073709551615: x\n'),
  c('int64 key', '-9223372036854775808: x\n'),
];

const TAGS: DocCase[] = [
  c('str tag', 'a: !!str 123\nb: !!str yes\nc: !!str\n'),
  c('int tag on quoted', 'a: !!int "42"\nb: !!float "1.5"\nc: !!bool "yes"\nd: !!null ""\n'),
  c('non-specific tag', 'a: ! 12\nb: ! yes\n'),
  c('local tag', 'a: !foo bar\nb: !foo 12\nc: !foo {x: 1}\n'),
  c('verbatim tag', 'a: !<tag:yaml.org,2002:str> 5\n'),
  c('float tag on int', 'a: !!float 1\n'),
  c('int tag on word', 'a: !!int abc\n'),
  c('timestamp tag', 'a: !!timestamp 2001-12-14\n'),
  c('undefined tag handle', 'a: !e!x 1\n'),
  c('tag followed by flow end', '{a: !!str}\n'),
  c('binary tag', 'a: !!binary aGVsbG8=\n', { diverge: 'refused' }),
  c('uri escaped tag', 'a: !foo%21 1\n'),
];

const ERRORS: DocCase[] = [
  c('tab indentation', '\ta: 1\n'),
  c('tab indentation of nested key', 'a:\n\tb: 1\n'),
  c('bad indentation', 'a: 1\n b: 2\n'),
  c('key without colon', 'a: 1\nb\n'),
  c('key without colon at end', 'a: 1\nb'),
  c('sequence then mapping', '- a\nb: 1\n'),
  c('mapping then sequence', 'a: b\n- c\n'),
  c('unclosed flow sequence', '[1, 2\n'),
  c('unclosed flow mapping', '{a: 1\n'),
  c('stray closing bracket', ']\n'),
  c('at sign', '@foo\n'),
  c('backquote', 'a: `x\n'),
  c('nested mapping value on one line', 'a: b: c\n'),
  c('sequence entry after key', 'a: - b\n'),
  c('mapping after sequence item at same indent', 'a:\n  - b\n  c: d\n'),
  c('control character', 'a: \u0001\n'),
  c('nested sequence misindented', '- a\n  - b\n'),
  c('less indented plain continuation', 'a:\n  b: x\n y\n'),
  c('flow sequence as key in sequence', '- [a, b]: c\n'),
  c('missing comma in flow sequence', '[a b: c d]\n'),
  c('missing comma in flow mapping', '{a: 1 b: 2}\n'),
  c('block entry in flow', '[- a]\n'),
  c('percent at line start inside mapping', 'a: 1\n%x\n'),
  c('unknown directive', '%FOO bar\n---\na: 1\n'),
  c('duplicate yaml directive', '%YAML 1.1\n%YAML 1.1\n---\na: 1\n'),
  c('anchor without name', 'a: & 1\n'),
  c('tab before plain continuation', 'a:\n  b\n\tc\n'),
];

const DUPLICATES: DocCase[] = [
  c('duplicate key', 'a: 1\na: 2\n', { diverge: 'duplicate' }),
  c('duplicate after quoting', 'a: 1\n"a": 2\n', { diverge: 'duplicate' }),
  c('duplicate booleans', 'true: 1\nyes: 2\n', { diverge: 'duplicate' }),
  c('duplicate integers', '1: a\n0x1: b\n', { diverge: 'duplicate' }),
  c('duplicate in flow', '{a: 1, a: 2}\n', { diverge: 'duplicate' }),
  c('duplicate hook keys', '- id: x\n  id: y\n', { diverge: 'duplicate' }),
];

const FRAGMENTS = [
  'a', 'b', 'key', ':', ': ', '- ', '-', '\n', '\n', '\n', '  ', '    ', ' ', '\t', '"x y"', "'y''z'", '"a\\tb"',
  '[', ']', '{', '}', ', ', ',', '#c', ' #c', '&a ', '*a', '&b ', '*b', '|', '>', '|-', '>+', '|2', '?', '? ', '1',
  '0x1F', '1.5', '1e+3', 'yes', 'no', 'on', '~', 'null', '<<: ', '<<', '---\n', '--- ', '...\n', '!!str ', '!!int ',
  '! ', '"\\n"', 'k: v\n', '  - ', '- - ', 'x:y', 'http://h:1/p', '"', "'", '\\', '%YAML 1.1\n', '.inf', '-.5', '08',
];

/** A xorshift generator from a fixed seed (the same numbers every run), and a pick of one item by it. */
export function seededRandom(seed: number): { random: () => number; pick: <T>(items: T[]) => T } {
  let state = seed;
  const random = (): number => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 4294967296;
  };
  return { random, pick: <T>(items: T[]): T => items[Math.floor(random() * items.length)] };
}

/**
 * Random documents from a fixed seed: YAML fragments thrown together, and the cases above with a
 * few characters inserted, deleted or replaced (by code point: a file cannot split a character).
 */
function fuzzCases(base: DocCase[], count: number): DocCase[] {
  const { random, pick } = seededRandom(0x2545f491);
  const texts = base.map((d) => d.yaml).filter((y) => y.length < 400);
  const soup = (): string => Array.from({ length: 1 + Math.floor(random() * 25) }, () => pick(FRAGMENTS)).join('');
  const mutate = (text: string): string => {
    const chars = Array.from(text);
    for (let k = Math.floor(random() * 3); k >= 0; k--) {
      const at = Math.floor(random() * (chars.length + 1));
      const r = random();
      if (r < 0.4) chars.splice(at, 0, pick(FRAGMENTS));
      else if (r < 0.8) chars.splice(at, 1 + Math.floor(random() * 3));
      else chars.splice(at, 1, pick([' ', '\n', '\t', ':', '-', '#']));
    }
    return chars.join('');
  };
  return Array.from({ length: count }, (_, i) =>
    c(`fuzz ${i}`, random() < 0.5 ? soup() : mutate(pick(texts)), { diverge: 'fuzz' }),
  );
}

/**
 * Our cases: the seed hook, the feature cases, and fuzz made from them. They need no peer: their
 * text is here and golden.json holds it beside what Go made of it.
 */
export function ownCases(): DocCase[] {
  const cases = [
    c('seed hook json', SEED_JSON),
    c('seed hook yaml', SEED_YAML),
    ...BLOCK, ...DOCUMENTS, ...FLOW, ...QUOTED, ...BLOCK_SCALARS, ...ALIASES, ...NUMBERS, ...WORDS, ...TAGS,
    ...ERRORS, ...DUPLICATES,
  ];
  return [...cases, ...fuzzCases(cases, 600)];
}

/** A deterministic spread of float texts, to check the float32 rendering ghodss does. */
function floatTexts(): string[] {
  const out: string[] = [];
  let seed = 12345;
  const next = (): number => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed / 2147483648;
  };
  for (let i = 0; i < 300; i++) {
    const digits = 1 + Math.floor(next() * 17);
    const mantissa = (next() * 10).toFixed(digits);
    const exp = Math.floor(next() * 90) - 45;
    out.push(`${next() < 0.3 ? '-' : ''}${mantissa}e${exp < 0 ? '-' : '+'}${Math.abs(exp)}`);
  }
  for (let e = -8; e <= 24; e++) {
    const exp = `e${e < 0 ? '-' : '+'}${Math.abs(e)}`;
    out.push(`1.0${exp}`, `9.999999${exp}`);
  }
  // Powers of two, where the float32 rounding interval is lopsided.
  for (let e = -30; e <= 70; e += 7) out.push((2 ** e).toExponential());
  return out;
}

/** Scalars written as `v: <scalar>` into a Go string field (how adnanh reads `"value": 1`). */
export function scalarCases(): string[] {
  return [
    '1', '-1', '0', '-0', '+12', '1_000', '0x1F', '0o17', '017', '0b101', '08', '9223372036854775807',
    '9223372036854775808', '-9223372036854775808', '18446744073709551615', '18446744073709551616',
    '99999999999999999999', '1.5', '-1.5', '.5', '1e+3', '1.0', '100000.0', '999999.0', '1000000.0',
    '1234567.0', '1234567', '1e+20', '1e+21', '1e-5', '0.0001', '0.00001', '3.14159265358979', '16777217.0',
    '0.1', '0.2', '0.3', '1.1', '2.5e-10', '6.02e+23', '3.4028235e+38', '3.5e+38', '1e-46', '1.4e-45',
    '-0.0', '.inf', '-.inf', '.nan', 'true', 'false', 'yes', 'no', 'on', 'off', 'y', 'n', 'Y', 'NO',
    '~', 'null', '', '"1"', 'abc', "'true'", '!!str 12', '1e3',
    ...floatTexts(),
  ];
}
