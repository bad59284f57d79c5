/*
 * adnanh/webhook 2.8's own black-box test suite, run against our executable.
 *
 * adnanh's `webhook_test.go` has a table of 28 cases (`hookHandlerTests`) that TestWebhook runs
 * once per hooks template (`test/hooks.json.tmpl`, `test/hooks.yaml.tmpl`): 56 sub-tests. Each
 * starts the executable on a free loopback port with
 *
 *   -hooks=<temp dir>/.tmpl -ip=127.0.0.1 -port=<port> -debug [-http-methods=Post ]
 *
 * (argv[0] `webhook`, the test's environment minus HOOK_* variables, stderr captured; only one case
 * adds -http-methods), waits for `GET /` to answer 200 (polling every 200 ms, 5 s at most), sends
 * one request and checks the status, the body (a regular expression) and, for four cases, the log,
 * read right after SIGKILL. The suite renders each template itself with Go's text/template into a
 * file named `.tmpl` (its Ext(Ext(name))); the only action, `{{ .Hookecho }}`, becomes the path of
 * `test/hookecho.go`, which the suite builds with `go build` (it prints `arg: …` and `env: HOOK_…`).
 * Neither rendered file is strict JSON: one is YAML, the other uses YAML flow syntax inside
 * brackets, trailing commas and `"value": 1`; adnanh reads both with its YAML loader.
 *
 * The source is the one test/peer.ts obtains (Debian's upstream tarball of 2.8.0, every dependency
 * vendored; `$ADNANH_WEBHOOK_SRC` names another tree). It is copied to
 * `~/.cache/webhook-test/adnanh-<version>/suite-<patch hash>/` and test/adnanh-suite.patch is
 * applied: the only change is that buildWebhook() returns `$WEBHOOK_SUITE_BINARY` instead of
 * building adnanh's webhook. The Go build cache is `adnanh-<version>/suite-gocache/`. Only
 * TestWebhook runs: TestStaticParams, the file's other test, calls adnanh's handleHook in-process
 * and never starts a binary, so it says nothing about the executable under test.
 *
 * The executable is `$WEBHOOK_BIN`, else `dist/webhook`; with PEER=adnanh it is the real
 * adnanh/webhook (test/peer.ts), which must pass every case, proving the harness is honest:
 *
 *   node_modules/.bin/node --test test/adnanh-suite.test.ts
 *   PEER=adnanh node_modules/.bin/node --test test/adnanh-suite.test.ts
 *
 * Diagnosis only (never the default; a run with it proves nothing about drop-in compatibility):
 * ADNANH_SUITE_STRICT_JSON=1 puts a wrapper in front of the executable that first rewrites the
 * rendered hooks file as strict JSON through adnanh's own loader (so YAML, the JSON template's YAML
 * flow syntax and `"value": 1` read exactly as adnanh reads them), to see which cases fail beyond
 * loading the file.
 *
 * Needs Go (`go` on PATH or /usr/local/go/bin). Without Go or the source the test is skipped with a
 * loud message, or fails when CI is set. There are no timed assertions: the only deadline is go
 * test's `-timeout`, a guard against a hung server (adnanh's own waits are its suite's).
 */

import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { test } from 'node:test';

import { IS_ADNANH, REPO_ROOT, defaultBinary, freePort, httpRequest, makeTempDir, waitFor } from './harness.ts';
import { adnanhBinary, adnanhSource, peerCacheRoot, type SourceTree } from './peer.ts';

const CI = Boolean(process.env.CI);
/** 28 cases in hookHandlerTests × 2 hooks templates. */
const EXPECTED_CASES = 56;
const PATCH = path.join(REPO_ROOT, 'test', 'adnanh-suite.patch');
const STRICT_JSON = Boolean(process.env.ADNANH_SUITE_STRICT_JSON);
/** Guard against a server that never answers (adnanh's client has no deadline); not a speed check. */
const GO_TEST_TIMEOUT = '30m';

// ---------------------------------------------------------------------------------------------
// Prerequisites: Go, the source, the executable under test

function findGo(): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(':').concat(['/usr/local/go/bin', '/usr/lib/go/bin'])) {
    const go = path.join(dir || '.', 'go');
    try {
      fs.accessSync(go, fs.constants.X_OK);
      if (spawnSync(go, ['version'], { stdio: 'ignore' }).status === 0) return go;
    } catch {
      /* next */
    }
  }
  return undefined;
}

