// Builds dist/webhook: webhook.ts with its types stripped, embedded in a copy of the Node binary
// running this script (Node's own single-executable support; nothing is downloaded).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { stripTypeScriptTypes } from 'node:module';
import * as path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');
const dist = path.join(root, 'dist');
fs.mkdirSync(dist, { recursive: true });

/**
 * The built-in modules the start-up snapshot holds, loaded at build time (see snapshotScript): those
 * a start loads before its first answer (node:child_process through node:net's listen()).
 */
const SNAPSHOT_BUILTINS = [
  'node:child_process', 'node:crypto', 'node:fs', 'node:net', 'node:path', 'node:sea', 'node:timers/promises',
  'node:v8',
];
/**
 * Built-in modules the snapshot could hold but a start does not need before its first answer: they
 * load at their first use, as each one held costs every start the time to deserialize it (these four:
 * some 4 ms of the median of `npm run bench:start`). What webhook.ts imports from them by name must be
 * functions or classes (see firstUseFunctions).
 */
const FIRST_USE_BUILTINS = ['node:fs/promises', 'node:os', 'node:string_decoder', 'node:url'];

const source = fs.readFileSync(path.join(root, 'webhook.ts'), 'utf8');
/** LIMITS.regexBacktracksBeforeFallback of webhook.ts, which serve() sets as a V8 flag (see execArgv). */
const backtracks = /^  regexBacktracksBeforeFallback: ([\d_]+),$/m.exec(source)?.[1].replaceAll('_', '');
if (!backtracks) {
  throw new Error('scripts/build.ts: LIMITS.regexBacktracksBeforeFallback is not where it was in webhook.ts');
}
const script = path.join(dist, 'webhook-snapshot.cjs');
fs.writeFileSync(script, snapshotScript(stripTypeScriptTypes(asciiOnly(source), { mode: 'strip' })));

/**
 * V8 keeps the script's text in the snapshot (functions are compiled at their first call), with two
 * bytes per character if one character needs them. The few characters past ASCII in webhook.ts are
 * in comments and string and template literals, where a \u escape means the same (not in String.raw,
 * which would keep the escape: refused), so the text is kept with one byte each: 0.9 MB less heap.
 */
