/*
 * Writes the settings tables of docs/configuration.md (the part between its BEGIN and END markers)
 * from HOOK_SETTINGS, the one table of the settings of the upgrade, its mail and its notifications
 * (webhook.ts, chapter "hook settings"):
 *
 *   node scripts/settings-doc.ts
 *
 * test/settings.test.ts fails when the document and the table disagree.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { HOOK_SETTINGS, type HookSetting } from '../webhook.ts';

/** A table cell: pipes escaped, so a value never splits the row. */
function cell(text: string): string {
  return text.replaceAll('|', '\\|');
}

function rows(from: HookSetting<unknown>['from']): string[] {
  const header = ['| Name | Type | Default | Fixed string | Validation | Meaning |', '|---|---|---|---|---|---|'];
  const entries = Object.entries(HOOK_SETTINGS) as [string, HookSetting<unknown>][];
  const lines = entries
    .filter(([, s]) => s.from === from)
    .map(([name, s]) => {
      const fixed = s.fixed ? 'yes' : 'no';
      return `| \`${name}\` | ${cell(s.type)} | ${cell(s.default)} | ${fixed} | ${cell(s.validation)} | ${cell(s.meaning)} |`;
    });
  return [...header, ...lines];
}

export const CONFIGURATION = path.join(import.meta.dirname, '..', 'docs', 'configuration.md');
export const BEGIN = '<!-- BEGIN settings: written from HOOK_SETTINGS by `node scripts/settings-doc.ts`; do not edit -->';
export const END = '<!-- END settings -->';

/** The generated part of docs/configuration.md, markers included. */
export function settingsSection(): string {
  return [
    BEGIN,
    '',
    '### Per hook',
    '',
    'Environment variables a hook passes to `/webhooks.sh` (`pass-environment-to-command`). A setting',
    'marked "fixed string" widens what a request may do, so the hook must give it as',
    '`{"source": "string", "envname": …, "name": <value>}`: a hooks file that takes it from the request,',
    'or gives a value that fails its validation, is refused when it loads. `-validate` lists, for each',
    'hook, the settings it passes with their type, default and meaning.',
    '',
    ...rows('hook'),
    '',
    "### The service's environment",
    '',
    "The service's own environment (the Deployment's `env`); the MAIL_* values other than the port, the",
    'TLS mode and the switches are base64, as the old image took them. A malformed one turns mail (or',
    'the notifications, for NOTIFY_CACERT) off and is logged at start.',
    '',
    ...rows('service'),
    '',
    END,
  ].join('\n');
}

/** The generated part as docs/configuration.md holds it now. */
export function documentedSection(text = fs.readFileSync(CONFIGURATION, 'utf8')): string {
  const from = text.indexOf(BEGIN);
  const to = text.indexOf(END);
  if (from < 0 || to < from) throw new Error(`${CONFIGURATION}: no ${BEGIN} … ${END} part`);
  return text.slice(from, to + END.length);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const text = fs.readFileSync(CONFIGURATION, 'utf8');
  fs.writeFileSync(CONFIGURATION, text.replace(documentedSection(text), settingsSection()));
}
