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
fs.writeFileSync(path.join(dist, 'webhook.mjs'), stripTypeScriptTypes(source, { mode: 'strip' }));

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
  execArgv: ['--enable-experimental-regexp-engine', '--openssl-config=/nonexistent/webhook-openssl.cnf'],
  // Nothing from outside extends them: NODE_OPTIONS (`--require`, `--import`, `--inspect`) is
  // ignored, and so is `--node-options`, so the environment cannot make the executable run code.
  execArgvExtension: 'none',
};
fs.writeFileSync(path.join(dist, 'sea.json'), JSON.stringify(config, null, 2));
execFileSync(process.execPath, ['--build-sea', path.join(dist, 'sea.json')], { stdio: 'inherit' });
const target = path.join(dist, 'webhook');
fs.renameSync(config.output, target);
console.log(`built ${path.relative(root, target)} (${(fs.statSync(target).size / 1e6).toFixed(0)} MB) with Node ${process.version}`);