function asciiOnly(ts: string): string {
  if (/String\.raw.*[^\x00-\x7f]/.test(ts)) {
    throw new Error('scripts/build.ts: a String.raw template holds a non-ASCII character');
  }
  return ts.replace(/[^\x00-\x7f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/**
 * The executable starts from a V8 start-up snapshot (`npm run bench:start` measures it): the
 * snapshot holds webhook.ts compiled and its top level evaluated (its tables, classes, regular
 * expressions), so a process skips parsing and running some 15,000 lines before it reads its hooks.
 * The stripped module becomes the script Node runs to build the snapshot:
 *   - `export` goes (a snapshot's entry is a script, not a module; nothing imports the executable);
 *   - each `import … from 'node:…'` becomes the same names read through process.getBuiltinModule:
 *     a snapshot cannot hold some built-ins (node:http's parser binding), and an ES import of
 *     node:http would also run its lazy getters (undici: ~35 ms of CPU). A namespace import becomes
 *     a proxy that loads the module when a property is first read, unless the snapshot holds the
 *     module (SNAPSHOT_BUILTINS), which is then bound at once, as named imports of it are; a named
 *     import of a module loaded at first use (FIRST_USE_BUILTINS) becomes functions that load it;
 *   - the entry-point check becomes the function the process runs after the snapshot is loaded,
 *     with the command line as the module would have seen it.
 * Whatever the top level computes is shared by every process started from the executable, so it
 * computes nothing per process (webhook.ts makes its per-process secrets at first use).
 */
function snapshotScript(js: string): string {
  const lazyModule =
    'function builtinOnFirstUse(id) { let m; ' +
    'return new Proxy({}, { get: (_, k) => (m ??= process.getBuiltinModule(id))[k] }); }\n';
  let out = js.replace(/^import (\{[^}]*\}|\* as \w+) from '(node:[a-z0-9_/]+)';$/gm, (line, what: string, id: string) => {
    const held = SNAPSHOT_BUILTINS.includes(id);
    const name = what.startsWith('* as ') ? what.slice('* as '.length) : undefined;
    if (name) return `const ${name} = ${held ? `process.getBuiltinModule('${id}')` : `builtinOnFirstUse('${id}')`};`;
    if (!held && FIRST_USE_BUILTINS.includes(id)) return firstUseFunctions(what, id);
    // Named imports are bound at once: only modules the snapshot holds may be imported so.
    if (!held) throw new Error(`scripts/build.ts: import ${id} as a namespace (\`* as\`), not by names: ${line}`);
    return `const ${what.replace(/\b(\w+) as (\w+)\b/g, '$1: $2')} = process.getBuiltinModule('${id}');`;
  });
  if (/^import /m.test(out)) throw new Error('scripts/build.ts: an import line is left that the snapshot cannot take');
  out = out.replace(/^export /gm, '');
  const entry = /^if \(isEntryPoint\(\)\) \{\n  main\(process\.argv\.slice\(2\), process\.env\)/m;
  if (!entry.test(out)) throw new Error('scripts/build.ts: the entry point of webhook.ts is not where it was');
  // In the executable process.argv is [executable, executable, ...arguments], as the module saw it.
  out = out.replace(
    entry,
    "require('node:v8').startupSnapshot.setDeserializeMainFunction(() => {\n  main(process.argv.slice(2), process.env)",
  );
  out = out.replace(/\n\}\n*$/, '\n});\n');
  if (out.includes('import.meta')) out = out.replaceAll('fileURLToPath(import.meta.url)', "''");
  if (out.includes('import.meta')) throw new Error('scripts/build.ts: import.meta is left in the snapshot script');
  // The built-ins the snapshot holds are loaded into it (their code compiled once, at build time);
  // node:http, node:https and node:tls hold native bindings it cannot, and load at their first use,
  // as FIRST_USE_BUILTINS do.
  const preload = SNAPSHOT_BUILTINS.map((id) => `process.getBuiltinModule('${id}');`).join(' ');
  return `${lazyModule}${preload}\n${out}`;
}

/**
 * `import { a, b as c } from 'node:x'` of a module loaded at first use: each name a function that
 * loads the module at its first call and calls (or, with `new`, constructs) what the module exports.
 */
function firstUseFunctions(what: string, id: string): string {
  const module = `firstUse_${id.replace(/\W/g, '_')}`;
  const names = what.slice(1, -1).split(',').map((n) => n.trim()).filter((n) => n !== '');
  const functions = names.map((n) => {
    const [exported, local] = n.includes(' as ') ? n.split(/\s+as\s+/) : [n, n];
    return `function ${local}(...a) { const f = ${module}.${exported}; return new.target ? new f(...a) : f(...a); }`;
  });
  return `const ${module} = builtinOnFirstUse('${id}'); ${functions.join(' ')}`;
}

const config = {
  main: script,
  useSnapshot: true,
  // Written beside the target and renamed over it: a running dist/webhook cannot be overwritten.
  output: path.join(dist, 'webhook.new'),
  disableExperimentalSEAWarning: true,
  useCodeCache: false,
  // The flags the service needs, set before any of its code runs: V8's linear-time regexp engine
  // (hook regexes are compiled for it), and an OpenSSL configuration that cannot be swapped for
  // one from the environment (OPENSSL_CONF can name a provider library, which OpenSSL loads and
  // runs at start-up). A path that does not exist means "no configuration file".
  //
  // V8 sized for a service that answers small requests and forks commands (issue figures in the
  // docs/results.md, `npm run bench`): a 1 MB semi-space keeps the young generation small (short-lived
  // request objects die there either way); no background compiler or GC threads and a V8 platform
  // pool of one (a 2-core pod gains nothing from them, each costs a thread and a malloc arena); the
  // old generation capped at half the memory the container may use (Node reads the cgroup limit),
  // so V8 collects before the kernel's OOM killer acts; and V8's own memory-saving mode, which grows
  // the heap by smaller steps than its default (that grows it to several times what is live when
  // thousands of follows parse watch events: a 2,000-push release, docs/results.md#2000-workloads).
  // (`--disable-sigusr1` would save the thread that waits for SIGUSR1, but it blocks the signal,
  // which adnanh uses to reload hooks; the service's own SIGUSR1 handler keeps the inspector from
  // starting.)
  //
  // A regular expression is compiled to machine code at its first use, not first to V8's regexp
  // bytecode (tiered up to machine code after that use anyway): the bytecode compiler's peephole
  // pass costs more than the machine code, about 3 ms at start-up for the one of node:net's
  // listen() alone (`npm run bench:start`, docs/results.md#start-up).
  //
  // V8 takes the code cache of Node's own modules (compiled at build time, in the snapshot) only
  // from a process whose V8 flags are those of the build: so the build runs with these options,
  // and the ones serve() sets (the regexp fallback) are here too, with the same values; a flag
  // that differs makes every built-in loaded after start-up (node:http, ...) compile from source.
  execArgv: [
    '--enable-experimental-regexp-engine',
    '--enable-experimental-regexp-engine-on-excessive-backtracks',
    `--regexp-backtracks-before-fallback=${backtracks}`,
    '--no-regexp-tier-up',
    '--openssl-config=/nonexistent/webhook-openssl.cnf',
    '--max-semi-space-size=1',
    '--single-threaded',
    '--v8-pool-size=1',
    '--max-old-space-size-percentage=50',
    '--optimize-for-size',
  ],
  // Nothing from outside extends them: NODE_OPTIONS (`--require`, `--import`, `--inspect`) is
  // ignored, and so is `--node-options`, so the environment cannot make the executable run code.
  execArgvExtension: 'none',
};
fs.writeFileSync(path.join(dist, 'sea.json'), JSON.stringify(config, null, 2));
execFileSync(process.execPath, [...config.execArgv, '--build-sea', path.join(dist, 'sea.json')], { stdio: 'inherit' });
const target = path.join(dist, 'webhook');
fs.renameSync(config.output, target);
console.log(`built ${path.relative(root, target)} (${(fs.statSync(target).size / 1e6).toFixed(0)} MB) with Node ${process.version}`);
