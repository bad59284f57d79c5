/**
 * The test files that took longest in a run of the suite, from its log (node:test's spec reporter, as `npm test`
 * prints it): each top-level suite's or test's duration, summed per file (a name is found in the file that
 * declares it), slowest first.
 *
 *   node scripts/test-times.ts run.log [count]      # the `count` slowest files (default 10), with their share
 */
import { readdirSync, readFileSync } from 'node:fs';
import * as path from 'node:path';

const [log, count = '10'] = process.argv.slice(2);
if (!log) throw new Error('usage: node scripts/test-times.ts <log of npm test> [count]');
const testDir = path.join(import.meta.dirname, '..', 'test');
const files = readdirSync(testDir).filter((f) => f.endsWith('.test.ts'));
const sources = new Map(files.map((f) => [f, readFileSync(path.join(testDir, f), 'utf8')]));
/** A name as the source spells it inside quotes: a quote of its kind escaped. */
const spelled = (name: string) => [name, name.replace(/'/g, "\\'"), name.replace(/"/g, '\\"')];
const perFile = new Map<string, { ms: number; names: number }>();
let total = 0;
for (const line of readFileSync(log, 'utf8').split('\n')) {
  const m = /^[✔✖﹣] (.+) \(([\d.]+)ms\)(?: #.*)?$/.exec(line);
  if (!m) continue;
  const ms = Number(m[2]);
  total += ms;
  const file = files.find((f) => spelled(m[1]).some((s) => sources.get(f)!.includes(s))) ?? '(not found)';
  const had = perFile.get(file) ?? { ms: 0, names: 0 };
  perFile.set(file, { ms: had.ms + ms, names: had.names + 1 });
}
const rows = [...perFile].sort((a, b) => b[1].ms - a[1].ms).slice(0, Number(count));
for (const [file, { ms, names }] of rows)
  console.log(`${(ms / 1000).toFixed(0).padStart(6)} s  ${((100 * ms) / total).toFixed(1).padStart(5)} %  ${file} (${names} top-level)`);
console.log(`${(total / 1000).toFixed(0).padStart(6)} s  in all`);
