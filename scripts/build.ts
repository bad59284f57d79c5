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
};
fs.writeFileSync(path.join(dist, 'sea.json'), JSON.stringify(config, null, 2));
execFileSync(process.execPath, ['--build-sea', path.join(dist, 'sea.json')], { stdio: 'inherit' });
const target = path.join(dist, 'webhook');
fs.renameSync(config.output, target);
console.log(`built ${path.relative(root, target)} (${(fs.statSync(target).size / 1e6).toFixed(0)} MB) with Node ${process.version}`);
