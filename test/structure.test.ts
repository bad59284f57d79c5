// The house style of webhook.ts (DESIGN.md), measured by test/structure.ts: a push reads downward
// (no section uses a name a later section defines), each banner lists what later sections use,
// the header's table of contents names the sections, no function runs over 60 lines and no line
// over 120 columns.

import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { describe, test } from 'node:test';
import { analyse, codeOnly, MAX_FUNCTION_LINES, MAX_LINE_WIDTH, SOURCE } from './structure.ts';

const report = analyse();

describe('webhook.ts structure', () => {
  test('sections are numbered 1, 2, 3… in order', () => {
    assert.ok(report.sections.length >= 10);
    assert.deepEqual(report.sections.map((s) => s.number), report.sections.map((_, i) => i + 1));
  });

  test('the header names every section, in order', () => {
    const header = fs.readFileSync(SOURCE, 'utf8').split('*/')[0];
    for (const s of report.sections) {
      const entry = new RegExp(`^ \\*\\s+${s.number}\\. ${s.title.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').split(' ')[0]}`, 'm');
      assert.match(header, entry, `section ${s.number} (${s.title}) in the table of contents`);
    }
  });

  test('no section uses a name a later section defines', () => {
    assert.deepEqual(report.forwardUses, []);
  });

  test("each banner's Exports lists exactly the names later sections use", () => {
    for (const [i, s] of report.sections.entries()) {
      const offered = [...(report.offered.get(i) ?? [])].sort();
      assert.deepEqual([...s.listed].sort(), offered, `section ${s.number} (${s.title})`);
    }
  });

  test(`no function over ${MAX_FUNCTION_LINES} lines`, () => {
    assert.deepEqual(report.longFunctions, []);
  });

  test(`no line over ${MAX_LINE_WIDTH} columns`, () => {
    assert.deepEqual(report.wideLines, []);
  });

  test('the measuring tool sees through comments, strings and regular expressions', () => {
    const code = codeOnly("const a = 'Logger'; // Metrics\nconst b = /Hook/; const c = `x ${Snapshot} y`;");
    assert.doesNotMatch(code, /Logger|Metrics|Hook/);
    assert.match(code, /Snapshot/);
    const r = analyse(
      '// ' + '='.repeat(30) + '\n// 1. first — a.\n//    Exports: one.\n// ' + '='.repeat(30) + '\n' +
        'export function one() { return two(); }\n' +
        '// ' + '='.repeat(30) + '\n// 2. second — b.\n// ' + '='.repeat(30) + '\n' +
        'export function two() { return one(); }\n',
    );
    assert.deepEqual(r.forwardUses, ['section 1 (first) uses two of section 2 (second)']);
    assert.deepEqual([...(r.offered.get(0) ?? [])], ['one']);
    const body = Array.from({ length: 70 }, (_, i) => `  const x${i} = ${i};`).join('\n');
    const wrapped = analyse(`export async function longOne(\n  a: string,\n): Promise<void> {\n${body}\n}\n`);
    assert.deepEqual(wrapped.longFunctions, [{ line: 1, name: 'longOne', lines: 74 }]);
  });
});
