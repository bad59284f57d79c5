// The house style of webhook.ts (DESIGN.md), measured by test/structure.ts: Part I (libraries) uses
// nothing of Part II (the service); a push reads downward (no section uses a name a later section
// defines); each banner lists what later sections use and the test files that cover it; the
// header's table of contents names the sections; no chapter runs over 900 lines (main over 350), no
// function over 60 lines and no line over 120 columns; nothing is exported that nothing uses.

import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { describe, test } from 'node:test';
import * as path from 'node:path';
import * as os from 'node:os';
import {
  analyse, bannerTests, bareSleeps, codeOnly, IMPORTERS, MAX_FUNCTION_LINES, MAX_LINE_WIDTH, MIN_WALL_CLOCK_BOUND_MS,
  environmentReaders, functionsMatching, repeatedBlocks, REPEAT_LINES, REPEAT_PLACES, shortWallClockBounds, SOURCE, testsImporting,
} from './structure.ts';

const report = analyse();
/**
 * The functions that read an environment of strings (`env.X`, `env[…]`: environmentReaders), and why each may.
 * A push's hook settings are read once, at its boundary, into a HookConfig; what runs after takes that.
 */
const ENVIRONMENT_READERS = {
  // The service's own environment, at start-up and in the libraries given one (templates, kubeconfig, PATH).
  service: [
    'applyTemplateFunction', 'kubeconfigFiles', 'execSpec', 'inClusterCredentials', 'parseCommandLine',
    'checkHookSettings', 'templateEnvironment', 'CommandRunner.hasRoom', 'CommandRunner.tryAcquire',
    'CommandRunner.resolveInputs', 'validate', 'mailWarnings', 'commandWarnings', 'openNotifier',
    'parseMailConfig',
  ],
  // A push's boundaries: its settings' input (SettingInput) read into a HookConfig (readHookConfig and its parts), made
  // by the process (/webhooks.sh: runUpgrade, from its environment), an HTTP delivery (UpgradeService.run, fanned out
  // per cluster, then runOne, from the command's environment), or a job of another source (UpgradeService.jobInput,
  // which reads no environment: its target, then the hook's settings as fixedSetting and hookSettings compiled them).
  boundaries: [
    'settingOf', 'readHookConfig', 'readSettings', 'readPushReading', 'pushReadingOf', 'UpgradeService.run',
    'UpgradeService.runOne', 'runUpgrade', 'fixedSetting',
  ],
  // A result's settings: every hook's command (not only an upgrade) has its environment read into ResultSettings.
  results: ['resultSettings', 'DeliveryLog.recordOf'],
};
const text = fs.readFileSync(SOURCE, 'utf8');
const MAX_CHAPTER_LINES = 900;
const MAX_MAIN_LINES = 350;
// Test files that check no chapter of webhook.ts: the build, the docs, the shape of the file, the tests' processes.
const OF_NO_CHAPTER = ['build.test.ts', 'docs.test.ts', 'exit-check.test.ts', 'structure.test.ts'];
// The libraries the program writes by hand because it has no runtime dependencies.
const LIBRARIES = [/json|text/, /yaml/, /template/, /regexp/, /outbound/, /smtp/, /kubernetes/, /registry/, /html/];

