/*
 * npm run bench:upgrade — push → answer latency of the seed hook on the test cluster, beside the
 * floor: one raw PATCH of an identical Deployment's image over a kept-alive HTTPS connection (a
 * twin, so that the floor's changes do not make the service's copy of the pushed one stale, as
 * nobody else changes a workload between two pushes). Both are run 20 times, alternating, and
 * the medians and their ratio are printed.
 *
 * The push answer includes everything the product does for a push: HTTP parsing, the rule, the
 * in-process upgrade (one JSON patch; the workload is read first only when the service has not
 * seen it yet; the Event is recorded after the answer), and the report.
 *
 * Each is one push (or one PATCH) to a quiet workload, as a release pushes each image once: before
 * the next, the bench waits until the rollout it started is complete and, for the push, until the
 * service has taken its follow record off (the follow's end). Pushed back to back, each push would
 * meet the writes of the one before (the follow record, the controller's status updates), which
 * the API server serializes on the object. BENCH_BACK_TO_BACK=1 measures that case instead.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import {
  clusterOrSkip, acrImage, acrPayload, deployment, freshNamespaceName, kubectlFor,
} from '../test/cluster/kube.ts';
import { makeTempDir, startWebhook } from '../test/harness.ts';
import { FOLLOW_ANNOTATION, KubeClient, loadKubeconfig, rolloutStatus } from '../webhook.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 20);
const BACK_TO_BACK = process.env.BENCH_BACK_TO_BACK === '1';
const ROOT = path.resolve(import.meta.dirname, '..');
const TOKEN = 'bench-token-5d1e9c';

const cluster = await clusterOrSkip();
if (!cluster) process.exit(1);
const kubectl = kubectlFor(cluster);
const ns = freshNamespaceName('bench');
await kubectl(['create', 'namespace', ns]);
const web = deployment('web', [{ name: 'app', image: acrImage('v0') }], { replicas: 1 });
const twin = deployment('twin', [{ name: 'app', image: acrImage('v0') }], { replicas: 1 });
await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [web, twin] }));
for (const d of ['web', 'twin']) await kubectl(['-n', ns, 'rollout', 'status', `deployment/${d}`, '--timeout=90s']);

const hooks = makeTempDir('bench-hooks-');
fs.writeFileSync(path.join(hooks, 'web.json'), fs.readFileSync(path.join(ROOT, 'examples', 'hooks', 'web.json'), 'utf8')
  .replace('"/webhooks.sh"', JSON.stringify(path.join(ROOT, 'webhooks.sh')))
  .replace('"/home"', JSON.stringify(hooks))
  .replace('"value": "prod"', `"value": ${JSON.stringify(ns)}`));
const wh = await startWebhook({
  hooks,
  verbose: false,
  env: { WEBHOOK_CMD: '-template', HOOK_TOKEN: TOKEN, KUBECONFIG: cluster.kubeconfigPath },
});
const client = new KubeClient(loadKubeconfig(cluster.kubeconfigPath));
const ref = { group: 'apps', version: 'v1', resource: 'deployments', namespace: ns, name: 'twin' };

const ms = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e6;
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2;
};

async function push(tag: string): Promise<number> {
  const query = new URLSearchParams({
    token: TOKEN, ns, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry',
  });
  const t0 = process.hrtime.bigint();
  const headers = { 'Content-Type': 'application/json' };
  const res = await wh.request(`/hooks/web?${query}`, { method: 'POST', headers, body: acrPayload(tag) });
  const took = ms(t0);
  if (res.status !== 200 || !res.body.includes('action:       image updated')) {
    throw new Error(`push ${tag}: ${res.status} ${res.body}`);
  }
  return took;
}

async function rawPatch(tag: string): Promise<number> {
  const t0 = process.hrtime.bigint();
  const image = { op: 'replace' as const, path: '/spec/template/spec/containers/0/image', value: acrImage(tag) };
  await client.patch(ref, [image], 'bench');
  return ms(t0);
}

/** Until the Deployment's rollout is complete and (for the pushed one) no follow is recorded on it any more. */
async function quiet(name: string): Promise<void> {
  for (let tries = 0; ; tries++) {
    const d = await client.get<any>({ ...ref, name });
    const complete = rolloutStatus('deployment', d).state === 'done';
    const follows = JSON.parse(d.metadata.annotations?.[FOLLOW_ANNOTATION] ?? '{}');
    if (complete && Object.keys(follows).length === 0) return;
    if (tries > 600) throw new Error(`deployment/${name} did not settle`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

await push('warm-a');
await rawPatch('warm-b');
const pushes: number[] = [];
const patches: number[] = [];
for (let i = 0; i < RUNS; i++) {
  if (!BACK_TO_BACK) await quiet('web');
  pushes.push(await push(`p${i}`));
  if (!BACK_TO_BACK) await quiet('twin');
  patches.push(await rawPatch(`r${i}`));
}
client.close();
await wh.stop();
await kubectl(['delete', 'namespace', ns, '--wait=false']);

const row = (name: string, xs: number[]) =>
  `${name.padEnd(34)} ${median(xs).toFixed(1).padStart(7)} ms  ` +
  `(min ${Math.min(...xs).toFixed(1)}, max ${Math.max(...xs).toFixed(1)})`;
console.log(`median of ${RUNS}, alternating${BACK_TO_BACK ? ', back to back' : ', each on a quiet workload'}, on the kwok test cluster:`);
console.log(row('push → answer (seed hook)', pushes));
console.log(row('raw PATCH of a twin Deployment', patches));
console.log(`ratio push/PATCH: ${(median(pushes) / median(patches)).toFixed(2)}x`);
