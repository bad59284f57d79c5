/*
 * The shape of webhook.ts, measured: its sections (the banner comments), the top-level names each
 * declares and which later sections use them, function lengths and line widths. The house style
 * (DESIGN.md) asks that a push reads downward: no section uses a name a later section defines, each
 * banner lists the names later sections use, no function is longer than 60 lines and no line wider
 * than 120 columns. `node test/structure.ts` prints the report; test/structure.test.ts asserts it.
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

export const SOURCE = path.join(import.meta.dirname, '..', 'webhook.ts');
export const MAX_FUNCTION_LINES = 60;
export const MAX_LINE_WIDTH = 120;

export interface Section {
  number: number;
  title: string;
  /** 0-based line of the banner's first rule, and of the last line before the next banner. */
  start: number;
  end: number;
  /** The names the banner's "Exports:" lists. */
  listed: string[];
}

export interface Report {
  sections: Section[];
  /** Top-level name → index into sections. */
  declared: Map<string, number>;
  /** "section N uses NAME of section M" for every M > N. */
  forwardUses: string[];
  /** Per section index: names it declares that later sections use. */
  offered: Map<number, Set<string>>;
  longFunctions: { line: number; name: string; lines: number }[];
  wideLines: number[];
  /** Index of the first section of Part II (the service); the sections before it are Part I. */
  partTwo: number;
  /** Names the file exports. */
  exported: string[];
}

/** The line that opens Part II, the service; Part I, the libraries, is everything before it. */
const PART_TWO = /^\/\/ Part II\b/;
const EXPORTED = /^export (?:async )?(?:function\*? |class |const |let |interface |type |enum )([A-Za-z_$][\w$]*)/;
/** Where code outside webhook.ts lives: an export none of them and no later section uses is not needed. */
export const IMPORTERS = ['test', 'bench', 'scripts'].map((d) => path.join(import.meta.dirname, '..', d));

/** Per section title: the test files that import a name the section declares. */
export function testsImporting(r: Report, testDir = import.meta.dirname): Map<string, Set<string>> {
  const found = new Map<string, Set<string>>();
  for (const file of fs.readdirSync(testDir).filter((f) => f.endsWith('.ts'))) {
    const text = fs.readFileSync(path.join(testDir, file), 'utf8');
    for (const m of text.matchAll(/import\s*(?:type\s*)?\{([^}]*)\}\s*from\s*'\.\.\/webhook\.ts'/g)) {
      for (const raw of m[1].split(',')) {
        const home = r.declared.get(raw.trim().replace(/^type\s+/, '').split(/\s+as\s+/)[0]);
        if (home === undefined) continue;
        const title = r.sections[home].title;
        (found.get(title) ?? found.set(title, new Set()).get(title)!).add(file);
      }
    }
  }
  return found;
}

/** The test files a section's banner names after "Tests:". */
export function bannerTests(text: string, s: Section): string[] {
  const banner = text.split('\n').slice(s.start + 1, s.start + 40).join(' ').replace(/\s*\/\/\s*/g, ' ');
  const listed = /Tests: ([^]*?)\.(?:\s|$)/.exec(banner.split(/ ={20,}/)[0])?.[1] ?? '';
  return listed.split(/[\s,]+/).filter((f) => f.startsWith('test/')).map((f) => f.slice('test/'.length));
}

const RULE = /^\/\/ ={20,}$/;

function findSections(lines: string[]): Section[] {
  const sections: Section[] = [];
  for (let i = 0; i + 1 < lines.length; i++) {
    if (!RULE.test(lines[i])) continue;
    const m = /^\/\/ (\d+)\. (.+?)(?: — |$)/.exec(lines[i + 1]);
    if (!m) continue;
    let close = i + 2;
    while (close < lines.length && !RULE.test(lines[close])) close++;
    const banner = lines.slice(i + 1, close).map((l) => l.replace(/^\/\/ ?/, '')).join(' ');
    const exports = /Exports: ([^.]*)\./.exec(banner)?.[1] ?? '';
    const listed = exports.split(/[\s,]+/).filter((n) => /^[A-Za-z_$][\w$]*$/.test(n));
    if (sections.length) sections[sections.length - 1].end = i - 1;
    sections.push({ number: Number(m[1]), title: m[2], start: i, end: lines.length - 1, listed });
    i = close;
  }
  return sections;
}

