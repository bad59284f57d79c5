/*
 * Several clusters from one process. Two real test clusters run at once (the shared one and a
 * second started beside it under another name, with its own ports and data); the built executable
 * reads a KUBECONFIG list naming them as contexts "prod" and "staging". One delivery fanned out
 * (CLUSTERS) upgrades the Deployment in both, each with its own result, record and Event; with
 * one cluster's API server away, the delivery is answered 202 for it while the other is applied.
 * A Rancher-style path-prefix reverse proxy (a small node:https server here, taking a bearer token
 * and forwarding with the cluster's admin certificate, as Rancher's cluster proxy does) is
 * reached through a server URL with a path, which every request keeps. "Deploy again" deploys in the cluster of
 * the record it is pressed on (refused once the hook no longer names it); a CLUSTERS hook's waiting pushes are one
 * per cluster, listed, decided by link and expired in their own cluster.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as https from 'node:https';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  adminPort, defaultBinary, freePort, httpRequest, makeTempDir, startWebhook, waitFor, waitForOutput, type Webhook,
} from './harness.ts';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter, removeNamespace,
  renamedKubeconfig, type Cluster, type Kubectl,
} from './cluster/kube.ts';
import { ensureCluster } from './cluster/cluster.ts';
import { fixedSettings, upgradeHook } from './upgrade-hooks.ts';
import { sealPendingEntry } from '../webhook.ts';

const TOKEN = 'clusters-token-5d1f0a';
const RANCHER_TOKEN = 'kubeconfig-u-test:rancher-secret-7c2e';
/** The second test cluster's name: started beside the shared one, kept running like it. */
const SECOND_CLUSTER = 'webhook-test-b';
const PREFIX = '/k8s/clusters/c-m-test1';

const shared = await clusterOrSkip();
const second: Cluster | undefined = shared ? await ensureCluster(SECOND_CLUSTER) : undefined;