/** Why the suite cannot run here, or the toolchain, source and executable when it can. */
async function prerequisites(): Promise<string | { go: string; source: SourceTree; bin: string }> {
  const go = findGo();
  if (!go) return 'no Go toolchain (go on PATH or /usr/local/go/bin)';
  let source: SourceTree;
  try {
    source = await adnanhSource();
  } catch (e) {
    return (e as Error).message;
  }
  let bin: string;
  try {
    bin = path.resolve(process.env.WEBHOOK_BIN ?? (IS_ADNANH ? await adnanhBinary() : defaultBinary()));
  } catch (e) {
    return (e as Error).message;
  }
  return { go, source, bin };
}

// ---------------------------------------------------------------------------------------------
// The patched copy of the suite

/** Runs a program, throwing with its output when it fails. */
function check(cmd: string, args: string[], opts: { cwd: string; env?: NodeJS.ProcessEnv }): void {
  const r = spawnSync(cmd, args, { ...opts, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.error?.message ?? r.status}):\n${r.stdout}${r.stderr}`);
}

/**
 * A copy of the source with test/adnanh-suite.patch applied, made once per source version and
 * patch (written beside its final place and renamed, so concurrent runs never see half a copy).
 */
async function patchedSuite(source: SourceTree): Promise<string> {
  const patch = fs.readFileSync(PATCH);
  const hash = createHash('sha256').update(patch).update(fs.readFileSync(path.join(source.dir, 'webhook_test.go')));
  const final = path.join(peerCacheRoot(), `adnanh-${source.version}`, `suite-${hash.digest('hex').slice(0, 12)}`);
  if (fs.existsSync(path.join(final, '.patched'))) return final;
  const tmp = `${final}.tmp-${process.pid}`;
  await fsp.rm(tmp, { recursive: true, force: true });
  await fsp.cp(source.dir, tmp, { recursive: true });
  // Outside any repository even if the cache lives in one: git apply then works like patch -p1.
  check('git', ['apply', '--verbose', PATCH], { cwd: tmp, env: { ...process.env, GIT_CEILING_DIRECTORIES: path.dirname(tmp) } });
  fs.writeFileSync(path.join(tmp, '.patched'), '');
  try {
    await fsp.rename(tmp, final);
  } catch (e) {
    await fsp.rm(tmp, { recursive: true, force: true });
    if (!fs.existsSync(path.join(final, '.patched'))) throw e;
  }
  return final;
}

/** The environment the executable gets: ours, minus $WEBHOOK_CMD (appended to its arguments). */
function binaryEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  delete env.WEBHOOK_CMD;
  return env;
}

/** go test's environment (the suite passes it on to the executable, minus HOOK_* variables). */
function goEnv(go: string, suite: string): NodeJS.ProcessEnv {
  return {
    ...binaryEnv(),
    PATH: `${path.dirname(go)}:${process.env.PATH ?? ''}`,
    GOTOOLCHAIN: 'local',
    GOFLAGS: '-mod=vendor -buildvcs=false',
    GOPROXY: 'off',
    CGO_ENABLED: '0',
    GOCACHE: path.join(path.dirname(suite), 'suite-gocache'),
  };
}

// ---------------------------------------------------------------------------------------------
// Diagnosis only: the hooks file rewritten as strict JSON before the executable reads it

/** Loads a hooks file with adnanh's own loader and writes it back as JSON, empty fields left out. */
const HOOKS_TO_JSON_GO = `// Diagnosis helper of test/adnanh-suite.test.ts (ADNANH_SUITE_STRICT_JSON=1), not part of the suite.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/adnanh/webhook/internal/hook"
)

func prune(v interface{}) (interface{}, bool) {
	switch x := v.(type) {
	case nil:
		return nil, false
	case map[string]interface{}:
		for k, e := range x {
			if p, keep := prune(e); keep {
				x[k] = p
			} else {
				delete(x, k)
			}
		}
		return x, len(x) > 0
	case []interface{}:
		for i, e := range x {
			x[i], _ = prune(e)
		}
		return x, true
	}
	return v, true
}