/**
 * Blanks comments and the contents of strings and regular expressions (keeping `${…}` code in
 * template literals), so that what remains are the identifiers the code really uses. Line breaks
 * are kept, so line numbers still match.
 */
export function codeOnly(text: string): string {
  let out = '';
  let i = 0;
  const templateDepth: number[] = [];
  let braces = 0;
  let lastSignificant = '';
  const blank = (s: string) => s.replace(/[^\n]/g, ' ');
  while (i < text.length) {
    const c = text[i];
    const next = text[i + 1];
    if (c === '/' && next === '/') {
      const end = text.indexOf('\n', i);
      const stop = end < 0 ? text.length : end;
      out += blank(text.slice(i, stop));
      i = stop;
    } else if (c === '/' && next === '*') {
      const stop = text.indexOf('*/', i + 2) + 2;
      out += blank(text.slice(i, stop));
      i = stop;
    } else if (c === "'" || c === '"') {
      let j = i + 1;
      while (j < text.length && text[j] !== c) j += text[j] === '\\' ? 2 : 1;
      out += c + blank(text.slice(i + 1, j)) + c;
      i = j + 1;
      lastSignificant = c;
    } else if (c === '`' || (c === '}' && braces === 0 && templateDepth.length)) {
      if (c === '}') braces = templateDepth.pop()!;
      let j = i + 1;
      while (j < text.length && text[j] !== '`' && !(text[j] === '$' && text[j + 1] === '{')) j += text[j] === '\\' ? 2 : 1;
      out += c + blank(text.slice(i + 1, j));
      if (text[j] === '`') { out += '`'; i = j + 1; } else { templateDepth.push(braces); braces = 0; out += '${'; i = j + 2; }
      lastSignificant = '`';
    } else if (c === '/' && (lastSignificant === '' || '(,=:[!&|?{};+-*%<>~^'.includes(lastSignificant))) {
      let j = i + 1;
      let inClass = false;
      while (j < text.length && (inClass || text[j] !== '/') && text[j] !== '\n') {
        if (text[j] === '[') inClass = true;
        else if (text[j] === ']') inClass = false;
        j += text[j] === '\\' ? 2 : 1;
      }
      out += '/' + blank(text.slice(i + 1, j)) + '/';
      i = j + 1;
      lastSignificant = '/';
    } else {
      if (c === '{') braces++;
      else if (c === '}') braces--;
      if (!/\s/.test(c)) lastSignificant = /[\w$)\]]/.test(c) ? 'a' : c;
      out += c;
      i++;
    }
  }
  return out;
}

const DECLARATION = /^(?:export )?(?:async )?(?:function\*? |class |const |let |interface |type |enum )([A-Za-z_$][\w$]*)/;

