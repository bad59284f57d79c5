/**
 * Counts, in webhook.ts, the places where the upgrade's data design shows: how many sites write a
 * decision, assign a field of a report, write an Event, parse a hook setting, and which functions
 * take a raw environment of strings, plus the forms a delivery's record takes on its way from the
 * upgrade to the page. The model chapter's aim is to bring each count down; this script is how a
 * change to the design is measured before and after.
 *
 *   node scripts/design-counts.ts [webhook.ts]      # a table, one line per count
 *   node scripts/design-counts.ts --json            # the same as JSON
 *
 * Comments and the insides of strings are blanked first (test/structure.ts's codeOnly), so only
 * code is counted; each count names its pattern so that a reader can check it with grep.
 */
import { readFileSync } from 'node:fs';
import { analyse, codeOnly, SOURCE } from '../test/structure.ts';

interface Count {
  what: string;
  pattern: RegExp;
  /** Lines a match must not sit on (a declaration is not a use). */
  except?: RegExp;
  /** Matched in the text with its strings (not only the code), comment lines left out. */
  inStrings?: boolean;
}

const COUNTS: Count[] = [
  {
    // decide(report, …) wrote a decision into a report until the decision became a value (decide(input) returns it).
    what: 'sites that write a decision into a report (recordUnchanged, recordDecision; decide(report, …) before)',
    pattern: /(?<![\w$.])(?:recordUnchanged|recordDecision)\(|(?<![\w$.])decide\(\s*report\b/g,
    except: /function (?:recordUnchanged|recordDecision|decide)\(/,
  },
  {
    what: "sites that write a reason as an action's prose (none (…)) or read it back (whyNone)",
    pattern: /['`]none \(|(?<![\w$.])whyNone\(/g,
    except: /function whyNone\(/,
    inStrings: true,
  },
  {
    what: 'statements that assign a report field',
    pattern: /\b(?:\w*\.)?report\.[\w$]+(?:\.[\w$]+)*\s*(?:\+|\?\?|\|\|)?=(?!=)|Object\.assign\(\s*(?:\w+\.)?report\b/g,
  },
  {
    what: 'sites that write an Event',
    pattern: /(?<![\w$.])(?:recordWorkloadEvent|recordEventQuietly)\(/g,
    except: /function (?:recordWorkloadEvent|recordEventQuietly)\(/,
  },
  {
    what: "sites that name an Event's reason (compose an Event), PUSH_EVENTS' entries left out",
    pattern: /'(?:Upgrade|Rollout)[A-Z]\w*'|'(?:ImageUpdated|RolledBack)'/g,
    except: /^  (?:[\w$]+|'[^']+'): \{ type:/,
    inStrings: true,
  },
  { what: 'sites that parse a hook setting (HOOK_SETTINGS.X.parse)', pattern: /HOOK_SETTINGS\.[\w$]+\.parse\b/g },
  {
    // A source that is not a request making up the environment a request would have made (decidedEnv).
    what: 'made-up environments (decidedEnv calls)',
    pattern: /\bdecidedEnv\(/g,
    except: /^\s*(?:private\s+)?decidedEnv\(/,
  },
  {
    // A HookRequest built by a source that is not the HTTP boundary (prepareRequest's is the request itself).
    what: 'made-up HookRequests (a request literal outside the HTTP boundary)',
    pattern: /\bconst req: HookRequest = \{/g,
  },
];

/** A parameter that is an environment of strings: `env: Record<string, string…>` or an alias of it. */
const RAW_ENV_PARAMETER =
  /\b\w*[eE]nv\??:\s*(?:Readonly<)?(?:Record<string, string(?: \| undefined)?>|Environment|NodeJS\.ProcessEnv|UpgradeInputs)/;
/** The start of a function or method declaration, whose name is group 1. */
const FUNCTION_START =
  /^\s*(?:export\s+)?(?:(?:private|public|static|async|readonly)\s+)*(?:function\*?\s+)?([A-Za-z_$][\w$]*)\s*(?:<[^>]*>)?\(/;
/** The types a delivery's record has been declared as, from the report to the page. */
const RECORD_FORMS = ['UpgradeReport', 'UpgradeResult', 'MailJob', 'PushResult', 'Delivery'];
/** A line of a comment, whose prose is not code. */
const COMMENT_LINE = /^\s*(?:\/\/|\*|\/\*\*)/;

function countMatches(text: string, code: string[], c: Count): { sites: number; chapters: Set<number> } {
  const sections = analyse(text).sections;
  const lines = text.split('\n');
  const chapters = new Set<number>();
  let sites = 0;
  code.forEach((codeLine, i) => {
    const line = c.inStrings ? (COMMENT_LINE.test(lines[i]) ? '' : lines[i]) : codeLine;
    if (c.except?.test(line)) return;
    const found = line.match(c.pattern)?.length ?? 0;
    if (!found) return;
    sites += found;
    const s = sections.find((x) => i >= x.start && i <= x.end);
    if (s) chapters.add(s.number);
  });
  return { sites, chapters };
}

/** Functions whose parameter list (up to its closing parenthesis) has an environment parameter. */
function rawEnvironmentFunctions(code: string[]): string[] {
  const names: string[] = [];
  for (let i = 0; i < code.length; i++) {
    const m = FUNCTION_START.exec(code[i]);
    if (!m || /^(if|for|while|switch|catch|return|await|new)$/.test(m[1])) continue;
    // A call on a line of its own (`f(env.X);`) is a statement, not a signature.
    if (/;\s*$/.test(code[i])) continue;
    let signature = code[i];
    for (let j = i + 1; j < code.length && !/\)\s*(?::[^{=]*)?\{?\s*$/.test(signature) && j < i + 12; j++)
      signature += code[j];
    if (RAW_ENV_PARAMETER.test(signature.split(/\)\s*(?::|\{|$)/)[0])) names.push(`${m[1]}:${i + 1}`);
  }
  return names;
}

/**
 * Functions whose parameter list has a push's record they may write: a parameter named `report`, or of the record's
 * type (Delivery, or UpgradeReport before it was the record) whatever its name. A function that only reads a record
 * takes a ReportView, whose fields and notes the compiler keeps it from writing, and is not counted; nor are the
 * delivery log's own methods, the record's writer on the page's side by design.
 */
function reportParameterFunctions(code: string[]): string[] {
  const names: string[] = [];
  const logMethods = classLines(code, 'DeliveryLog');
  for (let i = 0; i < code.length; i++) {
    const m = FUNCTION_START.exec(code[i]);
    if (!m || /^(if|for|while|switch|catch|return|await|new)$/.test(m[1]) || /;\s*$/.test(code[i])) continue;
    let signature = code[i];
    for (let j = i + 1; j < code.length && !/\)\s*(?::[^{=]*)?\{?\s*$/.test(signature) && j < i + 12; j++)
      signature += code[j];
    const parameters = signature.split(/\)\s*(?::|\{|$)/)[0];
    if (logMethods.has(i)) continue;
    if (/[(,]\s*report\??:|[(,]\s*[\w$]+\??:\s*(?:UpgradeReport|Delivery)\b(?!\[)/.test(parameters))
      names.push(`${m[1]}:${i + 1}`);
  }
  return names;
}

/** The lines of a class's body (`class Name` to its closing brace at column 0). */
function classLines(code: string[], name: string): Set<number> {
  const lines = new Set<number>();
  const start = code.findIndex((l) => new RegExp(`^(?:export )?class ${name}\\b`).test(l));
  if (start < 0) return lines;
  for (let i = start + 1; i < code.length && code[i] !== '}'; i++) lines.add(i);
  return lines;
}

/** Settings whose text is parsed at more than one site (`HOOK_SETTINGS.X.parse`, or `read.X.parse` in readSettings). */
function settingsParsedTwice(code: string[]): string[] {
  const sites = new Map<string, number>();
  for (const line of code)
    for (const m of line.matchAll(/\b(?:HOOK_SETTINGS|read)\.([A-Z_]+)\.parse\b/g)) sites.set(m[1], (sites.get(m[1]) ?? 0) + 1);
  return [...sites].filter(([, n]) => n > 1).map(([name, n]) => `${name}×${n}`);
}

function recordForms(text: string): string[] {
  return RECORD_FORMS.filter((name) => new RegExp(`^(?:export )?(?:interface|type) ${name}\\b`, 'm').test(text));
}

const file = process.argv.slice(2).find((a) => !a.startsWith('--')) ?? SOURCE;
const text = readFileSync(file, 'utf8');
const code = codeOnly(text).split('\n');
const rows: { what: string; count: number; detail: string }[] = COUNTS.map((c) => {
  const { sites, chapters } = countMatches(text, code, c);
  return { what: c.what, count: sites, detail: `in ${chapters.size} chapters` };
});
const envFunctions = rawEnvironmentFunctions(code);
rows.push({ what: 'functions taking a raw environment', count: envFunctions.length, detail: envFunctions.join(' ') });
const reportFunctions = reportParameterFunctions(code);
rows.push({ what: 'functions with a record they may write (a report or Delivery parameter; the delivery log left out)', count: reportFunctions.length, detail: reportFunctions.join(' ') });
const twice = settingsParsedTwice(code);
rows.push({ what: 'settings parsed at more than one site', count: twice.length, detail: twice.join(' ') });
const forms = recordForms(text);
rows.push({ what: "forms of a delivery's record", count: forms.length, detail: forms.join(' → ') });
if (process.argv.includes('--json')) console.log(JSON.stringify(rows, null, 2));
else for (const r of rows) console.log(`${String(r.count).padStart(4)}  ${r.what}  (${r.detail})`);