func main() {
	var hooks hook.Hooks
	if err := hooks.LoadFromFile(os.Args[1], false); err != nil {
		fmt.Fprintln(os.Stderr, "hooks2json:", err)
		os.Exit(1)
	}
	raw, _ := json.Marshal(hooks)
	var generic []interface{}
	_ = json.Unmarshal(raw, &generic)
	pruned, _ := prune(generic)
	out, _ := json.MarshalIndent(pruned, "", "  ")
	if err := os.WriteFile(os.Args[2], out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "hooks2json:", err)
		os.Exit(1)
	}
}
`;

/** Builds the converter and writes a wrapper that converts `-hooks=FILE` and execs `bin`. */
function strictJsonWrapper(go: string, suite: string, bin: string): string {
  const dir = makeTempDir('adnanh-suite-diag-');
  const src = path.join(suite, 'suite-diag', 'hooks2json');
  fs.mkdirSync(src, { recursive: true });
  fs.writeFileSync(path.join(src, 'main.go'), HOOKS_TO_JSON_GO);
  const conv = path.join(dir, 'hooks2json');
  check(go, ['build', '-o', conv, './suite-diag/hooks2json'], { cwd: suite, env: goEnv(go, suite) });
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  const wrapper = path.join(dir, 'webhook');
  fs.writeFileSync(
    wrapper,
    [
      '#!/bin/sh',
      'set -eu',
      'for a in "$@"; do',
      '  shift',
      '  case $a in',
      `    -hooks=*) f=\${a#-hooks=}; j=$(dirname "$f")/strict-hooks.json; ${q(conv)} "$f" "$j"; set -- "$@" "-hooks=$j" ;;`,
      '    *) set -- "$@" "$a" ;;',
      '  esac',
      'done',
      `exec ${q(bin)} "$@"`,
      '',
    ].join('\n'),
    { mode: 0o755 },
  );
  return wrapper;
}

// ---------------------------------------------------------------------------------------------
// Running go test -json and reading its events

interface GoEvent {
  Action: string;
  Test?: string;
  Output?: string;
}

interface SuiteRun {
  exitCode: number | null;
  /** Final action (pass, fail, skip) of each TestWebhook sub-test, in the order they ended. */
  results: Map<string, string>;
  /** Output lines of each test, and of the package (build errors) under ''. */
  output: Map<string, string>;
  stderr: string;
}

function runSuite(go: string, suite: string, bin: string): Promise<SuiteRun> {
  const args = ['test', '-json', '-count=1', `-timeout=${GO_TEST_TIMEOUT}`, '-run', '^TestWebhook$', '.'];
  const child = spawn(go, args, {
    cwd: suite,
    env: { ...goEnv(go, suite), WEBHOOK_SUITE_BINARY: bin },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const results = new Map<string, string>();
  const output = new Map<string, string>();
  let stderr = '';
  let pendingLine = '';
  const onLine = (line: string) => {
    if (!line.trim()) return;
    let ev: GoEvent;
    try {
      ev = JSON.parse(line);
    } catch {
      output.set('', (output.get('') ?? '') + line + '\n');
      return;
    }
    const key = ev.Test ?? '';
    if (ev.Output !== undefined) output.set(key, (output.get(key) ?? '') + ev.Output);
    if (ev.Test?.startsWith('TestWebhook/') && ['pass', 'fail', 'skip'].includes(ev.Action)) results.set(ev.Test, ev.Action);
  };
  child.stdout.setEncoding('utf8').on('data', (s: string) => {
    const lines = (pendingLine + s).split('\n');
    pendingLine = lines.pop()!;
    lines.forEach(onLine);
  });
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => {
      onLine(pendingLine);
      resolve({ exitCode: code, results, output, stderr });
    });
  });
}

/** The failing cases, each with everything the suite printed for it (expected vs got, the log). */
function failureReport(run: SuiteRun): string {
  const failed = [...run.results].filter(([, action]) => action === 'fail').map(([name]) => name);
  return failed.map((name) => `---- ${name}\n${run.output.get(name) ?? ''}`).join('\n');
}

/**
 * When the executable never served `GET /`, the suite says only "Server failed to respond" (it
 * drops the log). For the report, each template is rendered the way the suite renders it (its one
 * action, `{{ .Hookecho }}`, replaced by /bin/echo) and the executable is started with the suite's
 * arguments until it exits or serves `GET /`; what it printed is shown. Not an assertion.
 */