/** The executable run to its exit with these arguments and KUBECONFIG. */
function runToExit(args: string[], kubeconfigs: string[]) {
  const r = spawnSync(defaultBinary(), args, {
    env: { PATH: process.env.PATH, KUBECONFIG: kubeconfigs.join(path.delimiter) }, encoding: 'utf8',
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The Deployment "web" in a fresh namespace of each cluster, rolled out. */
async function webIn(kubectl: Kubectl, ns: string): Promise<void> {
  await kubectl(['create', 'namespace', ns]);
  await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('web', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
  await kubectl(['-n', ns, 'rollout', 'status', 'deployment/web', '--timeout=90s']);
}

describe('one process, several clusters', { skip: shared && second ? false : 'no clusters' }, () => {
  const ns = freshNamespaceName('clusters');
  const kubectlProd = kubectlFor(shared!);
  const kubectlStaging = kubectlFor(second!);
  const getProd = namespacedGetter(kubectlProd, ns);
  const getStaging = namespacedGetter(kubectlStaging, ns);
  const dir = makeTempDir('clusters-');
  const started: Webhook[] = [];
  const start = async (kubeconfigs: string[], settings: Record<string, string>, args: string[] = []) => {
    const wh = await startWebhook({
      hooks: [upgradeHook('deploy', TOKEN, settings)],
      args: ['-rollout-follow', '60s', ...args],
      metrics: true,
      env: { KUBECONFIG: kubeconfigs.join(path.delimiter) },
    });
    started.push(wh);
    return wh;
  };
  const push = (wh: Webhook, tag: string) =>
    wh.request(`/hooks/deploy?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
    });
  const prodConfig = () => renamedKubeconfig(shared!, 'prod', path.join(dir, 'prod.json'));
  const stagingConfig = (server?: string) => renamedKubeconfig(second!, 'staging', path.join(dir, 'staging.json'), server);

  before(async () => {
    await Promise.all([webIn(kubectlProd, ns), webIn(kubectlStaging, ns)]);
  });
  after(async () => {
    await Promise.all(started.map((w) => w.stop()));
    await Promise.all([removeNamespace(kubectlProd, ns), removeNamespace(kubectlStaging, ns)]);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('one delivery fanned out (CLUSTERS) upgrades the Deployment in both, each with its own result, record and Event', async () => {
    const wh = await start([prodConfig(), stagingConfig()], { CLUSTERS: 'staging prod' });
    const res = await push(wh, 'v2');
    console.log(`# the fan-out's answer (HTTP ${res.status}):\n${res.body}`);
    assert.equal(res.status, 200, res.body);
    const sections = res.body.split(/\n(?=cluster:)/);
    assert.equal(sections.length, 2, res.body);
    assert.match(sections[0], /^cluster: +staging$/m);
    assert.match(sections[1], /^cluster: +prod$/m);
    for (const s of sections) assert.match(s, /^action: +image updated$/m);
    assert.equal(containerImage(await getProd('deployment/web'), 'app'), acrImage('v2'));
    assert.equal(containerImage(await getStaging('deployment/web'), 'app'), acrImage('v2'));
    // Each cluster's push is a record of its own, followed to its end; the delivery's says where it went.
    const port = await adminPort(wh);
    const records = await waitFor(async () => {
      const doc = JSON.parse((await httpRequest(port, '/deliveries.json')).body);
      const parts = doc.deliveries.filter((d: any) => /\/(staging|prod)$/.test(d.request_id));
      return parts.length === 2 && parts.every((d: any) => d.rollout?.state === 'complete') ? doc.deliveries : undefined;
    }, { timeoutMs: 90_000, what: 'the records of both clusters, their rollouts complete' });
    const byRequest = (suffix: string) => records.find((d: any) => d.request_id.endsWith(suffix));
    assert.equal(byRequest('/staging').cluster, 'staging');
    assert.equal(byRequest('/prod').cluster, 'prod');
    const whole = records.find((d: any) => !d.request_id.includes('/'));
    assert.equal(whole.decision, 'fanned out');
    assert.match(whole.detail, /to 2 clusters: .*\/staging, .*\/prod/);
    for (const get of [getProd, getStaging]) {
      const events = (await get('events')).items.filter((e: any) => e.involvedObject.name === 'web');
      assert.ok(events.some((e: any) => e.reason === 'ImageUpdated'), 'the change is an Event in each cluster');
      assert.ok(events.some((e: any) => e.reason === 'RolloutComplete'), 'and so is the end of its rollout');
    }
    const metrics = (await httpRequest(port, '/metrics')).body;
    assert.match(metrics, /webhook_upgrades_total\{hook="deploy",cluster="staging",decision="applied"\} 1/);
    assert.match(metrics, /webhook_upgrades_total\{hook="deploy",cluster="prod",decision="applied"\} 1/);
  });

  test('one cluster away: answered 202 for it (kept) while the other is applied', async () => {
    const away = `https://127.0.0.1:${await freePort()}`;
    const wh = await start([prodConfig(), stagingConfig(away)], { CLUSTERS: 'staging prod' }, ['-apply-deadline', '5m']);
    const stagingBefore = containerImage(await getStaging('deployment/web'), 'app');
    const res = await push(wh, 'v3');
    assert.equal(res.status, 202, res.body);
    const [staging, prod] = res.body.split(/\n(?=cluster:)/);
    assert.match(staging, /^cluster: +staging$/m);
    assert.match(staging, /^action: +waiting for the API server \(.+ECONNREFUSED.+\): kept, and applied when it answers/m);
    assert.match(prod, /^cluster: +prod$/m);
    assert.match(prod, /^action: +image updated$/m);
    assert.equal(containerImage(await getProd('deployment/web'), 'app'), acrImage('v3'));
    await waitForOutput(wh, new RegExp(`deployment/web in ${ns} \\(cluster staging\\): the API server does not answer; push kept until`));
    assert.equal(containerImage(await getStaging('deployment/web'), 'app'), stagingBefore, 'nothing reached the cluster that is away');
    // Each cluster's record goes its own way: prod's applied and followed, staging's kept.
    const port = await adminPort(wh);
    const records = await waitFor(async () => {
      const doc = JSON.parse((await httpRequest(port, '/deliveries.json')).body);
      const prodRecord = doc.deliveries.find((d: any) => d.request_id.endsWith('/prod'));
      return prodRecord?.rollout?.state === 'complete' ? doc.deliveries : undefined;
    }, { timeoutMs: 90_000, what: 'the prod record, its rollout complete' });
    const stagingRecord = records.find((d: any) => d.request_id.endsWith('/staging'));
    assert.equal(stagingRecord.cluster, 'staging');
    assert.notEqual(stagingRecord.decision, 'applied');
    assert.equal(stagingRecord.finished_at, null, 'kept until its API server answers');
  });

  test('a cluster whose plugin fails, or a context that is not there: the push fails saying so, nothing changed', async () => {
    const plugin = path.join(dir, 'failing-plugin.sh');
    fs.writeFileSync(plugin, '#!/bin/sh\necho "credentials expired: run login" >&2\nexit 1\n', { mode: 0o700 });
    const broken = path.join(dir, 'broken.yaml');
    const server = JSON.parse(fs.readFileSync(second!.kubeconfigPath, 'utf8')).clusters[0].cluster;
    fs.writeFileSync(broken, [
      'current-context: broken',
      'contexts: [{name: broken, context: {cluster: b, user: b}}]',
      `clusters: [{name: b, cluster: {server: "${server.server}", certificate-authority-data: "${server['certificate-authority-data']}"}}]`,
      'users: [{name: b, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: ./failing-plugin.sh, interactiveMode: Never}}}]',
    ].join('\n'));
    const before = containerImage(await getStaging('deployment/web'), 'app');
    for (const [cluster, expected] of [
      ['broken', /^result: +failed: cannot get deployments\.apps "web" in namespace ".+": exec plugin ".*failing-plugin\.sh" \(.*context "broken".*\) exited 1: credentials expired: run login$/m],
      ['nowhere', /^result: +failed: KUBECONFIG .*: contexts: no entry named "nowhere" \(the context asked for; contexts: "prod", "broken"\)$/m],
    ] as const) {
      const wh = await start([prodConfig(), broken], { CLUSTER: cluster });
      const res = await push(wh, 'v9');
      assert.equal(res.status, 500, res.body);
      assert.match(res.body, new RegExp(`^cluster: +${cluster}$`, 'm'));
      assert.match(res.body, expected);
    }
    assert.equal(containerImage(await getStaging('deployment/web'), 'app'), before);
    assert.notEqual(containerImage(await getProd('deployment/web'), 'app'), acrImage('v9'));
  });

  test('-validate names each hook\'s clusters; -check-clusters asks each whether it answers and allows get and patch', async () => {
    await kubectlStaging(['-n', ns, 'create', 'serviceaccount', 'nobody']);
    const nobody = (await kubectlStaging(['-n', ns, 'create', 'token', 'nobody', '--duration=10m'])).trim();
    const away = `https://127.0.0.1:${await freePort()}`;
    const kubeconfigs = [
      prodConfig(),
      renamedKubeconfig(second!, 'staging', path.join(dir, 'staging-nobody.json'), undefined, nobody),
      renamedKubeconfig(second!, 'away', path.join(dir, 'away.json'), away),
    ];
    const hooks = path.join(dir, 'hooks.json');
    fs.writeFileSync(hooks, JSON.stringify([
      upgradeHook('fixed', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', CLUSTERS: 'prod staging away' }),
      upgradeHook('open', TOKEN, { CLUSTER: 'prod' }),
    ]));
    const described = runToExit(['-validate', '-hooks', hooks], kubeconfigs);
    assert.equal(described.code, 0, described.stderr);
    assert.match(described.stdout, /^  upgrades: +clusters: prod, staging, away \(CLUSTERS: each push upgrades each\)$/m);
    assert.match(described.stdout, /^  upgrades: +cluster: prod \(a kubeconfig context\)$/m);
    const checked = runToExit(['-validate', '-check-clusters', '-hooks', hooks], kubeconfigs);
    console.log(`# webhook -validate -check-clusters (exit ${checked.code}), its last lines:\n${checked.stdout.slice(checked.stdout.indexOf('\nclusters:') + 1)}`);
    assert.equal(checked.code, 1, 'a cluster that does not answer or allow fails the check');
    const what = `get and patch on deployments\\.apps "web" in namespace "${ns}"`;
    assert.match(checked.stdout, new RegExp(`^  hook "fixed", cluster prod: reachable \\(https://127\\.0\\.0\\.1:\\d+\\); ${what}: allowed$`, 'm'));
    assert.match(checked.stdout, new RegExp(`^  hook "fixed", cluster staging: reachable \\(.+\\); ${what}: get and patch not allowed$`, 'm'));
    assert.match(checked.stdout, /^  hook "fixed", cluster away: unreachable: .*ECONNREFUSED/m);
    assert.match(checked.stdout, /^  hook "open", cluster prod: reachable \(.+\); the workload comes from each request: permissions not checked$/m);
    assert.doesNotMatch(checked.stdout + checked.stderr, new RegExp(nobody));

    const rbac = runToExit(['-print-rbac', '-hooks', hooks], kubeconfigs);
    assert.equal(rbac.code, 0, rbac.stderr);
    const sections = rbac.stdout.split(/^---\n(?=# ==== cluster)/m);
    assert.deepEqual(sections.map((t) => /^# ==== cluster (\S+): apply this section there with `kubectl --context \1 apply -f -`$/m.exec(t)?.[1]),
      ['prod', 'staging', 'away']);
    for (const t of sections) assert.ok(t.includes(`namespace: "${ns}"\n`), t);
  });

  /** Posts a form of the deliveries page (Deploy again) as the page itself would. */
  const postForm = (port: number, action: string, fields: Record<string, string>) => httpRequest(port, action, {
    method: 'POST', body: new URLSearchParams(fields).toString(),
    headers: { 'Content-Type': 'application/x-www-form-urlencoded', Origin: `http://127.0.0.1:${port}` },
  });
  const deliveries = async (port: number) => JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries as any[];

  test('"Deploy again" on one cluster\'s delivery of a CLUSTERS hook deploys there; once the hook no longer names that cluster it is refused', async () => {
    const wh = await start([prodConfig(), stagingConfig()], { CLUSTERS: 'staging prod' });
    const port = await adminPort(wh);
    assert.equal((await push(wh, 'v6')).status, 200);
    // Its rollout followed to the end first: a record whose follow a later push superseded is not deployed again.
    const v6 = await waitFor(async () => (await deliveries(port)).find((d) => d.cluster === 'staging' && d.image_after === acrImage('v6') && d.state === 'done'),
      { timeoutMs: 90_000, what: 'staging\'s record of v6' });
    assert.equal(v6.decision, 'applied');
    assert.equal((await push(wh, 'v7')).status, 200);
    const replayed = await postForm(port, '/deliveries/replay', { seq: String(v6.seq), name: 'Ops Li', action: 'replay' });
    assert.equal(replayed.status, 200, replayed.body);
    assert.match(replayed.body, /cluster: +staging\n/);
    assert.match(replayed.body, /note: +deployed again by Ops Li \(127\.0\.0\.1, admin token\)/);
    assert.equal(containerImage(await getStaging('deployment/web'), 'app'), acrImage('v6'), 'the cluster of the delivery is the one deployed');
    assert.equal(containerImage(await getProd('deployment/web'), 'app'), acrImage('v7'), 'the default cluster is left alone');
    const record = await waitFor(async () => (await deliveries(port)).find((d) => d.decision === 'applied' && d.image_after === acrImage('v6') && d.seq > v6.seq),
      { what: 'the replay\'s record' });
    assert.equal(record.cluster, 'staging');
    // The hook now names prod only: staging's delivery is not deployed again anywhere.
    fs.writeFileSync(wh.hooksPath, JSON.stringify([upgradeHook('deploy', TOKEN, { CLUSTERS: 'prod' })]));
    // Marked first: a reload this service logged before is not the one awaited.
    const mark = wh.output().length;
    wh.proc.kill('SIGHUP');
    await waitForOutput(wh, /reloaded 1 hook\(s\)/, 5_000, mark);
    const stagingBefore = containerImage(await getStaging('deployment/web'), 'app');
    await kubectlProd(['-n', ns, 'set', 'image', 'deployment/web', `app=${acrImage('v1')}`]);
    const refused = await postForm(port, '/deliveries/replay', { seq: String(v6.seq), name: 'Ops Li', action: 'replay' });
    assert.equal(refused.status, 409, refused.body);
    assert.match(refused.body, /the hook &quot;deploy&quot; no longer names cluster &quot;staging&quot;: nothing was deployed/);
    assert.equal(containerImage(await getStaging('deployment/web'), 'app'), stagingBefore);
    assert.equal(containerImage(await getProd('deployment/web'), 'app'), acrImage('v1'));
  });

  test('a CLUSTERS hook\'s waiting pushes: one per cluster, listed, decided by link and expired in their own cluster', async () => {
    const key = 'clusters-approval-key-0d9c7e1b5a3f2e8d4c6b0a9f7e5d3c1b';
    const keyFile = path.join(dir, 'approval-key');
    fs.writeFileSync(keyFile, `${key}\n`);
    await Promise.all([kubectlProd, kubectlStaging].map((k) => k(['-n', ns, 'apply', '-f', '-'],
      JSON.stringify(deployment('gate', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })))));
    const hooks = [{ ...upgradeHook('gated', TOKEN), 'pass-environment-to-command': fixedSettings({
      CLUSTERS: 'staging prod', APP_NS: ns, APP_WORKLOAD: 'deployment/gate', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', REQUIRE_APPROVAL: 'true' }) }];
    const startGated = async () => {
      const wh = await startWebhook({ hooks, metrics: true, env: { KUBECONFIG: [prodConfig(), stagingConfig()].join(path.delimiter) },
        args: ['-rollout-follow', '0s', '-public-url', 'https://webhook.example.test', '-approval-key-file', keyFile] });
      started.push(wh);
      return wh;
    };
    const wh = await startGated();
    const port = await adminPort(wh);
    const res = await wh.request(`/hooks/gated?token=${TOKEN}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload('v8') });
    assert.equal(res.status, 202, res.body);
    const pending = async (get: typeof getProd) => JSON.parse((await get('deployment/gate')).metadata.annotations?.['webhook/pending'] ?? '{}');
    const [inProd, inStaging] = [(await pending(getProd)).app, (await pending(getStaging)).app];
    assert.ok(inProd && inStaging && inProd.id !== inStaging.id, 'an entry waits in each cluster');
    // Both are known here, each under its cluster: neither overwrites the other.
    const page = (await httpRequest(port, '/deliveries')).body;
    const waiting = page.slice(page.indexOf('<table class="waiting">'), page.indexOf('</table>', page.indexOf('<table class="waiting">')));
    assert.equal(waiting.match(/<tr class="running"/g)?.length, 2, waiting);
    assert.match(waiting, /cluster staging/);
    assert.match(waiting, /cluster prod/);
    const records = await waitFor(async () => {
      const parts = (await deliveries(port)).filter((d) => d.decision === 'waiting' && d.approveUrl);
      return parts.length === 2 ? parts : undefined;
    }, { what: 'the two waiting records' });
    const staging = records.find((d) => d.cluster === 'staging');
    const approved = await wh.request(new URL(staging.approveUrl).pathname, {
      method: 'POST', body: 'name=Ops+Wu', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(approved.status, 200, approved.body);
    assert.match(approved.body, /cluster: +staging\n/);
    assert.equal(containerImage(await getStaging('deployment/gate'), 'app'), acrImage('v8'));
    assert.equal(containerImage(await getProd('deployment/gate'), 'app'), acrImage('v1'), 'prod\'s push still waits');
    assert.deepEqual(await pending(getStaging), {});
    assert.equal((await pending(getProd)).app.id, inProd.id);
    // An expired entry another replica left in staging: a replica that starts reads staging and expires it.
    await wh.stop();
    const hourAgo = new Date(Date.now() - 3_600_000).toISOString();
    const expired = { id: 'gone-1', hook: 'gated', request: 'gone-1-request', image: acrImage('v9'), push: 'sha256:x|t', pushedAt: hourAgo,
      timeFrom: 'payload' as const, receivedAt: hourAgo, waitsFor: 'approval' as const, until: new Date(Date.now() - 1000).toISOString(),
      decides: 'whoever opens its links' };
    // Sealed where it sits, as a replica writes one (an entry that is not is dropped, never told as expired).
    const sealed = sealPendingEntry(Buffer.from(key), { cluster: 'staging', namespace: ns, kind: 'deployment', name: 'gate', container: 'app' }, expired);
    await kubectlStaging(['-n', ns, 'annotate', '--overwrite', 'deployment/gate', `webhook/pending=${JSON.stringify({ app: sealed })}`]);
    const later = await startGated();
    const told = await waitFor(async () => (await deliveries(await adminPort(later))).find((d) => d.decision === 'expired'),
      { timeoutMs: 60_000, what: 'staging\'s expired push told' });
    assert.equal(told.cluster, 'staging');
    assert.deepEqual(await pending(getStaging), {});
    assert.equal(containerImage(await getStaging('deployment/gate'), 'app'), acrImage('v8'));
  });

  describe('a server URL with a path (Rancher\'s cluster proxy)', () => {
    let proxy: https.Server;
    const seen: string[] = [];
    before(() => {
      execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
        '-subj', '/CN=rancher.test', '-addext', 'subjectAltName=IP:127.0.0.1',
        '-keyout', path.join(dir, 'proxy.key'), '-out', path.join(dir, 'proxy.crt')], { stdio: 'ignore' });
      const admin = JSON.parse(fs.readFileSync(shared!.kubeconfigPath, 'utf8'));
      const upstream = new URL(admin.clusters[0].cluster.server);
      const tlsTo = {
        ca: Buffer.from(admin.clusters[0].cluster['certificate-authority-data'], 'base64'),
        cert: Buffer.from(admin.users[0].user['client-certificate-data'], 'base64'),
        key: Buffer.from(admin.users[0].user['client-key-data'], 'base64'),
      };
      proxy = https.createServer({ key: fs.readFileSync(path.join(dir, 'proxy.key')), cert: fs.readFileSync(path.join(dir, 'proxy.crt')) }, (req, res) => {
        seen.push(req.url ?? '');
        // Only the cluster's prefix, only with the token: anything else is not this cluster.
        if (!req.url?.startsWith(`${PREFIX}/`) || req.headers.authorization !== `Bearer ${RANCHER_TOKEN}`) {
          res.writeHead(req.url?.startsWith(`${PREFIX}/`) ? 401 : 404, { 'Content-Type': 'application/json' });
          return res.end(JSON.stringify({ kind: 'Status', status: 'Failure', message: 'not this proxy\'s', code: 404 }));
        }
        const headers = { ...req.headers, host: upstream.host };
        delete headers.authorization;
        const out = https.request({ host: upstream.hostname, port: upstream.port, path: req.url.slice(PREFIX.length), method: req.method, headers, ...tlsTo }, (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        });
        out.on('error', () => res.destroy());
        // The client gone (a watch given up, the service stopped), the request to the API server goes too: a watch
        // left open there holds this process until the API server ends it, minutes later.
        res.on('close', () => out.destroy());
        req.pipe(out);
      });
      return new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    });
    after(() => {
      const closed = new Promise<void>((resolve) => proxy.close(() => resolve()));
      proxy.closeAllConnections();
      return closed;
    });

    test('upgrades through it: every request keeps the path', async () => {
      const port = (proxy.address() as { port: number }).port;
      const file = path.join(dir, 'rancher.yaml');
      fs.writeFileSync(file, [
        'apiVersion: v1',
        'kind: Config',
        'clusters:',
        '- name: "downstream"',
        '  cluster:',
        `    server: "https://127.0.0.1:${port}${PREFIX}"`,
        `    certificate-authority-data: "${fs.readFileSync(path.join(dir, 'proxy.crt')).toString('base64')}"`,
        'users:',
        '- name: "downstream"',
        '  user:',
        `    token: "${RANCHER_TOKEN}"`,
        'contexts:',
        '- name: "downstream"',
        '  context:',
        '    user: "downstream"',
        '    cluster: "downstream"',
        'current-context: "downstream"',
      ].join('\n'), { mode: 0o600 });
      const wh = await start([file], { CLUSTER: 'downstream' });
      const res = await push(wh, 'v4');
      assert.equal(res.status, 200, res.body);
      assert.match(res.body, /^cluster: +downstream$/m);
      assert.match(res.body, /^action: +image updated$/m);
      assert.equal(containerImage(await getProd('deployment/web'), 'app'), acrImage('v4'));
      assert.ok(seen.length > 0 && seen.every((u) => u.startsWith(`${PREFIX}/`)), seen.join('\n'));
      assert.doesNotMatch(res.body + wh.output(), new RegExp(RANCHER_TOKEN.split(':')[1]));
    });
  });
});
