// Builds dist/webhook: webhook.ts with its types stripped, embedded in a copy of the Node binary
// running this script (Node's own single-executable support; nothing is downloaded).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { stripTypeScriptTypes } from 'node:module';
import * as path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');
const dist = path.join(root, 'dist');
fs.mkdirSync(dist, { recursive: true });

const source = fs.readFileSync(path.join(root, 'webhook.ts'), 'utf8');
fs.writeFileSync(path.join(dist, 'webhook.mjs'), builtinsOnDemand(stripTypeScriptTypes(source, { mode: 'strip' })));

/**
 * The start-up of the executable (`npm run bench:start`): an ES `import` of a built-in module
 * builds its namespace from every export, which runs the module's lazy getters (node:http's
 * WebSocket and fetch classes load undici: some 35 ms of CPU before the first line of the
 * service runs), while process.getBuiltinModule returns the module as it is. So each
 * `import … from 'node:…'` line becomes a constant read with process.getBuiltinModule, the same
 * objects under the same names; and the modules that only outbound TLS and -secure use (LAZY) are
 * loaded on first use, through a proxy, so a replica that serves plain HTTP answers before it has
 * loaded OpenSSL's side of Node. The source stays ordinary imports (for the type checker and tests).
 */
function builtinsOnDemand(js: string): string {
  const LAZY = new Set(['node:https', 'node:tls']);
  let lazyHelper = false;
  const rewritten = js.replace(/^import (.+) from '(node:[a-z_/]+)';$/gm, (line, what: string, id: string) => {
    if (what.startsWith('* as ')) {
      const name = what.slice('* as '.length);
      if (!LAZY.has(id)) return `const ${name} = process.getBuiltinModule('${id}');`;
      lazyHelper = true;
      return `const ${name} = builtinOnFirstUse('${id}');`;
    }
    if (!/^\{[\w\s,]*\}$/.test(what)) throw new Error(`scripts/build.ts: cannot rewrite the import line: ${line}`);
    const names = what.replace(/\b(\w+) as (\w+)\b/g, '$1: $2');
    return `const ${names} = process.getBuiltinModule('${id}');`;
  });
  const helper =
    'function builtinOnFirstUse(id) { let m; ' +
    'return new Proxy({}, { get: (_, k) => (m ??= process.getBuiltinModule(id))[k] }); }\n';
  return lazyHelper ? helper + rewritten : rewritten;
}

const config = {
  main: path.join(dist, 'webhook.mjs'),
  mainFormat: 'module',
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
  // so V8 collects before the kernel's OOM killer acts. (`--disable-sigusr1` would save the thread
  // that waits for SIGUSR1, but it blocks the signal, which adnanh uses to reload hooks; the
  // service's own SIGUSR1 handler keeps the inspector from starting.)
  execArgv: [
    '--enable-experimental-regexp-engine',
    '--openssl-config=/nonexistent/webhook-openssl.cnf',
    '--max-semi-space-size=1',
    '--single-threaded',
    '--v8-pool-size=1',
    '--max-old-space-size-percentage=50',
  ],
  // Nothing from outside extends them: NODE_OPTIONS (`--require`, `--import`, `--inspect`) is
  // ignored, and so is `--node-options`, so the environment cannot make the executable run code.
  execArgvExtension: 'none',
};
fs.writeFileSync(path.join(dist, 'sea.json'), JSON.stringify(config, null, 2));
execFileSync(process.execPath, ['--build-sea', path.join(dist, 'sea.json')], { stdio: 'inherit' });
const target = path.join(dist, 'webhook');
fs.renameSync(config.output, target);
console.log(`built ${path.relative(root, target)} (${(fs.statSync(target).size / 1e6).toFixed(0)} MB) with Node ${process.version}`);