async function startupReport(suite: string, bin: string): Promise<string> {
  const parts: string[] = [];
  for (const template of ['hooks.json.tmpl', 'hooks.yaml.tmpl']) {
    const rendered = path.join(makeTempDir('adnanh-suite-startup-'), '.tmpl'); // genConfig's name: Ext(Ext(template))
    fs.writeFileSync(rendered, fs.readFileSync(path.join(suite, 'test', template), 'utf8').replaceAll('{{ .Hookecho }}', '/bin/echo'));
    const port = await freePort();
    const child = spawn(bin, [`-hooks=${rendered}`, '-ip=127.0.0.1', `-port=${port}`, '-debug'], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: binaryEnv(),
    });
    let out = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (out += d));
    let exit: string | undefined;
    const closed = new Promise<void>((resolve) => child.on('close', (code, signal) => {
      exit ??= `exited with ${code ?? signal}`;
      resolve();
    }));
    const serving = await waitFor(
      async () => exit !== undefined || (await httpRequest(port, '/').then((r) => r.status === 200, () => false)),
      { timeoutMs: 10_000, what: `${bin} to exit or serve GET /` },
    ).then(() => exit === undefined, () => false);
    if (exit === undefined) {
      exit = serving ? 'served GET / (killed)' : 'neither exited nor served GET / (killed)';
      child.kill('SIGKILL');
    }
    await closed;
    parts.push(`---- startup with test/${template}: ${exit}\n${out}`);
  }
  return parts.join('\n');
}

// ---------------------------------------------------------------------------------------------

const ready = await prerequisites();
if (typeof ready === 'string') {
  if (CI) throw new Error(`adnanh/webhook's own test suite cannot run: ${ready}`);
  process.stderr.write(`\n#### adnanh/webhook's own test suite SKIPPED: ${ready}\n\n`);
}

const under = IS_ADNANH ? 'adnanh/webhook itself (PEER=adnanh)' : 'our executable';
test(
  `adnanh/webhook's own test suite (TestWebhook, ${EXPECTED_CASES} cases) passes against ${under}` +
    (STRICT_JSON ? ' [DIAGNOSIS: hooks pre-converted to strict JSON]' : ''),
  { skip: typeof ready === 'string' ? ready : false },
  async (t) => {
    if (typeof ready === 'string') return;
    assert.ok(fs.existsSync(ready.bin), `no executable at ${ready.bin} (npm run build makes dist/webhook)`);
    const suite = await patchedSuite(ready.source);
    const bin = STRICT_JSON ? strictJsonWrapper(ready.go, suite, ready.bin) : ready.bin;
    t.diagnostic(`suite: ${suite}; executable: ${bin}`);

    const run = await runSuite(ready.go, suite, bin);

    const counts = { pass: 0, fail: 0, skip: 0 } as Record<string, number>;
    for (const action of run.results.values()) counts[action]++;
    t.diagnostic(`go test exit ${run.exitCode}: ${counts.pass} passed, ${counts.fail} failed, ${counts.skip} skipped`);

    assert.ok(
      run.results.size > 0,
      `go test ran no TestWebhook case (exit ${run.exitCode}):\n${run.output.get('') ?? ''}${run.output.get('TestWebhook') ?? ''}${run.stderr}`,
    );
    if (counts.fail > 0) {
      const neverServed = [...run.output.values()].some((o) => o.includes('Server failed to respond'));
      assert.fail(
        `${counts.fail} of ${run.results.size} cases of adnanh's suite failed against ${ready.bin}:\n${failureReport(run)}` +
          (neverServed ? `\n${await startupReport(suite, bin)}` : ''),
      );
    }
    assert.equal(
      run.results.size,
      EXPECTED_CASES,
      `expected ${EXPECTED_CASES} TestWebhook cases, go test reported ${run.results.size}: ${[...run.results.keys()].join(', ')}`,
    );
    assert.equal(counts.skip, 0, 'no case may be skipped');
    assert.equal(run.exitCode, 0, `go test exited ${run.exitCode}:\n${run.output.get('TestWebhook') ?? ''}${run.stderr}`);
  },
);
