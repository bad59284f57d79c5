/*
 * `npx node bench/envelope.ts`: what one batch of events costs dist/webhook. A CNCF Distribution envelope of empty
 * events, an Event Grid batch and a CloudEvents batch, none a push, each as many events as fill BENCH_ENVELOPE_BYTES
 * (1 MiB: 340,000 empty events in an envelope), each POSTed BENCH_ENVELOPE_ROUNDS times (3) to an upgrade hook, in a
 * fresh process per kind. Printed per kind: the body's size, the largest answer, the log's growth, the deliveries JSON's size, and the
 * process's RSS before and after, and its peak (VmHWM, /proc/<pid>/status). No cluster is needed: nothing in these
 * batches is a push, so the upgrade answers before it reads a workload. `npx node bench/envelope.ts <binary>` measures
 * another build (an older one, for the figures before).
 */

import * as fs from 'node:fs';
import * as path from 'node:path';
import { adminPort, httpRequest, startWebhook } from '../test/harness.ts';

const BYTES = Number(process.env.BENCH_ENVELOPE_BYTES ?? 1024 * 1024);
const ROUNDS = Number(process.env.BENCH_ENVELOPE_ROUNDS ?? 3);
const ROOT = path.resolve(import.meta.dirname, '..');
const BIN = process.argv[2];

/** As many copies of `event` as fill BYTES (less room for an envelope), as a JSON array's text. */
const filled = (event: object) =>
  JSON.stringify(Array(Math.floor((BYTES - 64) / (JSON.stringify(event).length + 1))).fill(event));

/** The body of each kind: its events, nothing in them a push. */
const KINDS: Record<string, { repoType: string; body: string; type: string }> = {
  distribution: { repoType: 'distribution', body: `{"events":${filled({})}}`, type: 'json' },
  eventgrid: { repoType: 'azure', body: filled({ eventType: 'x' }), type: 'json' },
  cloudevents: {
    repoType: 'cloudevents',
    body: filled({ specversion: '1.0', type: 'ImageX' }),
    type: 'cloudevents-batch+json',
  },
};

const hook = {
  id: 'upgrade',
  'execute-command': path.join(ROOT, 'webhooks.sh'),
  'include-command-output-in-response': true,
  'include-command-output-in-response-on-error': true,
  'pass-arguments-to-command': [{ source: 'entire-payload' }, { source: 'entire-headers' }],
  'pass-environment-to-command': [
    ...['ns', 'workload', 'container', 'repo_type'].map((name) => ({
      envname: name === 'repo_type' ? 'REPO_TYPE' : `APP_${name.toUpperCase()}`,
      source: 'url',
      name,
    })),
  ],
};

/** VmRSS and VmHWM of a process, in MiB. */
function memory(pid: number): { rss: number; hwm: number } {
  const text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k: string) => Number(text.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN);
  return { rss: kb('VmRSS') / 1024, hwm: kb('VmHWM') / 1024 };
}

async function measure(name: string): Promise<void> {
  const kind = KINDS[name];
  const w = await startWebhook({ hooks: [hook], args: ['-max-body-size', String(BYTES)], metrics: true, bin: BIN });
  try {
    const admin = await adminPort(w);
    const before = memory(w.proc.pid!);
    const logBefore = w.output().length;
    const query = new URLSearchParams({ ns: 'prod', workload: 'deployment/web', container: 'app', repo_type: kind.repoType });
    let answer = 0;
    for (let i = 0; i < ROUNDS; i++) {
      const res = await w.request(`/hooks/upgrade?${query}`, {
        method: 'POST',
        headers: { 'Content-Type': `application/${kind.type}` },
        body: kind.body,
      });
      answer = Math.max(answer, res.body.length);
    }
    const deliveries = (await httpRequest(admin, '/deliveries.json')).body.length;
    const after = memory(w.proc.pid!);
    const mb = (n: number) => (n < 1e5 ? `${(n / 1e3).toFixed(1)} kB` : `${(n / 1e6).toFixed(2)} MB`);
    console.log(
      `${name}: body ${mb(Buffer.byteLength(kind.body))}, ${ROUNDS} requests: largest answer ${mb(answer)}, ` +
        `log +${mb(w.output().length - logBefore)}, deliveries.json ${mb(deliveries)}; ` +
        `RSS ${before.rss.toFixed(0)} MiB before, ${after.rss.toFixed(0)} MiB after, peak ${after.hwm.toFixed(0)} MiB (VmHWM)`,
    );
  } finally {
    await w.stop();
  }
}

for (const name of Object.keys(KINDS)) await measure(name);
