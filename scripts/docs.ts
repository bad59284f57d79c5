/*
 * Writes the parts of the docs that are written from the code's own tables, so they cannot drift from it:
 *
 *   node scripts/docs.ts
 *
 * Each part sits between a BEGIN and an END marker in its page and is rewritten whole:
 *   - docs/configuration.md: the settings tables and "In detail" (HOOK_SETTINGS, scripts/settings-doc.ts);
 *   - docs/notifications.md: the words `decision` takes (DECISIONS, each meaning the comment above its entry);
 *   - docs/development.md: the decision codes (DECISIONS) and the chapters of webhook.ts (its section banners
 *     and the table of contents in its header, as test/structure.ts reads them);
 *   - docs/upgrade.md: the Events a push writes on its workload (PUSH_EVENTS, each meaning the comment above it)
 *     and the annotations on a workload (ANNOTATIONS).
 * test/docs.test.ts fails when a page holds another text than this writes.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { analyse, SOURCE } from '../test/structure.ts';
import { ANNOTATIONS, DECISIONS, PUSH_EVENTS } from '../webhook.ts';
import {
  CONFIGURATION,
  DETAILS_BEGIN,
  DETAILS_END,
  BEGIN,
  END,
  settingDetailsSection,
  settingsSection,
} from './settings-doc.ts';

const DOCS = path.join(import.meta.dirname, '..', 'docs');

/** One generated part: the page, its markers, and the whole text from BEGIN to END that belongs there. */
export interface GeneratedPart {
  file: string;
  begin: string;
  end: string;
  render(): string;
}

/** A part's markers: what it is written from, and the command that writes it. */
function markers(name: string, from: string): { begin: string; end: string } {
  return {
    begin: `<!-- BEGIN ${name}: written from ${from} by \`node scripts/docs.ts\`; do not edit -->`,
    end: `<!-- END ${name} -->`,
  };
}

/** A part whose text is the lines `body` gives, between its markers. */
function part(file: string, name: string, from: string, body: () => string[]): GeneratedPart {
  const { begin, end } = markers(name, from);
  return { file, begin, end, render: () => [begin, '', ...body(), '', end].join('\n') };
}

// ---- the decisions -----------------------------------------------------------------------------

type DecisionCode = keyof typeof DECISIONS;

/** Each entry's meaning in one of webhook.ts's tables (`export const <table> = { … }`): the doc comment above it. */
function entryComments(source: string, table: string, keys: string[]): Map<string, string> {
  const start = source.indexOf(`export const ${table} = {`);
  const stop = source.indexOf('\n}', start);
  if (start < 0 || stop < 0)
    throw new Error(`${SOURCE}: no "export const ${table} = { … }" (its entries, each under its comment)`);
  const meanings = new Map<string, string>();
  for (const m of source.slice(start, stop).matchAll(/\/\*\*([^]*?)\*\/\s*(?:'([^']+)'|([\w$]+)):/g)) {
    meanings.set(m[2] ?? m[3], m[1].replace(/\s*\n\s*\*\s*/g, ' ').trim());
  }
  const without = keys.filter((c) => !meanings.get(c));
  if (without.length) throw new Error(`${SOURCE}: ${table}: no comment above ${without.join(', ')}`);
  return meanings;
}

/** Each decision code's meaning: the doc comment above its entry of DECISIONS in webhook.ts. */
export function decisionMeanings(source = fs.readFileSync(SOURCE, 'utf8')): Map<string, string> {
  return entryComments(source, 'DECISIONS', Object.keys(DECISIONS));
}

/** Published word → the codes that publish it, in the order of DECISIONS. */
function publishedWords(): Map<string, DecisionCode[]> {
  const words = new Map<string, DecisionCode[]>();
  for (const [code, d] of Object.entries(DECISIONS) as [DecisionCode, { published: string }][]) {
    (words.get(d.published) ?? words.set(d.published, []).get(d.published)!).push(code);
  }
  return words;
}

const cell = (text: string): string => text.replaceAll('|', '\\|');

/** docs/notifications.md: what each `decision` word means. */
function publishedTable(): string[] {
  const meanings = decisionMeanings();
  const rows = [...publishedWords()].map(([word, codes]) => {
    const meaning =
      codes.length === 1 ? meanings.get(codes[0])! : codes.map((c) => `\`${c}\`: ${meanings.get(c)}`).join(' ');
    return `| \`${word}\` | ${cell(meaning)} |`;
  });
  return ['| `decision` | What it means |', '|---|---|', ...rows];
}

/** docs/development.md: the closed list of decision codes. */
function codeTable(): string[] {
  const meanings = decisionMeanings();
  const rows = (Object.entries(DECISIONS) as [DecisionCode, { published: string }][]).map(
    ([code, d]) => `| \`${code}\` | \`${d.published}\` | ${cell(meanings.get(code)!)} |`,
  );
  return ['| Code | Published as | Meaning |', '|---|---|---|', ...rows];
}

