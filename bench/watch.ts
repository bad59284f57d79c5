/*
 * npm run bench:watch — the registry watch at scale, against the real lab registry (Debian's docker-registry over
 * TLS, test/registry.ts) and the test cluster: BENCH_WATCH_WORKLOADS Deployments (default 2,000, replicas 0) over
 * BENCH_WATCH_REPOS repositories (default 200), each annotated webhook/poll: BENCH_WATCH_INTERVAL (default 60s) under
 * the policy `minor` (a tag listing a look) or, for every BENCH_WATCH_MUTABLE-th one, `all` on `latest` (a HEAD).
 * Once every workload is watched and the catch-up has passed, BENCH_WATCH_ROUNDS intervals (default 3) are measured:
 * the registry's requests per interval (its own log: tag listings, HEADs), the service's CPU per interval (from
 * /proc) and its peak RSS (VmHWM). Keel's documented behaviour, for the table beside it: one cron job per image
 * (keel.sh/pollSchedule, default @every 1m), a HEAD or GET of its tag each, none shared.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort, httpRequest, makeTempDir, spawnWebhook, waitFor } from '../test/harness.ts';
import { ociArchive, startRegistry } from '../test/registry.ts';
import { clusterOrSkip, deployment, freshNamespaceName, kubectlFor, removeNamespace } from '../test/cluster/kube.ts';
import { upgradeHook } from '../test/upgrade-hooks.ts';

const WORKLOADS = Number(process.env.BENCH_WATCH_WORKLOADS ?? 2000);
const REPOS = Number(process.env.BENCH_WATCH_REPOS ?? 200);
const INTERVAL = process.env.BENCH_WATCH_INTERVAL ?? '60s';
const ROUNDS = Number(process.env.BENCH_WATCH_ROUNDS ?? 3);
const MUTABLE = Number(process.env.BENCH_WATCH_MUTABLE ?? 10);
const INTERVAL_MS = Number(/^(\d+)s$/.exec(INTERVAL)?.[1] ?? 60) * 1000;
// Pushes of the one small image to each repository, this many at once: skopeo takes about a second each.
const PUSHES_AT_ONCE = 8;

/** CPU seconds (user + system) the process has used, and its peak resident memory in MiB, from /proc. */
function usage(pid: number): { cpu: number; peakMiB: number } {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const hwm = Number(/VmHWM:\s+(\d+) kB/.exec(status)?.[1] ?? 0);
  return { cpu: (Number(stat[11]) + Number(stat[12])) / 100, peakMiB: Math.round(hwm / 1024) };
}

const cluster = await clusterOrSkip();
if (!cluster) throw new Error('bench:watch needs the test cluster (npm run cluster:up)');
const kubectl = kubectlFor(cluster);
const work = makeTempDir('bench-watch-');
const registry = await startRegistry({ tls: true });
const archive = ociArchive(work, 'bench').path;
const repos = Array.from({ length: REPOS }, (_, i) => `bench/r${i}`);
for (let i = 0; i < repos.length; i += PUSHES_AT_ONCE)
  await Promise.all(repos.slice(i, i + PUSHES_AT_ONCE).map(async (r) => {
    // One repository's two tags one after the other: two uploads of one blob at once race in the registry.
    await registry.push(archive, `${r}:1.0.0`);
    await registry.push(archive, `${r}:latest`);
  }));
const ns = freshNamespaceName('bench-watch');
await kubectl(['create', 'namespace', ns]);
const items = Array.from({ length: WORKLOADS }, (_, i) => {
  const mutable = i % MUTABLE === 0;
  const d = deployment(`w${i}`, [{ name: 'app', image: `${registry.host}/${repos[i % REPOS]}:${mutable ? 'latest' : '1.0.0'}` }], { replicas: 0 }) as { metadata: Record<string, unknown> };
  d.metadata.annotations = { 'webhook/poll': INTERVAL, 'webhook/hook': 'watch', 'webhook/policy': mutable ? 'all' : 'minor' };
  return d;
});
for (let i = 0; i < items.length; i += 500)
  await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: items.slice(i, i + 500) }));
const caFile = path.join(work, 'ca.pem');
fs.writeFileSync(caFile, registry.caPem!);
const port = await freePort();
const service = await spawnWebhook({ hooks: [upgradeHook('watch', 'bench-watch-token', { REGISTRY_CA: caFile })], env: { KUBECONFIG: cluster.kubeconfigPath }, metrics: true }, port);
try {
  const logged = await waitFor(() => /serving metrics on http:\/\/127\.0\.0\.1:(\d+)\/metrics/.exec(service.output()) ?? undefined, { timeoutMs: 30_000, what: "the metrics listener" });
  const metricsPort = Number(logged[1]);
  // At least: a namespace an earlier run left being deleted may still show its workloads.
  const watchedNow = async () => Number(/^webhook_registry_watched (\d+)$/m.exec((await httpRequest(metricsPort, '/metrics')).body)?.[1] ?? 0);
  await waitFor(async () => (await watchedNow()) >= WORKLOADS, { timeoutMs: 120_000, what: `${WORKLOADS} workloads watched` });
  // The catch-up (every workload once within 10 s of the start), then one interval more, before measuring.
  await sleep(INTERVAL_MS + 10_000);
  const count = () => {
    const lines = registry.log().split('\n').filter((l) => l.includes('response completed') && l.includes('/v2/bench/'));
    return { lists: lines.filter((l) => l.includes('/tags/list')).length, heads: lines.filter((l) => l.includes('http.request.method=HEAD')).length };
  };
  const start = { ...count(), ...usage(service.proc.pid!) };
  await sleep(ROUNDS * INTERVAL_MS);
  const end = { ...count(), ...usage(service.proc.pid!) };
  const mutable = Math.ceil(WORKLOADS / MUTABLE);
  const perInterval = (n: number) => (n / ROUNDS).toFixed(1);
  process.stdout.write([
    `bench:watch — ${WORKLOADS} workloads over ${REPOS} repositories (${mutable} on latest under all), every ${INTERVAL}, ${ROUNDS} intervals measured`,
    '',
    '| | tag listings / interval | HEADs / interval | CPU s / interval | peak RSS |',
    '|---|---|---|---|---|',
    `| webhook (this run) | ${perInterval(end.lists - start.lists)} (goal ≤ ${REPOS}) | ${perInterval(end.heads - start.heads)} (goal ≤ ${Math.min(REPOS, mutable)}) | ${perInterval(end.cpu - start.cpu)} | ${end.peakMiB} MiB |`,
    `| Keel (documented: a job per image, nothing shared) | — | ${WORKLOADS} (one HEAD or GET per workload) | — | — |`,
    '',
  ].join('\n'));
} catch (e) {
  process.stderr.write(`${service.output().split('\n').filter((l) => /registry watch|error|warning/.test(l)).slice(-20).join('\n')}\n`);
  throw e;
} finally {
  service.proc.kill('SIGTERM');
  await service.exited;
  await registry.stop();
  await removeNamespace(kubectl, ns);
}