/** Lines that open a function body, and the line where its braces balance again. */
function functionLengths(lines: string[], code: string[]): Report['longFunctions'] {
  const found: Report['longFunctions'] = [];
  const opener = /(?:\bfunction\b.*|=>\s*|^\s+(?:(?:private|static|async|get|set|public|readonly)\s+)*[\w$#]+(?:<.*>)?\(.*\)(?::.*)?\s*)\{$/;
  for (let i = 0; i < lines.length; i++) {
    const l = code[i].trimEnd();
    // A signature prettier wrapped ends in `): T {` at the indentation of the line it started on.
    const wrappedEnd = /^\s*\)(?::[^=]*)?\s*\{$/.test(l);
    if (!wrappedEnd && (!opener.test(l) || /^\s*(if|for|while|switch|catch|else|try|do)\b/.test(l.trim()))) continue;
    let start = i;
    if (wrappedEnd) {
      const indent = /^\s*/.exec(l)![0].length;
      while (start > 0 && /^\s*/.exec(code[start - 1])![0].length > indent) start--;
      start--;
      if (!/\bfunction\b|^\s+(?:(?:private|static|async|get|set)\s+)*[\w$#]+\s*\($/.test(code[start])) continue;
    }
    let depth = 0;
    let j = i;
    for (; j < code.length; j++) {
      const text = j === i ? l.slice(l.length - 1) : code[j];
      for (const c of text) depth += c === '{' ? 1 : c === '}' ? -1 : 0;
      if (depth <= 0) break;
    }
    const length = j - start + 1;
    if (length > MAX_FUNCTION_LINES) {
      const keyword = /(?:function\*?\s+|const\s+|^\s*(?:(?:private|static|async|get|set|export|function)\s+)*)([\w$#]+)/;
      found.push({ line: start + 1, name: keyword.exec(lines[start])?.[1] ?? '?', lines: length });
    }
  }
  return found;
}

export function analyse(text = fs.readFileSync(SOURCE, 'utf8')): Report {
  const lines = text.split('\n');
  const code = codeOnly(text).split('\n');
  const sections = findSections(lines);
  const sectionOf = (line: number) => sections.findIndex((s) => line >= s.start && line <= s.end);
  const declared = new Map<string, number>();
  lines.forEach((l, i) => {
    const m = DECLARATION.exec(l);
    if (m && sectionOf(i) >= 0) declared.set(m[1], sectionOf(i));
  });
  const forwardUses = new Set<string>();
  const offered = new Map<number, Set<string>>();
  code.forEach((l, i) => {
    const here = sectionOf(i);
    if (here < 0) return;
    // A name after one dot is a member; after a spread's three dots it is a use.
    for (const m of l.matchAll(/(?<![\w$])(?<!(?<!\.\.)\.)[A-Za-z_$][\w$]*/g)) {
      const home = declared.get(m[0]);
      if (home === undefined || home === here) continue;
      // A key in an object literal (`name: value`) or a member name is not a use of a top-level name.
      if (/^\s*\??:(?!:)/.test(l.slice(m.index! + m[0].length)) && !/[?]\s*$/.test(l.slice(0, m.index))) continue;
      if (home > here) forwardUses.add(`section ${sections[here].number} (${sections[here].title}) uses ${m[0]} of section ${sections[home].number} (${sections[home].title})`);
      else (offered.get(home) ?? offered.set(home, new Set()).get(home)!).add(m[0]);
    }
  });
  const wideLines = lines.flatMap((l, i) => ([...l].length > MAX_LINE_WIDTH ? [i + 1] : []));
  const partLine = lines.findIndex((l) => PART_TWO.test(l));
  const partTwo = partLine < 0 ? 0 : sections.findIndex((s) => s.start > partLine);
  const exported = lines.flatMap((l) => EXPORTED.exec(l)?.[1] ?? []);
  const longFunctions = functionLengths(lines, code);
  return { sections, declared, forwardUses: [...forwardUses], offered, longFunctions, wideLines, partTwo, exported };
}

if (import.meta.main) {
  const r = analyse();
  for (const [i, s] of r.sections.entries()) {
    const offered = [...(r.offered.get(i) ?? [])].sort();
    const unlisted = offered.filter((n) => !s.listed.includes(n));
    const stale = s.listed.filter((n) => !offered.includes(n));
    console.log(`${s.number}. ${s.title} (lines ${s.start + 1}-${s.end + 1}, ${s.end - s.start + 1} lines)`);
    console.log(`   offers: ${offered.join(', ')}`);
    if (unlisted.length) console.log(`   NOT LISTED: ${unlisted.join(', ')}`);
    if (stale.length) console.log(`   LISTED BUT NOT USED LATER: ${stale.join(', ')}`);
  }
  for (const f of r.forwardUses) console.log(`FORWARD: ${f}`);
  for (const f of r.longFunctions) console.log(`LONG: ${f.name} at line ${f.line}: ${f.lines} lines`);
  console.log(`Part I: sections 1-${r.partTwo}; Part II: sections ${r.partTwo + 1}-${r.sections.length}`);
  console.log(`wide lines: ${r.wideLines.length}`);
}

// ---- the tests' own rules -----------------------------------------------------------------------

export const TEST_DIR = import.meta.dirname;
/** A bound on elapsed wall-clock time below this belongs in a benchmark: a loaded machine breaks it. */
export const MIN_WALL_CLOCK_BOUND_MS = 5_000;
/** Lines a block must share to count as repeated, and in how many places a repeat is one too many. */
export const REPEAT_LINES = 6;
export const REPEAT_PLACES = 3;

function testSources(dir = TEST_DIR): { file: string; lines: string[] }[] {
  return fs
    .readdirSync(dir, { recursive: true })
    .map(String)
    // The measuring tool's own test holds examples of what it looks for.
    .filter((f) => f.endsWith('.ts') && !path.basename(f).startsWith('structure.'))
    .map((file) => ({ file, lines: fs.readFileSync(path.join(dir, file), 'utf8').split('\n') }));
}

/**
 * Assertions that bound elapsed wall-clock time below MIN_WALL_CLOCK_BOUND_MS ("elapsed < 2000",
 * "Date.now() - started <= 1_500"): `file:line`.
 */
export function shortWallClockBounds(dir = TEST_DIR): string[] {
  const timed = /\b(?:elapsed|took|ms|duration|Date\.now\(\)\s*-\s*[\w.]+|performance\.now\(\)\s*-\s*[\w.]+)\s*<=?\s*([\d_]+)/;
  return testSources(dir).flatMap(({ file, lines }) =>
    lines.flatMap((l, i) => {
      const m = timed.exec(l);
      return m && /assert/.test(l) && Number(m[1].replaceAll('_', '')) < MIN_WALL_CLOCK_BOUND_MS ? [`${file}:${i + 1}`] : [];
    }),
  );
}

/**
 * Bare sleeps that are not a retry loop's pause: a negative check must wait for a later event that
 * proves the system got past the point, not for time. A sleep inside a loop (polling, pacing) is
 * allowed; one on its own is `file:line`.
 */
export function bareSleeps(dir = TEST_DIR): string[] {
  const sleep = /await (?:sleep\(|new Promise\(\(\w+\) => setTimeout\(\w+, )/;
  return testSources(dir).flatMap(({ file, lines }) =>
    lines.flatMap((l, i) => {
      return sleep.test(l) && !insideLoop(lines, i) ? [`${file}:${i + 1}`] : [];
    }),
  );
}

/** Whether line `at` is inside a loop (or a task a test times on purpose), by the blocks that enclose it. */
function insideLoop(lines: string[], at: number): boolean {
  const indent = (l: string) => /^\s*/.exec(l)![0].length;
  let within = indent(lines[at]);
  for (let j = at - 1; j >= 0 && within > 0; j--) {
    if (lines[j].trim() === '' || indent(lines[j]) >= within) continue;
    within = indent(lines[j]);
    if (/^\s*(?:for|while)\s*\(|^\s*do\s*\{|^\s*const task = /.test(lines[j])) return true;
  }
  return false;
}

/**
 * Blocks of REPEAT_LINES lines (trimmed, ignoring blank lines and lines of only brackets) that stand
 * in REPEAT_PLACES or more places across the test files: each as its first line and its places.
 */
export function repeatedBlocks(dir = TEST_DIR): string[] {
  const places = new Map<string, string[]>();
  for (const { file, lines } of testSources(dir)) {
    const kept = lines
      .map((text, i) => ({ text: text.trim(), line: i + 1 }))
      .filter((l) => l.text !== '' && !/^[)}\];,]*$/.test(l.text) && !l.text.startsWith('//'));
    for (let i = 0; i + REPEAT_LINES <= kept.length; i++) {
      const key = kept.slice(i, i + REPEAT_LINES).map((l) => l.text).join('\n');
      (places.get(key) ?? places.set(key, []).get(key)!).push(`${file}:${kept[i].line}`);
    }
  }
  return [...places].filter(([, at]) => at.length >= REPEAT_PLACES).map(([key, at]) => `${key.split('\n')[0]} (${at.join(', ')})`);
}

// ---- where an environment is read ----------------------------------------------------------------

/**
 * A read of an environment of strings: `env.NAME`, `env[…]`, `env?.[…]` (also `this.env.…`, `job.env.…`); a hook's
 * `hook.env` is its list of parameters, not an environment. A push's settings' input (SettingInput) read by name,
 * `input('NAME')` or `settingOf(…)`, is one too.
 */
const ENVIRONMENT_READ =
  /(?<![\w$])(?<!\bhook\.)env(?:\.[A-Za-z_$]|\[|\?\.\[)|(?<![\w$.])(?:input\((?:'[^']*'|name)\)|settingOf\()/g;
const TOP_FUNCTION = /^(?:export\s+)?(?:async\s+)?(?:function\*?\s+([\w$]+)|const\s+([\w$]+)\s*=.*=>)/;
const TOP_CLASS = /^(?:export\s+)?(?:abstract\s+)?class\s+([\w$]+)/;
const METHOD = /^ {2}(?:(?:private|public|protected|static|async|readonly|get|set)\s+)*([A-Za-z_$#][\w$]*)\s*(?:<[^>]*>)?\(/;

/**
 * Each function or method (`Class.method`) of webhook.ts that reads an environment, with the lines it does so on:
 * after a push's boundary the hook's settings are a typed HookConfig, and only the boundaries read an environment.
 */
export function environmentReaders(text = fs.readFileSync(SOURCE, 'utf8')): Map<string, number[]> {
  return functionsMatching(ENVIRONMENT_READ, text);
}

/** The last text functionsMatching read, as code lines: the checks ask it of one text several times. */
let codeLines: { text: string; code: string[] } | undefined;

/**
 * Each function or method (`Class.method`) of webhook.ts whose code matches `pattern` (global), with the lines it
 * does so on: who calls an executor, who reads an environment.
 */
export function functionsMatching(pattern: RegExp, text = fs.readFileSync(SOURCE, 'utf8')): Map<string, number[]> {
  if (codeLines?.text !== text) codeLines = { text, code: codeOnly(text).split('\n') };
  const code = codeLines.code;
  const readers = new Map<string, number[]>();
  let cls: string | undefined;
  let fn: string | undefined;
  code.forEach((l, i) => {
    const top = TOP_FUNCTION.exec(l);
    const klass = TOP_CLASS.exec(l);
    if (klass) [cls, fn] = [klass[1], undefined];
    else if (top) [cls, fn] = [undefined, top[1] ?? top[2]];
    else if (/^\S/.test(l) && !/^[})\]]/.test(l)) [cls, fn] = [undefined, undefined];
    else if (cls && METHOD.test(l) && !/^\s+(?:if|for|while|switch|catch|return)\b/.test(l))
      fn = `${cls}.${METHOD.exec(l)![1]}`;
    const reads = l.match(pattern)?.length ?? 0;
    if (!reads) return;
    const name = fn ?? (cls ? `${cls} (a field)` : '(top level)');
    readers.set(name, [...(readers.get(name) ?? []), i + 1]);
  });
  return readers;
}