// ---- the annotations ---------------------------------------------------------------------------

/** docs/upgrade.md: every annotation the service reads or writes, who writes it, what it holds. */
function annotationTable(): string[] {
  const rows = Object.values(ANNOTATIONS).map((a) => `| \`${a.key}\` | ${a.by} | ${cell(a.holds)} |`);
  return ['| Annotation | Written by | What it holds |', '|---|---|---|', ...rows];
}

// ---- the Events ----------------------------------------------------------------------------------

/** docs/upgrade.md: every Event a push writes on its workload, by reason, with when (PUSH_EVENTS' comments). */
function eventsTable(): string[] {
  const meanings = entryComments(fs.readFileSync(SOURCE, 'utf8'), 'PUSH_EVENTS', Object.keys(PUSH_EVENTS));
  const reasons = new Map<string, { type: string; when: string[] }>();
  for (const [kind, e] of Object.entries(PUSH_EVENTS)) {
    const row = reasons.get(e.reason) ?? reasons.set(e.reason, { type: e.type, when: [] }).get(e.reason)!;
    row.when.push(meanings.get(kind)!);
  }
  const rows = [...reasons].map(([reason, r]) => `| \`${reason}\` | ${r.type} | ${cell(r.when.join(' '))} |`);
  return ['| `reason` | `type` | When |', '|---|---|---|', ...rows];
}

// ---- the chapters ------------------------------------------------------------------------------

/** Chapter number → the names its entry in webhook.ts's table of contents gives (` *  13. title ..... names`). */
function contentsNames(source: string): Map<number, string[]> {
  const header = source.slice(0, source.indexOf('*/'));
  const names = new Map<number, string[]>();
  for (const m of header.matchAll(/^ \*\s+(\d+)\. .*?(?: \.{2,} |\s{2,})(\S.*)$/gm)) {
    names.set(Number(m[1]), m[2].split(/,\s*/).filter(Boolean));
  }
  return names;
}

/** docs/development.md: every chapter of webhook.ts, by part, with the names its table of contents entry gives. */
function chapterTables(): string[] {
  const source = fs.readFileSync(SOURCE, 'utf8');
  const r = analyse(source);
  const names = contentsNames(source);
  const table = (title: string, from: number, to: number) => {
    const chapters = r.sections.slice(from, to);
    const span = `chapters ${chapters[0].number}–${chapters.at(-1)!.number}`;
    return [
      `| ${title} (${span}) | Main names |`,
      '|---|---|',
      ...chapters.map((s) => {
        const listed = names.get(s.number);
        if (!listed) throw new Error(`${SOURCE}: the table of contents has no entry for ${s.number}. ${s.title}`);
        return `| ${s.number}. ${cell(s.title)} | ${listed.map((n) => `\`${n}\``).join(', ')} |`;
      }),
    ];
  };
  return [
    ...table('Part I, libraries', 0, r.partTwo),
    '',
    ...table('Part II, the service', r.partTwo, r.sections.length),
  ];
}

// ---- the parts, read and written ---------------------------------------------------------------

export const GENERATED_PARTS: GeneratedPart[] = [
  { file: CONFIGURATION, begin: BEGIN, end: END, render: settingsSection },
  { file: CONFIGURATION, begin: DETAILS_BEGIN, end: DETAILS_END, render: settingDetailsSection },
  part(path.join(DOCS, 'notifications.md'), 'decisions', 'DECISIONS (webhook.ts)', publishedTable),
  part(path.join(DOCS, 'development.md'), 'decision codes', 'DECISIONS (webhook.ts)', codeTable),
  part(path.join(DOCS, 'upgrade.md'), 'events', 'PUSH_EVENTS (webhook.ts)', eventsTable),
  part(path.join(DOCS, 'development.md'), 'chapters', "webhook.ts's banners and table of contents", chapterTables),
  part(path.join(DOCS, 'upgrade.md'), 'annotations', 'ANNOTATIONS (webhook.ts)', annotationTable),
];

/** A part as its page holds it now, markers included. */
export function documentedPart(p: GeneratedPart, text = fs.readFileSync(p.file, 'utf8')): string {
  const from = text.indexOf(p.begin);
  const to = text.indexOf(p.end, from);
  if (from < 0 || to < 0) throw new Error(`${path.relative(process.cwd(), p.file)}: no ${p.begin} … ${p.end} part`);
  return text.slice(from, to + p.end.length);
}

/** Rewrites every generated part in its page. */
export function writeGeneratedParts(): void {
  for (const p of GENERATED_PARTS) {
    const text = fs.readFileSync(p.file, 'utf8');
    fs.writeFileSync(
      p.file,
      text.replace(documentedPart(p, text), () => p.render()),
    );
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) writeGeneratedParts();
