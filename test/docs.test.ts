// The documentation a newcomer starts from: a README short enough to read in one sitting, which
// links every page under docs/, and no relative link (file or #anchor) in README.md or docs/*.md
// that leads nowhere; every metric is documented; the parts written from the code's own tables
// (settings, decisions, chapters: scripts/docs.ts) are what the code says now. Reads files and
// imports webhook.ts; runs in about a second.

import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';

import { documentedPart, GENERATED_PARTS } from '../scripts/docs.ts';

const ROOT = path.resolve(import.meta.dirname, '..');
const README = path.join(ROOT, 'README.md');
const DOCS = path.join(ROOT, 'docs');

/** The most lines README.md may have: past this a newcomer stops reading before the install. */
const MAX_README_LINES = 250;

/** The pages everything beyond the README lives on; each must exist and be linked from it. */
const DOC_PAGES = [
  'install.md',
  'configuration.md',
  'hooks.md',
  'registries.md',
  'upgrade.md',
  'clusters.md',
  'approvals.md',
  'policies.md',
  'notifications.md',
  'security.md',
  'migrating.md',
  'development.md',
  'results.md',
];

const markdownFiles = (): string[] => [
  README,
  ...fs.readdirSync(DOCS).filter((f) => f.endsWith('.md')).sort().map((f) => path.join(DOCS, f)),
];

/** The text outside fenced code blocks, line by line (a `#` or `](` inside a fence is code). */
function proseLines(text: string): string[] {
  let fenced = false;
  return text.split('\n').filter((line) => {
    if (/^\s*```/.test(line)) {
      fenced = !fenced;
      return false;
    }
    return !fenced;
  });
}

/** Inline code spans are not links, whatever they contain. */
const withoutCodeSpans = (line: string): string => line.replace(/`[^`]*`/g, '');

/** Every inline link target of a markdown text (`[text](target)` and `![alt](target)`). */
function linkTargets(text: string): string[] {
  const targets: string[] = [];
  for (const line of proseLines(text)) {
    for (const m of withoutCodeSpans(line).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) targets.push(m[1]);
  }
  return targets;
}

/** The anchors GitHub gives a file's headings (github-slugger: lower case, punctuation dropped, spaces → -). */
function headingAnchors(text: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of proseLines(text)) {
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const plain = m[1].replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1');
    const base = plain.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

const isExternal = (target: string): boolean => /^[a-z][a-z0-9+.-]*:/i.test(target);

describe('documentation', () => {
  test(`README.md has at most ${MAX_README_LINES} lines`, () => {
    const lines = fs.readFileSync(README, 'utf8').replace(/\n$/, '').split('\n').length;
    assert.ok(lines <= MAX_README_LINES, `README.md has ${lines} lines`);
  });

  test('every docs page exists and is linked from README.md', () => {
    const linked = new Set(linkTargets(fs.readFileSync(README, 'utf8')).map((t) => t.split('#')[0]));
    assert.deepEqual(DOC_PAGES.filter((p) => !fs.existsSync(path.join(DOCS, p))), [], 'docs pages missing');
    assert.deepEqual(DOC_PAGES.filter((p) => !linked.has(`docs/${p}`)), [], 'docs pages README.md does not link');
  });

  test('every relative link in README.md and docs/*.md leads to an existing file and heading', () => {
    const broken: string[] = [];
    for (const file of markdownFiles()) {
      const rel = path.relative(ROOT, file);
      for (const target of linkTargets(fs.readFileSync(file, 'utf8'))) {
        if (isExternal(target)) continue;
        const [filePart, anchor] = target.split('#', 2);
        const dest = filePart === '' ? file : path.resolve(path.dirname(file), decodeURIComponent(filePart));
        if (!fs.existsSync(dest)) {
          broken.push(`${rel}: ${target} (no such file)`);
          continue;
        }
        if (anchor === undefined || !dest.endsWith('.md')) continue;
        if (!headingAnchors(fs.readFileSync(dest, 'utf8')).has(decodeURIComponent(anchor))) {
          broken.push(`${rel}: ${target} (no such heading in ${path.relative(ROOT, dest)})`);
        }
      }
    }
    assert.deepEqual(broken, []);
  });

  test('every part written from the code (scripts/docs.ts) is what the code says now', () => {
    assert.ok(GENERATED_PARTS.length >= 5);
    const stale = GENERATED_PARTS.filter((p) => documentedPart(p) !== p.render()).map(
      (p) => `${path.relative(ROOT, p.file)}: ${p.begin.replace(/^<!-- BEGIN ([^:]+):.*$/, '$1')}`,
    );
    assert.deepEqual(stale, [], 'stale: run `node scripts/docs.ts`');
  });

  test('every metric webhook.ts records has its HELP and a row in configuration.md', () => {
    const source = fs.readFileSync(path.join(ROOT, 'webhook.ts'), 'utf8');
    const recorded = new Set([...source.matchAll(/\.(?:inc|setGauge|observe)\('(webhook_\w+)'/g)].map((m) => m[1]));
    const help = source.slice(source.indexOf('const METRIC_HELP'), source.indexOf('export class Metrics'));
    const table = fs.readFileSync(path.join(DOCS, 'configuration.md'), 'utf8');
    assert.ok(recorded.size >= 10, `found ${recorded.size} metrics`);
    assert.deepEqual([...recorded].filter((name) => !help.includes(`  ${name}: [`)), [], 'without a HELP');
    assert.deepEqual([...recorded].filter((name) => !table.includes(`| \`${name}\` |`)), [], 'not in configuration.md');
  });
});
