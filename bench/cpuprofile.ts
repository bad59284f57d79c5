/*
 * Summarises a V8 .cpuprofile (from `node --cpu-prof`): self time by function (name + url:line),
 * inclusive time of our own functions (webhook.ts), and self time by module.
 *
 *   node bench/cpuprofile.ts /tmp/prof/CPU.….cpuprofile [top=25]
 */

import * as fs from 'node:fs';
import * as path from 'node:path';

interface CallFrame { functionName: string; url: string; lineNumber: number; columnNumber: number }
interface ProfileNode { id: number; callFrame: CallFrame; children?: number[] }
interface Profile { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[]; startTime: number; endTime: number }

function shortUrl(url: string): string {
  if (url === '') return '';
  if (url.startsWith('file://')) return path.basename(url);
  return url;
}

function key(cf: CallFrame): string {
  const name = cf.functionName || '(anonymous)';
  const where = shortUrl(cf.url);
  return where ? `${name}  ${where}:${cf.lineNumber + 1}` : name;
}

/** Module a frame belongs to: webhook.ts, node:http…, or the pseudo-frame itself. */
function moduleOf(cf: CallFrame): string {
  if (cf.url === '') return cf.functionName.startsWith('(') ? cf.functionName : '(native / V8 builtins)';
  const u = shortUrl(cf.url);
  return u.replace(/^node:internal\//, 'node:internal/');
}

export interface Summary { totalMs: number; busyMs: number; text: string }

export function summarise(file: string, top = 25): Summary {
  const p = JSON.parse(fs.readFileSync(file, 'utf8')) as Profile;
  const byId = new Map<number, ProfileNode>();
  const parent = new Map<number, number>();
  for (const n of p.nodes) byId.set(n.id, n);
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);

  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const modules = new Map<string, number>();
  let total = 0;
  let idle = 0;
  for (let i = 0; i < p.samples.length; i++) {
    // timeDeltas[i] is the time before sample i; attribute the gap after a sample to it.
    const dt = (p.timeDeltas[i + 1] ?? 0) / 1000;
    const node = byId.get(p.samples[i])!;
    total += dt;
    if (node.callFrame.functionName === '(idle)') { idle += dt; continue; }
    const k = key(node.callFrame);
    self.set(k, (self.get(k) ?? 0) + dt);
    const m = moduleOf(node.callFrame);
    modules.set(m, (modules.get(m) ?? 0) + dt);
    const seen = new Set<string>();
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const cf = byId.get(id)!.callFrame;
      if (!/webhook(\.ts|-snapshot\.cjs)$/.test(cf.url)) continue;
      const ik = key(cf);
      if (seen.has(ik)) continue;
      seen.add(ik);
      inclusive.set(ik, (inclusive.get(ik) ?? 0) + dt);
    }
  }
  const busy = total - idle;
  const pct = (ms: number) => `${((100 * ms) / busy).toFixed(1).padStart(5)}%`;
  const rows = (m: Map<string, number>, n: number) =>
    [...m.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([k, ms]) => `  ${pct(ms)}  ${ms.toFixed(0).padStart(6)} ms  ${k}`);
  const text = [
    `profile ${path.basename(file)}: ${(total / 1000).toFixed(1)} s sampled, ${(busy / 1000).toFixed(1)} s busy ` +
      `(${((100 * busy) / total).toFixed(0)}%), ${(idle / 1000).toFixed(1)} s idle; percentages are of busy time`,
    `self time by function (top ${top}):`,
    ...rows(self, top),
    `self time by module:`,
    ...rows(modules, 15),
    `inclusive time of webhook.ts functions:`,
    ...rows(inclusive, 15),
  ].join('\n');
  return { totalMs: total, busyMs: busy, text };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  if (!process.argv[2]) {
    process.stderr.write('usage: node bench/cpuprofile.ts FILE.cpuprofile [top]\n');
    process.exit(2);
  }
  process.stdout.write(summarise(process.argv[2], Number(process.argv[3] ?? 25)).text + '\n');
}