describe('webhook.ts structure', () => {
  test('sections are numbered 1, 2, 3… in order', () => {
    assert.ok(report.sections.length >= 10);
    assert.deepEqual(report.sections.map((s) => s.number), report.sections.map((_, i) => i + 1));
  });

  test('the header names every section, in order', () => {
    const header = fs.readFileSync(SOURCE, 'utf8').split('*/')[0];
    for (const s of report.sections) {
      const entry = new RegExp(`^ \\*\\s+${s.number}\\. ${s.title.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').split(' ')[0]}`, 'm');
      assert.match(header, entry, `section ${s.number} (${s.title}) in the table of contents`);
    }
  });

  test('no section uses a name a later section defines', () => {
    assert.deepEqual(report.forwardUses, []);
  });

  test("each banner's Exports lists exactly the names later sections use", () => {
    for (const [i, s] of report.sections.entries()) {
      const offered = [...(report.offered.get(i) ?? [])].sort();
      assert.deepEqual([...s.listed].sort(), offered, `section ${s.number} (${s.title})`);
    }
  });

  test(`no function over ${MAX_FUNCTION_LINES} lines`, () => {
    assert.deepEqual(report.longFunctions, []);
  });

  test(`no line over ${MAX_LINE_WIDTH} columns`, () => {
    assert.deepEqual(report.wideLines, []);
  });

  test('Part I holds the libraries and uses no name of Part II', () => {
    const partOne = report.sections.slice(0, report.partTwo);
    assert.ok(report.partTwo > 0, 'a "// Part II" line opens the service');
    for (const library of LIBRARIES)
      assert.ok(partOne.some((s) => library.test(s.title)), `a Part I chapter for ${library}`);
    const reachesOut = report.forwardUses.filter((u) => partOne.some((s) => u.startsWith(`section ${s.number} `)));
    assert.deepEqual(reachesOut, []);
    for (const [i, s] of partOne.entries())
      for (const name of report.offered.get(i) ?? [])
        assert.ok(report.declared.get(name) === i, `${name} of ${s.title}`);
  });

  test(`no chapter over ${MAX_CHAPTER_LINES} lines, main at most ${MAX_MAIN_LINES}`, () => {
    const long = report.sections
      .filter((s) => s.end - s.start + 1 > (s.title === 'main' ? MAX_MAIN_LINES : MAX_CHAPTER_LINES))
      .map((s) => `${s.number}. ${s.title}: ${s.end - s.start + 1} lines`);
    assert.deepEqual(long, []);
  });

  test('every banner names the test files that cover it, and they exist', () => {
    const importing = testsImporting(report);
    for (const s of report.sections) {
      const listed = bannerTests(text, s);
      assert.ok(listed.length > 0, `section ${s.number} (${s.title}) names no test file`);
      for (const f of listed) assert.ok(fs.existsSync(path.join(import.meta.dirname, f)), `${s.title}: test/${f}`);
      for (const f of importing.get(s.title) ?? []) assert.ok(listed.includes(f), `${s.title}: ${f} imports from it`);
    }
  });

  test('every test file is named by a banner, but those that check the build, the docs, the shape and the tests', () => {
    const named = new Set(report.sections.flatMap((s) => bannerTests(text, s)));
    const files = fs.readdirSync(import.meta.dirname).filter((f) => f.endsWith('.test.ts'));
    assert.deepEqual(files.filter((f) => !named.has(f) && !OF_NO_CHAPTER.includes(f)), []);
  });

  test('every export is used by a later section or by a test, a benchmark or a script', () => {
    const outside = IMPORTERS.flatMap((dir) =>
      fs.readdirSync(dir, { recursive: true }).map(String).filter((f) => f.endsWith('.ts'))
        .map((f) => fs.readFileSync(path.join(dir, f), 'utf8')),
    ).join('\n');
    const laterUse = new Set([...report.offered.values()].flatMap((names) => [...names]));
    const unused = report.exported.filter(
      (n) => n !== 'main' && !laterUse.has(n) && !new RegExp(`\\b${n.replace(/\$/g, '\\$')}\\b`).test(outside),
    );
    assert.deepEqual(unused, []);
  });

  test("an environment is read only by the functions ENVIRONMENT_READERS names: after a push's boundary, none", () => {
    const readers = environmentReaders();
    const named = Object.values(ENVIRONMENT_READERS).flat();
    const unnamed = [...readers].filter(([f]) => !named.includes(f)).map(([f, lines]) => `${f} (line ${lines[0]})`);
    assert.deepEqual(unnamed, [], 'read an environment: take the HookConfig, or be a boundary named in the list');
    assert.deepEqual(named.filter((f) => !readers.has(f)), [], 'named, but no longer reading an environment');
  });

  test('every source reaches an executor through the gate: runDecidedPush only from runDecided, after gateJob', () => {
    // The ways a push is carried out, and the only functions that may start one: a request's boundary (runOne, the
    // process's runUpgrade, a push kept since either), and every other source through UpgradeService.runDecided.
    const entries = { runPush: ['runUpgrade', 'UpgradeService.runOne', 'UpgradeService.lane'], runDecidedPush: ['UpgradeService.runDecided'] };
    for (const [entry, allowed] of Object.entries(entries)) {
      const callers = [...functionsMatching(new RegExp(`(?<![\\w$.])${entry}\\(`, 'g'))].map(([f]) => f);
      assert.deepEqual(callers.filter((f) => f !== entry).sort(), allowed.sort(), `${entry} is called by`);
    }
    for (const gated of ['UpgradeService.runOne', 'UpgradeService.runDecided']) {
      const lines = (name: string) => functionsMatching(new RegExp(`(?<![\\w$.])${name}\\(`, 'g')).get(gated) ?? [];
      const [gate] = lines('gateJob');
      assert.ok(gate !== undefined, `${gated} passes its job through gateJob`);
      for (const entry of Object.keys(entries)) for (const at of lines(entry)) assert.ok(gate < at, `${gated}: gateJob before ${entry}`);
    }
    // No other source builds a decision's input and carries it out itself.
    const executors = [...functionsMatching(/(?<![\w$.])(?:carryOut|commitOut|releaseOut)\(/g)].map(([f]) => f).sort();
    assert.deepEqual(executors, ['applyUpgrade', 'carryOut', 'commitOut', 'releaseOut'].sort());
  });

  test('the measuring tool sees through comments, strings and regular expressions', () => {
    const code = codeOnly("const a = 'Logger'; // Metrics\nconst b = /Hook/; const c = `x ${Snapshot} y`;");
    assert.doesNotMatch(code, /Logger|Metrics|Hook/);
    assert.match(code, /Snapshot/);
    const readers = environmentReaders('class A {\n  m(env) {\n    return env.X;\n  }\n}\nfunction f(hook) {\n' +
      '  return hook.env.length + env["Y"];\n}\n');
    assert.deepEqual([...readers], [['A.m', [3]], ['f', [7]]]);
    const r = analyse(
      '// ' + '='.repeat(30) + '\n// 1. first — a.\n//    Exports: one.\n// ' + '='.repeat(30) + '\n' +
        'export function one() { return [two(), { ...three() }, x.three]; }\n' +
        '// ' + '='.repeat(30) + '\n// 2. second — b.\n// ' + '='.repeat(30) + '\n' +
        'export function two() { return one(); }\nfunction three() { return {}; }\n',
    );
    assert.deepEqual(r.forwardUses, [
      'section 1 (first) uses two of section 2 (second)',
      'section 1 (first) uses three of section 2 (second)',
    ]);
    assert.deepEqual([...(r.offered.get(0) ?? [])], ['one']);
    const body = Array.from({ length: 70 }, (_, i) => `  const x${i} = ${i};`).join('\n');
    const wrapped = analyse(`export async function longOne(\n  a: string,\n): Promise<void> {\n${body}\n}\n`);
    assert.deepEqual(wrapped.longFunctions, [{ line: 1, name: 'longOne', lines: 74 }]);
  });
});

describe('the tests a maintainer can trust', () => {
  test('no negative check sleeps and then asserts: a bare sleep outside a polling loop', () => {
    assert.deepEqual(bareSleeps(), []);
  });

  test(`no wall-clock bound under ${MIN_WALL_CLOCK_BOUND_MS} ms in a test (speed is measured in bench/)`, () => {
    assert.deepEqual(shortWallClockBounds(), []);
  });

  test(`no block of ${REPEAT_LINES} lines stands in ${REPEAT_PLACES} places of test/ (shared helpers instead)`, () => {
    assert.deepEqual(repeatedBlocks(), []);
  });

  test('the three measures find what they are for', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'structure-'));
    try {
      const block = Array.from({ length: REPEAT_LINES }, (_, i) => `  const v${i} = start(${i});`).join('\n');
      for (const f of ['a', 'b', 'c']) fs.writeFileSync(path.join(dir, `${f}.test.ts`), `test('x', async () => {\n${block}\n});\n`);
      fs.writeFileSync(
        path.join(dir, 'd.test.ts'),
        [
          "test('nothing happens', async () => {",
          '  await sleep(200);',
          '  assert.equal(calls, 0);',
          '  for (;;) {',
          '    await sleep(50);',
          '  }',
          '  assert.ok(elapsed < 2_000);',
          '  assert.ok(Date.now() - started < 10_000);',
          '});',
        ].join('\n'),
      );
      assert.deepEqual(bareSleeps(dir), ['d.test.ts:2']);
      assert.deepEqual(shortWallClockBounds(dir), ['d.test.ts:7']);
      const repeats = repeatedBlocks(dir);
      assert.ok(repeats.length > 0);
      for (const r of repeats) assert.match(r, /a\.test\.ts:\d+, b\.test\.ts:\d+, c\.test\.ts:\d+\)$/);
      fs.rmSync(path.join(dir, 'c.test.ts'));
      assert.deepEqual(repeatedBlocks(dir), [], 'two places are allowed');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
