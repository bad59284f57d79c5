/*
 * Promotion: CLUSTERS stages (`staging > prod`). A push goes to the first stage only; once its rollout there is
 * complete and has stayed healthy for PROMOTE_AFTER (and PROMOTE_CHECK answers 2xx), the digest that ran there (not
 * its tag, which the registry may have moved meanwhile) is pushed to the next stage through that stage's own
 * decision path. Two real test clusters (the shared one and a second beside it, as in clusters.test.ts) are the
 * stages; a real registry (test/oci-registry.ts) resolves the tag to the digest staging runs (VERIFY_IMAGE) and has
 * the tag moved during the soak. A crash-looping image rolls back in staging and goes no further; a check that
 * answers 500 stops the chain; a prod that requires approval waits and an approval through the link promotes; a
 * newer push during the soak supersedes the older chain. Bad settings are load errors naming file, hook and field.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as https from 'node:https';
import * as net from 'node:net';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  adminPort, defaultBinary, httpRequest, makeTempDir, startWebhook, waitFor, waitForOutput, type Webhook,
} from './harness.ts';
import {
  acrPayload, clusterOrSkip, containerImage, crashLoopInForce, deployment, freshNamespaceName, kubectlFor, namespacedGetter, removeNamespace,
  renamedKubeconfig, reportPulled, type Cluster, type Kubectl,
} from './cluster/kube.ts';
import { ensureCluster } from './cluster/cluster.ts';
import { fixedSettings, upgradeHook } from './upgrade-hooks.ts';
import { ociRegistryOrSkip, pushBlob, pushManifest, type OciRegistry } from './oci-registry.ts';
import { makeCertificate } from './registry.ts';
import { browserOrSkip, type Browser } from './browser.ts';
import { readMail, serviceMailEnv, startMta } from './mta.ts';
import { parseStages } from '../webhook.ts';

const TOKEN = 'promotion-token-3b9e1c';
const SECOND_CLUSTER = 'webhook-test-b';
const REPO = 'shop/web-api';
/** The soak the cluster tests ask for: long enough to move the tag and push again within it. */
const SOAK = '8s';
/** A promotion's whole way (rollout in staging, soak, rollout in prod) on a loaded machine. */
const CHAIN_TIMEOUT_MS = 120_000;

describe('CLUSTERS stages, as read', () => {
  test('stages, clusters promoted to together, a namespace per stage', () => {
    assert.deepEqual(parseStages('staging > prod'), [
      [{ cluster: 'staging', namespace: undefined }], [{ cluster: 'prod', namespace: undefined }],
    ]);
    assert.deepEqual(parseStages(' staging>prod-eu  prod-us ').map((s) => s.map((t) => t.cluster)), [['staging'], ['prod-eu', 'prod-us']]);
    assert.deepEqual(parseStages('staging/shop-staging > prod/shop'), [
      [{ cluster: 'staging', namespace: 'shop-staging' }], [{ cluster: 'prod', namespace: 'shop' }],
    ]);
    // Without ">", one stage: today's fan-out, duplicates kept once.
    assert.deepEqual(parseStages('a b a'), [[{ cluster: 'a', namespace: undefined }, { cluster: 'b', namespace: undefined }]]);
    assert.deepEqual(parseStages(undefined), []);
  });

  test('what is wrong is named: an empty stage, a bad namespace, a cluster twice in a stage, too many stages', () => {
    assert.throws(() => parseStages('a > > b'), { message: 'CLUSTERS "a > > b": stage 2 names no cluster (stages are separated by one ">")' });
    assert.throws(() => parseStages('> prod'), /stage 1 names no cluster/);
    assert.throws(() => parseStages('staging/Shop > prod'), { message: 'CLUSTERS stage 1: "staging/Shop" names no valid namespace after its "/"' });
    assert.throws(() => parseStages('staging > prod prod'), { message: 'CLUSTERS stage 2 names cluster "prod" twice' });
    assert.throws(() => parseStages('a>b>c>d>e>f>g>h>i'), /has 9 stages, more than 8/);
  });
});

/** The executable run to its exit. */
function runToExit(args: string[], env: Record<string, string> = {}) {
  const r = spawnSync(defaultBinary(), args, { env: { PATH: process.env.PATH, ...env }, encoding: 'utf8' });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('bad stage settings: a load error naming file, hook and field; -validate prints the chain', () => {
  const dir = makeTempDir('promotion-validate-');
  after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const validate = (settings: Record<string, string>) => {
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([upgradeHook('chain', TOKEN, settings)], null, 1));
    return { file, ...runToExit(['-validate', '-hooks', file]) };
  };

  for (const [settings, message] of [
    [{ CLUSTERS: 'a > > b' }, 'CLUSTERS "a > > b": stage 2 names no cluster \\(stages are separated by one ">"\\)'],
    [{ CLUSTERS: 'a > b', PROMOTE_AFTER: '-1s' }, 'PROMOTE_AFTER "-1s" is not a duration of 0 or more \\(e\\.g\\. 0s, 10m, 1h\\)'],
    [{ CLUSTERS: 'a > b', PROMOTE_CHECK: 'file:///etc/passwd' }, 'PROMOTE_CHECK "file:///etc/passwd" is not an https URL \\(file:\\)'],
    [{ CLUSTERS: 'a > b', PROMOTE_CHECK: 'http://health.example.com/ok' }, 'PROMOTE_CHECK "http://health\\.example\\.com/ok" is not an https URL \\(http:\\)'],
    [{ CLUSTERS: 'a > b', PROMOTE_CHECK: 'https://ops:hunter2@health.example.com/' }, 'PROMOTE_CHECK carries a user or password'],
  ] as const) {
    test(`${Object.entries(settings).map(([k, v]) => `${k}=${v}`).join(' ')}: refused at load`, () => {
      const r = validate(settings);
      assert.equal(r.code, 1, r.stdout);
      const field = `pass-environment-to-command\\[\\d+\\]\\.name`;
      assert.match(r.stderr, new RegExp(`^error: ${r.file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:\\d+: hook "chain": ${field}: ${message}`, 'm'));
      assert.doesNotMatch(r.stderr + r.stdout, /hunter2/);
    });
  }

  test('-validate -check-clusters checks every stage: a stage naming an unknown context fails the check, naming it', () => {
    const kubeconfig = path.join(dir, 'kubeconfig.json');
    fs.writeFileSync(kubeconfig, JSON.stringify({ apiVersion: 'v1', kind: 'Config', 'current-context': 'staging',
      contexts: [{ name: 'staging', context: { cluster: 'staging', user: 'staging' } }],
      clusters: [{ name: 'staging', cluster: { server: 'https://127.0.0.1:1' } }],
      users: [{ name: 'staging', user: { token: 'not-a-real-token-4417' } }] }), { mode: 0o600 });
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([upgradeHook('chain', TOKEN, { APP_NS: 'shop', APP_WORKLOAD: 'deployment/web', CLUSTERS: 'staging > nowhere' })]));
    const r = runToExit(['-validate', '-check-clusters', '-hooks', file], { KUBECONFIG: kubeconfig });
    assert.equal(r.code, 1, r.stdout + r.stderr);
    assert.match(r.stdout, /^ {2}hook "chain", cluster staging: unreachable: /m);
    assert.match(r.stdout, /^ {2}hook "chain", cluster nowhere: no credentials: .*contexts: no entry named "nowhere"/m);
    assert.doesNotMatch(r.stdout + r.stderr, /not-a-real-token-4417/);
  });

  test('-print-rbac: each stage\'s Role is in the namespace that stage names, in its own cluster\'s section', () => {
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify([upgradeHook('chain', TOKEN, { APP_NS: 'shop', APP_WORKLOAD: 'deployment/web', CLUSTERS: 'staging/shop-staging > prod' })]));
    const r = runToExit(['-print-rbac', '-hooks', file]);
    assert.equal(r.code, 0, r.stderr);
    const sections = r.stdout.split(/^---\n(?=# ==== cluster)/m);
    assert.deepEqual(sections.map((t) => /^# ==== cluster (\S+):/m.exec(t)?.[1]), ['staging', 'prod']);
    assert.match(sections[0], /^ {2}namespace: "shop-staging"$/m);
    assert.doesNotMatch(sections[0], /^ {2}namespace: "shop"$/m);
    assert.match(sections[1], /^ {2}namespace: "shop"$/m);
  });

  test('-validate prints the chain, what a promotion waits for, and how the next stage decides', () => {
    const r = validate({ CLUSTERS: 'staging/shop-staging > prod-eu prod-us', PROMOTE_AFTER: '10m', PROMOTE_CHECK: 'https://health.example.com/ok' });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^ {2}upgrades: +stages: staging\/shop-staging > prod-eu prod-us \(CLUSTERS: a push goes to staging\/shop-staging; its digest to the next stage once healthy for 10m0s and PROMOTE_CHECK https:\/\/health\.example\.com\/ok answers 2xx, through that stage's policy, approval and window\)$/m);
    // A chain with a watch: it is watched in its first stage only (the gate), which -validate says.
    const watched = validate({ APP_NS: 'shop', APP_WORKLOAD: 'deployment/web', CLUSTERS: 'staging > prod', POLL_INTERVAL: '1m' });
    assert.equal(watched.code, 0, watched.stderr);
    assert.match(watched.stdout, /registry watch: deployment\/web in shop every 1m0s \(POLL_INTERVAL\); .*; a promotion chain: watched in its first stage \(staging\) only, later stages are reached by its promotion$/m);
  });
});

const shared = await clusterOrSkip();
const second: Cluster | undefined = shared ? await ensureCluster(SECOND_CLUSTER) : undefined;
const registry: OciRegistry | undefined = shared && second ? await ociRegistryOrSkip() : undefined;
const browser: Browser | undefined = registry ? await browserOrSkip() : undefined;
// At the file's end, whichever of its tests ran: the registry and the browser are processes of their own.
after(async () => {
  await registry?.stop();
  await browser?.close();
});

/** A screenshot kept in test-artifacts/ (and, with UPDATE_DOCS_SCREENSHOTS=1, in docs/ for the page's docs). */
function keepScreenshot(name: string, png: Buffer): void {
  const root = path.join(import.meta.dirname, '..');
  fs.mkdirSync(path.join(root, 'test-artifacts'), { recursive: true });
  fs.writeFileSync(path.join(root, 'test-artifacts', name), png);
  if (process.env.UPDATE_DOCS_SCREENSHOTS === '1') fs.writeFileSync(path.join(root, 'docs', name), png);
}

/** An https server answering every GET with `status`, trusted by the executable through NODE_EXTRA_CA_CERTS. */
async function checkServer(dir: string, status: number) {
  const certs = makeCertificate(dir);
  const asked: string[] = [];
  const server = https.createServer({ cert: fs.readFileSync(certs.certFile), key: fs.readFileSync(certs.keyFile) }, (req, res) => {
    asked.push(`${req.method} ${req.url}`);
    res.writeHead(status).end(status === 200 ? 'ok' : 'not healthy');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  return { url: `https://127.0.0.1:${port}/healthz`, caFile: certs.caFile, asked, close: () => new Promise((r) => server.close(r)) };
}

/**
 * A TCP proxy in front of an API server that, once `hold()` is called, lets no more bytes through to it (the
 * replica's next request there never arrives; `held` resolves when one is tried) until `release()`: the window
 * between a soak's end and the next stage's decision, made observable.
 */
async function holdingProxy(server: string) {
  const target = new URL(server);
  const sockets = new Set<net.Socket>();
  let holding = false;
  let heldNow: () => void = () => {};
  const held = new Promise<void>((resolve) => (heldNow = resolve));
  const proxy = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => { sockets.delete(s); client.destroy(); upstream.destroy(); });
    }
    client.on('data', (chunk) => (holding ? heldNow() : upstream.write(chunk)));
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  const port = (proxy.address() as net.AddressInfo).port;
  return {
    server: `https://127.0.0.1:${port}`, held,
    hold: () => { holding = true; },
    release: () => { holding = false; },
    close: () => new Promise((r) => { for (const s of sockets) s.destroy(); proxy.close(r); }),
  };
}

describe('staging > prod on two clusters', { skip: shared && second && registry ? false : 'no clusters or registry' }, () => {
  const ns = freshNamespaceName('promotion');
  const kubectlProd = kubectlFor(shared!);
  const kubectlStaging = kubectlFor(second!);
  const getProd = namespacedGetter(kubectlProd, ns);
  const getStaging = namespacedGetter(kubectlStaging, ns);
  const dir = makeTempDir('promotion-');
  const started: Webhook[] = [];
  const closers: (() => Promise<unknown>)[] = [];
  const image = (tagOrDigest: string) => `${registry!.host}/${REPO}${tagOrDigest.startsWith('sha256:') ? '@' : ':'}${tagOrDigest}`;
  const kubeconfigs = () => [renamedKubeconfig(shared!, 'prod', path.join(dir, 'prod.json')),
    renamedKubeconfig(second!, 'staging', path.join(dir, 'staging.json'))].join(path.delimiter);
  const caFile = path.join(dir, 'registry-ca.pem');
  const sealKey = path.join(dir, 'seal-key');

  /** An image of its own content at `tag` on the registry: its digest. */
  let built = 0;
  const publish = async (tag: string) => {
    const config = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', build: ++built, tag }));
    const digest = await pushBlob(registry!, REPO, config);
    return pushManifest(registry!, REPO, {
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest, size: config.length }, layers: [],
    }, tag);
  };
  /** A Deployment of its own in both clusters, rolled out on :v1. */
  const workloadIn = async (name: string, annotations: { prod?: Record<string, string> } = {}) => {
    await Promise.all([kubectlProd, kubectlStaging].map(async (k) => {
      const d: any = deployment(name, [{ name: 'app', image: image('v1') }], { replicas: 1 });
      if (k === kubectlProd && annotations.prod) d.metadata.annotations = { ...d.metadata.annotations, ...annotations.prod };
      await k(['-n', ns, 'apply', '-f', '-'], JSON.stringify(d));
      await k(['-n', ns, 'rollout', 'status', `deployment/${name}`, '--timeout=90s']);
    }));
  };
  const start = async (settings: Record<string, string>, env: Record<string, string> = {}, args: string[] = []) => {
    // A hook that fixes its workload (APP_WORKLOAD in settings) is one whose soaks a replica that starts picks up.
    const workload = settings.APP_WORKLOAD ? [] : [{ envname: 'APP_WORKLOAD', source: 'url', name: 'workload' }];
    const hooks = [{ ...upgradeHook('chain', TOKEN), 'pass-environment-to-command': [
      ...workload,
      ...fixedSettings({ APP_NS: ns, APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', REGISTRY_HOST: registry!.host,
        REGISTRY_CA: caFile, VERIFY_IMAGE: 'true', CLUSTERS: 'staging > prod', PROMOTE_AFTER: SOAK,
        ...settings }),
    ] }];
    // The soaks a replica records on workloads are sealed with the approval key: a replica that starts resumes only
    // those (and without a key, none).
    // The record ledger in the test's namespace of the default cluster, as a pod's own namespace holds it.
    const sealing = args.includes('-approval-key-file') ? [] : ['-public-url', 'https://webhook.example.test', '-approval-key-file', sealKey,
      '-record-store', `${ns}/webhook-records`];
    const wh = await startWebhook({ hooks, metrics: true, args: ['-rollout-follow', '60s', ...sealing, ...args],
      env: { KUBECONFIG: kubeconfigs(), ...env } });
    started.push(wh);
    return wh;
  };
  /** A push of `tag` as the registry announces it: with the digest it has for the tag. */
  const push = (wh: Webhook, workload: string, tag: string, digest: string) =>
    wh.request(`/hooks/chain?${new URLSearchParams({ token: TOKEN, workload: `deployment/${workload}` })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag, REPO, { digest }),
    });
  /** A line of the service's log; on a timeout, the error carries the end of its output. */
  const logLine = (wh: Webhook, line: RegExp, timeoutMs = CHAIN_TIMEOUT_MS) => waitForOutput(wh, line, timeoutMs)
    .catch((e: Error) => { throw new Error(`${e.message}\n--- the service's output, its end:\n${wh.output().slice(-6000)}`); });
  const imageIn = async (get: typeof getProd, workload: string) => containerImage(await get(`deployment/${workload}`), 'app');

  before(async () => {
    fs.writeFileSync(caFile, registry!.caPem);
    fs.writeFileSync(sealKey, 'promotion-approval-key-5e2d8c1f0b7a6e4d3c2b1a0f9e8d7c6b\n');
    await Promise.all([kubectlProd, kubectlStaging].map((k) => k(['create', 'namespace', ns])));
  });
  after(async () => {
    await Promise.all(started.map((w) => w.stop()));
    await Promise.all(closers.map((c) => c()));
    await Promise.all([removeNamespace(kubectlProd, ns), removeNamespace(kubectlStaging, ns)]);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('a push applies to staging only; after the soak prod runs the digest that ran in staging, though the tag moved', async () => {
    await workloadIn('web');
    const ran = await publish('v2');
    const wh = await start({ PROMOTE_CHECK: '' });
    const res = await push(wh, 'web', 'v2', ran);
    console.log(`# the answer (HTTP ${res.status}):\n${res.body}`);
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^cluster: +staging$/m);
    assert.doesNotMatch(res.body, /^cluster: +prod$/m, 'prod is not pushed to at once');
    assert.equal(await imageIn(getStaging, 'web'), `${image('v2')}@${ran}`);
    assert.equal(await imageIn(getProd, 'web'), image('v1'));
    // During the soak the tag moves on the registry (no notification): prod must still get what ran.
    await logLine(wh, /deployment\/web in .* \(cluster staging\): rollout complete; .* goes to prod once healthy for 8s/);
    const moved = await publish('v2');
    assert.notEqual(moved, ran);
    assert.equal(await imageIn(getProd, 'web'), image('v1'), 'nothing reaches prod during the soak');
    const line = await logLine(wh, /\/prod\] deployment\/web in .* \(cluster prod\): promoted to prod after \d+s healthy in staging: image updated/);
    console.log(`# the promotion's log lines:\n${wh.output().split('\n').filter((l) => /soak|promot|chain/.test(l)).join('\n')}`);
    assert.ok(line);
    assert.equal(await imageIn(getProd, 'web'), `${image('v2')}@${ran}`, 'prod runs the staging digest, not where the tag points now');
    const record = JSON.parse((await getStaging('deployment/web')).metadata.annotations?.['webhook/promotion'] ?? '{}');
    assert.deepEqual(record, {}, 'the soak record is taken off once promoted');
    const port = await adminPort(wh);
    const prodRecord = await waitFor(async () => {
      const doc = JSON.parse((await httpRequest(port, '/deliveries.json')).body);
      return doc.deliveries.find((d: any) => d.cluster === 'prod' && d.rollout?.state === 'complete');
    }, { timeoutMs: 90_000, what: 'prod\'s record, its rollout complete' });
    assert.equal(prodRecord.decision, 'applied');
    assert.match(JSON.stringify(prodRecord), /promoted to prod after \d+s healthy in staging/, 'its record (and so its mail and chat) says so');
    assert.match(prodRecord.request_id, /\/prod$/);
    const metrics = (await wh.metrics()).body;
    assert.match(metrics, /webhook_promotions_total\{hook="chain",from="staging",to="prod",outcome="promoted"\} 1/);
  });

  test('a crash-looping image rolls back in staging and never reaches prod', async () => {
    await workloadIn('crashy');
    // Pods of `:broken…` images crash-loop in staging (as in rollback.test.ts), as a broken build would.
    const policy = `webhook-test-crashloop-${ns}`;
    closers.push(() => kubectlStaging(['delete', 'mutatingadmissionpolicybinding,mutatingadmissionpolicy', policy, '--ignore-not-found']));
    await crashLoopInForce(kubectlStaging, ns, image('broken-probe'));
    const broken = await publish('broken1');
    // A pod stuck 5 s fails the stage's rollout (30 s by default): only pods of :broken images are ever stuck here.
    const wh = await start({ ROLLBACK_ON_FAILURE: 'true', ROLLOUT_STUCK_TIMEOUT: '5s' });
    const res = await push(wh, 'crashy', 'broken1', broken);
    assert.match(res.body, /^cluster: +staging$/m);
    await logLine(wh, /deployment\/crashy in .* \(cluster staging\): chain stopped at staging: its rollout failed and was rolled back.*; not promoted to prod/);
    assert.notEqual(await imageIn(getStaging, 'crashy'), `${image('broken1')}@${broken}`, 'rolled back in staging');
    assert.equal(await imageIn(getProd, 'crashy'), image('v1'), 'never reached prod');
    assert.match((await wh.metrics()).body, /webhook_promotions_total\{hook="chain",from="staging",to="prod",outcome="stopped"\} 1/);
    // The page says where the chain stopped, and why.
    const page = (await httpRequest(await adminPort(wh), '/deliveries')).body;
    assert.match(page, /<span class="tag">stopped<\/span><br>staging → prod: its rollout failed and was rolled back/);
  });

  test('a PROMOTE_CHECK answering 500 stops the chain at staging, and the stop is mailed saying why', async () => {
    await workloadIn('checked');
    const check = await checkServer(makeTempDir('promotion-check-'), 500);
    closers.push(check.close);
    const mta = await startMta();
    closers.push(() => mta.stop());
    const checked = await publish('v4');
    const wh = await start({ PROMOTE_AFTER: '0s', PROMOTE_CHECK: check.url, MAIL_TO: 'release@example.com' },
      { NODE_EXTRA_CA_CERTS: check.caFile, ...serviceMailEnv(mta) });
    await push(wh, 'checked', 'v4', checked);
    const line = await logLine(wh, /deployment\/checked in .* \(cluster staging\): chain stopped at staging: PROMOTE_CHECK https:\/\/127\.0\.0\.1:\d+\/healthz answered 500 \(3 tries\); not promoted to prod/);
    assert.ok(line);
    assert.equal(check.asked.length, 3, 'asked a few times, with backoff');
    assert.equal(await imageIn(getProd, 'checked'), image('v1'));
    const stopped = /promotion to prod stopped: PROMOTE_CHECK https:\/\/127\.0\.0\.1:\d+\/healthz answered 500 \(3 tries\)/;
    const stopMails = async () => (await mta.messages()).map(readMail).filter((m) => stopped.test(m.body));
    const [mail] = await waitFor(async () => ((await stopMails()).length > 0 ? stopMails() : undefined),
      { timeoutMs: 60_000, what: 'the mail of the chain\'s stop' });
    console.log(`# the stop's mail: ${mail.subject}\n${mail.body.slice(0, 1200)}`);
    assert.match(mail.subject, /fail/i);
    assert.match(mail.body, /cluster: +staging/);
    // The staging push's own result (applied, rollout complete) is mailed too, and goes on being one mail.
    await waitFor(async () => (await mta.messages()).length >= 2, { timeoutMs: 60_000, what: 'the staging push\'s mail' });
    assert.equal((await stopMails()).length, 1, 'one mail of the stop');
    const doc = JSON.parse((await httpRequest(await adminPort(wh), '/deliveries.json')).body);
    assert.ok(doc.deliveries.some((d: any) => /\/prod$/.test(d.request_id) && d.decision === 'failed' && stopped.test(JSON.stringify(d))),
      'the stop is a record of its own on the page');
  });

  test('a prod that requires approval waits for it; an approval through the link promotes', async () => {
    await workloadIn('gated', { prod: { 'webhook/approval': 'required' } });
    const ran = await publish('v5');
    const keyFile = path.join(dir, 'approval-key');
    fs.writeFileSync(keyFile, 'promotion-approval-key-5e2d8c1f0b7a6e4d3c2b1a0f9e8d7c6b\n');
    const wh = await start({ PROMOTE_AFTER: '0s' }, {}, ['-public-url', 'https://webhook.example.test', '-approval-key-file', keyFile]);
    await push(wh, 'gated', 'v5', ran);
    await logLine(wh, /\/prod\] deployment\/gated in .* \(cluster prod\): promotion to prod after \d+s healthy in staging: waiting for approval until/);
    assert.equal(await imageIn(getProd, 'gated'), image('v1'), 'nothing applied before the approval');
    const port = await adminPort(wh);
    const waiting = await waitFor(async () => JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries
      .find((d: any) => d.cluster === 'prod' && d.decision === 'waiting' && d.approveUrl), { what: 'prod\'s waiting record' });
    assert.match(JSON.stringify(waiting), /waiting to be promoted to prod after \d+s healthy in staging/);
    const approved = await wh.request(new URL(waiting.approveUrl).pathname, {
      method: 'POST', body: 'name=Ops+Wu', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(approved.status, 200, approved.body);
    assert.equal(await imageIn(getProd, 'gated'), `${image('v5')}@${ran}`, 'the approved promotion deploys the staging digest');
    // Counted as waiting when it waited, and as promoted once approved and applied: on /metrics and the page.
    await waitFor(async () => /webhook_promotions_total\{hook="chain",from="staging",to="prod",outcome="promoted"\} 1\n/.test((await wh.metrics()).body),
      { timeoutMs: CHAIN_TIMEOUT_MS, what: 'the approved promotion counted as promoted' });
    assert.match((await wh.metrics()).body, /webhook_promotions_total\{hook="chain",from="staging",to="prod",outcome="waiting"\} 1\n/);
    const page = (await httpRequest(port, '/deliveries')).body;
    assert.match(page, /<span class="tag">promoted<\/span><br>staging → prod: [^<]*(\/|&#x2F;|&#47;)prod waited; approved by Ops Wu/);
  });

  test('a newer push during the soak supersedes the older chain: prod gets the newer one only', async () => {
    await workloadIn('busy');
    const older = await publish('v6');
    const newer = await publish('v7');
    const wh = await start({});
    await push(wh, 'busy', 'v6', older);
    await logLine(wh, /deployment\/busy in .* \(cluster staging\): rollout complete; .*:v6@.* goes to prod/);
    await push(wh, 'busy', 'v7', newer);
    await logLine(wh, /deployment\/busy in .* \(cluster staging\): chain superseded by request/);
    await logLine(wh, /deployment\/busy in .* \(cluster prod\): promoted to prod after \d+s healthy in staging: image updated/);
    assert.equal(await imageIn(getProd, 'busy'), `${image('v7')}@${newer}`);
    assert.doesNotMatch(wh.output(), /deployment\/busy in .* \(cluster prod\): promoted .*:v6@/, 'the older chain never reached prod');
  });

  test('"Promote now" on the deliveries page skips the soak, behind the admin token and the page\'s Origin check', async () => {
    await workloadIn('hurried');
    const ran = await publish('v8');
    const adminToken = 'promotion-admin-token-61f0c2';
    const wh = await start({ PROMOTE_AFTER: '1h' }, {}, ['-admin-token', adminToken]);
    await push(wh, 'hurried', 'v8', ran);
    await logLine(wh, /deployment\/hurried in .* \(cluster staging\): rollout complete; .* goes to prod once healthy for 1h0m0s/);
    const port = await adminPort(wh);
    const auth = { Authorization: `Bearer ${adminToken}` };
    const page = (await httpRequest(port, '/deliveries', { headers: auth })).body;
    assert.match(page, /<h2>Promotions<\/h2>/);
    assert.match(page, /<span class="tag">soaking<\/span><br>in staging until [^<]+, then prod/);
    const key = /<form method="post" action="deliveries\/promote"><input type="hidden" name="key" value="([^"]+)">/.exec(page)?.[1];
    assert.ok(key, page);
    const form = (headers: Record<string, string>) => httpRequest(port, '/deliveries/promote', {
      method: 'POST', body: new URLSearchParams({ key: key.replaceAll('&#x2F;', '/').replaceAll('&#47;', '/'), name: 'Ops Li', action: 'promote' }).toString(),
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', ...headers },
    });
    assert.equal((await form({ Origin: `http://127.0.0.1:${port}` })).status, 401, 'no token: refused');
    assert.equal((await form({ ...auth, Origin: 'https://evil.example' })).status, 403, 'another origin: refused');
    assert.equal(await imageIn(getProd, 'hurried'), image('v1'), 'refused forms changed nothing');
    const promoted = await form({ ...auth, Origin: `http://127.0.0.1:${port}` });
    assert.equal(promoted.status, 200, promoted.body);
    assert.match(promoted.body, /<h1>Promoted<\/h1>/);
    await logLine(wh, /deployment\/hurried in .* \(cluster staging\): promote now, by Ops Li \(127\.0\.0\.1, admin token\): the rest of the soak/);
    await logLine(wh, /\/prod\] deployment\/hurried in .* \(cluster prod\): promoted to prod after \d+s healthy in staging: image updated/);
    assert.equal(await imageIn(getProd, 'hurried'), `${image('v8')}@${ran}`);
  });

  test('a replica killed during the soak: the one that starts next promotes, once (one mail)', async () => {
    await workloadIn('kept');
    const ran = await publish('v9');
    const mta = await startMta();
    closers.push(() => mta.stop());
    const settings = { APP_WORKLOAD: 'deployment/kept', MAIL_TO: 'release@example.com' };
    const mailEnv = serviceMailEnv(mta);
    const first = await start(settings, mailEnv);
    await push(first, 'kept', 'v9', ran);
    await logLine(first, /deployment\/kept in .* \(cluster staging\): rollout complete; .* goes to prod once healthy for 8s/);
    first.proc.kill('SIGKILL');
    await first.exited;
    const record = JSON.parse((await getStaging('deployment/kept')).metadata.annotations['webhook/promotion']);
    assert.equal(record.app.image, `${image('v9')}@${ran}`, 'the soak is recorded on the workload');
    const second = await start(settings, mailEnv);
    await logLine(second, /deployment\/kept in .* \(cluster staging\): resuming the soak before prod/);
    await logLine(second, /\/prod\] deployment\/kept in .* \(cluster prod\): promoted to prod after \d+s healthy in staging: image updated/);
    assert.equal(await imageIn(getProd, 'kept'), `${image('v9')}@${ran}`);
    assert.match((await second.metrics()).body, /webhook_promotions_total\{hook="chain",from="staging",to="prod",outcome="promoted"\} 1\n/);
    assert.equal(second.output().match(/promoted to prod after/g)?.length, 1, 'promoted once');
    const promotedMails = async () => (await mta.messages()).map(readMail).filter((m) => /promoted to prod after \d+s healthy in staging/.test(m.body));
    const [mail] = await waitFor(async () => ((await promotedMails()).length > 0 ? promotedMails() : undefined),
      { timeoutMs: 60_000, what: 'the mail of the promotion' });
    console.log(`# the promotion's mail: ${mail.subject}\n${mail.body.slice(0, 1500)}`);
    assert.match(mail.body, /cluster: +prod/);
    assert.equal((await promotedMails()).length, 1, 'one mail');
  });

  test('chromium: the page shows the soaking push; "Promote now" promotes it; the chain is a row per stage', { skip: browser ? false : 'no browser' }, async () => {
    await workloadIn('shown');
    const ran = await publish('v10');
    const wh = await start({ PROMOTE_AFTER: '1h' });
    await push(wh, 'shown', 'v10', ran);
    await logLine(wh, /deployment\/shown in .* \(cluster staging\): rollout complete; .* goes to prod once healthy for 1h0m0s/);
    const admin = await adminPort(wh);
    const page = await browser!.open(`http://127.0.0.1:${admin}/deliveries`);
    await page.viewport(1400, 900);
    assert.equal(await page.evaluate<number>(`document.querySelectorAll('table.soaking tbody tr').length`), 1);
    keepScreenshot('promotion-soaking.png', await page.screenshot());
    const loads = page.loads();
    await page.evaluate(`document.querySelector('table.soaking input[name=name]').value = 'Ops Li'; document.querySelector('table.soaking button').click()`);
    await waitFor(() => page.loads() > loads, { timeoutMs: 30_000, what: 'the form to be posted' });
    assert.match(await page.evaluate<string>('document.querySelector("h1").textContent'), /^Promoted$/);
    await logLine(wh, /\/prod\] deployment\/shown in .* \(cluster prod\): promoted to prod after \d+s healthy in staging: image updated/);
    assert.equal(await imageIn(getProd, 'shown'), `${image('v10')}@${ran}`);
    await waitFor(async () => JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries
      .some((d: any) => d.cluster === 'prod' && d.state === 'done'), { timeoutMs: 90_000, what: 'prod\'s record, done' });
    await page.goto(`http://127.0.0.1:${admin}/deliveries`);
    const rows = await page.evaluate<string[]>(`[...document.querySelectorAll('tbody tr')].map((r) => r.textContent)`);
    assert.ok(rows.some((r) => /\/staging/.test(r) && /applied/.test(r)), rows.join('\n'));
    assert.ok(rows.some((r) => /\/prod/.test(r) && /applied/.test(r)), rows.join('\n'));
    assert.match(await page.evaluate<string>(`document.querySelector('table.soaking').textContent`),
      /promotedstaging → prod: to prod after \d+s healthy in staging/);
    keepScreenshot('promotion-chain.png', await page.screenshot());
    await page.close();
  });

  test('a promotion rejected in prod stops the chain there, said and counted', async () => {
    await workloadIn('refused', { prod: { 'webhook/approval': 'required' } });
    const ran = await publish('v11');
    const keyFile = path.join(dir, 'approval-key');
    fs.writeFileSync(keyFile, 'promotion-approval-key-5e2d8c1f0b7a6e4d3c2b1a0f9e8d7c6b\n');
    const wh = await start({ PROMOTE_AFTER: '0s' }, {}, ['-public-url', 'https://webhook.example.test', '-approval-key-file', keyFile]);
    await push(wh, 'refused', 'v11', ran);
    const port = await adminPort(wh);
    const waiting = await waitFor(async () => JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries
      .find((d: any) => d.cluster === 'prod' && d.decision === 'waiting' && d.rejectUrl), { timeoutMs: CHAIN_TIMEOUT_MS, what: 'prod\'s waiting record' });
    const rejected = await wh.request(new URL(waiting.rejectUrl).pathname, {
      method: 'POST', body: 'name=Ops+Wu', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(rejected.status, 200, rejected.body);
    await logLine(wh, /deployment\/refused in .* \(cluster prod\): chain stopped at prod: the push was rejected/);
    assert.equal(await imageIn(getProd, 'refused'), image('v1'));
    assert.match((await wh.metrics()).body, /webhook_promotions_total\{hook="chain",from="staging",to="prod",outcome="rejected"\} 1/);
  });

  test('a stage names its own namespace: staging > prod/<another namespace>', async () => {
    const other = freshNamespaceName('promotion-prod');
    await kubectlProd(['create', 'namespace', other]);
    closers.push(() => removeNamespace(kubectlProd, other));
    await kubectlProd(['-n', other, 'apply', '-f', '-'], JSON.stringify(deployment('moved', [{ name: 'app', image: image('v1') }], { replicas: 1 })));
    await kubectlStaging(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('moved', [{ name: 'app', image: image('v1') }], { replicas: 1 })));
    const ran = await publish('v12');
    const wh = await start({ PROMOTE_AFTER: '0s', CLUSTERS: `staging > prod/${other}` });
    await push(wh, 'moved', 'v12', ran);
    await logLine(wh, new RegExp(`/prod\\] deployment/moved in ${other} \\(cluster prod\\): promoted to prod after \\d+s healthy in staging: image updated`));
    const moved = namespacedGetter(kubectlProd, other);
    assert.equal(await imageIn(moved, 'moved'), `${image('v12')}@${ran}`);
  });

  test('a replica killed after the soak\'s end, before prod\'s decision: another takes its claim over and promotes, once (one mail)', async () => {
    await workloadIn('claimed');
    const ran = await publish('v13');
    const mta = await startMta();
    closers.push(() => mta.stop());
    // Prod's API server behind a proxy that, once told, holds the replica's next request there: the replica has
    // ended the soak and not yet decided in prod.
    const admin = JSON.parse(fs.readFileSync(shared!.kubeconfigPath, 'utf8'));
    const proxy = await holdingProxy(admin.clusters[0].cluster.server);
    closers.push(proxy.close);
    const prodFile = renamedKubeconfig(shared!, 'prod', path.join(dir, 'prod-proxied.json'));
    const proxied = JSON.parse(fs.readFileSync(prodFile, 'utf8'));
    proxied.clusters[0].cluster.server = proxy.server;
    fs.writeFileSync(prodFile, JSON.stringify(proxied), { mode: 0o600 });
    // Staging first: its context is the default cluster, which holds the record ledger, so that the request held is
    // prod's decision, not the ledger's write at the soak's start.
    const env = { ...serviceMailEnv(mta), KUBECONFIG: [renamedKubeconfig(second!, 'staging', path.join(dir, 'staging.json')), prodFile].join(path.delimiter) };
    const settings = { APP_WORKLOAD: 'deployment/claimed', MAIL_TO: 'release@example.com', PROMOTE_AFTER: '0s' };
    const first = await start(settings, env);
    proxy.hold();
    await push(first, 'claimed', 'v13', ran);
    await logLine(first, /deployment\/claimed in .* \(cluster staging\): rollout complete; .* goes to prod once healthy for 0s/);
    await proxy.held;
    const recordOf = async () => (await getStaging('deployment/claimed')).metadata.annotations?.['webhook/promotion'];
    const raw = await waitFor(async () => {
      const found = await recordOf();
      return found === undefined || found === '{}' || JSON.parse(found).app?.claim ? found ?? '{}' : undefined;
    }, { timeoutMs: CHAIN_TIMEOUT_MS, what: 'the soak\'s end: its record claimed (or taken off)' });
    first.proc.kill('SIGKILL');
    await first.exited;
    proxy.release();
    const record = JSON.parse(raw);
    assert.equal(record.app?.image, `${image('v13')}@${ran}`, `the record stays on the workload until prod's decision: ${raw}`);
    assert.ok(record.app.claim.by && record.app.claim.at, raw);
    assert.match(first.output(), /deployment\/claimed in .* \(cluster staging\): soak ended; promoting, claimed by replica /);
    assert.equal(await imageIn(getProd, 'claimed'), image('v1'), 'nothing decided in prod yet');
    // The claim stands until it is stale (-promotion-claim-timeout, a minute by default; 15 s here, so the test
    // waits for the takeover, not for a minute; the claim is a couple of seconds old when this replica first looks
    // at it): then this replica takes it over.
    const taker = await start(settings, env, ['-promotion-claim-timeout', '15s']);
    const claimTimeoutMs = 180_000;
    await logLine(taker, /deployment\/claimed in .* \(cluster staging\): being promoted by replica .*; looked at again in/);
    await logLine(taker, /deployment\/claimed in .* \(cluster staging\): taking over the promotion claimed by replica /, claimTimeoutMs);
    await logLine(taker, /\/prod\] deployment\/claimed in .* \(cluster prod\): promoted to prod after [\dhms]+ healthy in staging: image updated/, claimTimeoutMs);
    assert.equal(await imageIn(getProd, 'claimed'), `${image('v13')}@${ran}`);
    assert.equal(taker.output().match(/promoted to prod after/g)?.length, 1, 'promoted once');
    assert.match((await taker.metrics()).body, /webhook_promotions_total\{hook="chain",from="staging",to="prod",outcome="promoted"\} 1\n/);
    const promotedMails = async () => (await mta.messages()).map(readMail).filter((m) => /promoted to prod after [\dhms]+ healthy in staging/.test(m.body));
    await waitFor(async () => (await promotedMails()).length > 0, { timeoutMs: 90_000, what: 'the mail of the promotion' });
    assert.equal((await promotedMails()).length, 1, 'one mail');
    await waitFor(async () => (await recordOf()) === '{}', { timeoutMs: 30_000, what: 'the record taken off once prod\'s decision is recorded' });
  });

  test('a push by tag alone (no VERIFY_IMAGE, no PIN_DIGEST): prod gets the digest staging\'s pods pulled', async () => {
    await workloadIn('tagged');
    const ran = await publish('v14');
    const wh = await start({ VERIFY_IMAGE: 'false' });
    await push(wh, 'tagged', 'v14', ran);
    assert.equal(await imageIn(getStaging, 'tagged'), image('v14'), 'staging runs the tag');
    await logLine(wh, /deployment\/tagged in .* \(cluster staging\): rollout complete; .*:v14 goes to prod once healthy for 8s/);
    // What a kubelet reports once it has pulled the tag; kwok's pods report no imageID of their own.
    await reportPulled(kubectlStaging, ns, 'tagged', `${registry!.host}/${REPO}@${ran}`);
    await publish('v14');
    await logLine(wh, /\/prod\] deployment\/tagged in .* \(cluster prod\): promoted to prod after \d+s healthy in staging: image updated/);
    assert.equal(await imageIn(getProd, 'tagged'), `${image('v14')}@${ran}`, 'prod runs the digest that ran, not where the tag points now');
  });

  test('a push by tag alone whose pods report no digest stops at staging, saying so', async () => {
    await workloadIn('untold');
    const ran = await publish('v15');
    const wh = await start({ VERIFY_IMAGE: 'false', PROMOTE_AFTER: '0s' });
    await push(wh, 'untold', 'v15', ran);
    await logLine(wh, /deployment\/untold in .* \(cluster staging\): chain stopped at staging: no digest is known of what runs \(.*:v15\): its pods report no image digest \(status\.containerStatuses\[\]\.imageID\); set PIN_DIGEST=true or VERIFY_IMAGE=true; not promoted to prod/);
    assert.equal(await imageIn(getProd, 'untold'), image('v1'));
  });

  test('a promotion waiting for approval in a stage\'s own namespace (staging > prod/<namespace>) is decided there', async () => {
    const other = freshNamespaceName('promotion-gated');
    await kubectlProd(['create', 'namespace', other]);
    closers.push(() => removeNamespace(kubectlProd, other));
    const gated: any = deployment('elsewhere', [{ name: 'app', image: image('v1') }], { replicas: 1 });
    gated.metadata.annotations = { ...gated.metadata.annotations, 'webhook/approval': 'required' };
    await kubectlProd(['-n', other, 'apply', '-f', '-'], JSON.stringify(gated));
    await kubectlStaging(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('elsewhere', [{ name: 'app', image: image('v1') }], { replicas: 1 })));
    const ran = await publish('v16');
    const keyFile = path.join(dir, 'approval-key');
    fs.writeFileSync(keyFile, 'promotion-approval-key-5e2d8c1f0b7a6e4d3c2b1a0f9e8d7c6b\n');
    const settings = { PROMOTE_AFTER: '0s', CLUSTERS: `staging > prod/${other}`, APP_WORKLOAD: 'deployment/elsewhere' };
    const args = ['-public-url', 'https://webhook.example.test', '-approval-key-file', keyFile];
    const wh = await start(settings, {}, args);
    await push(wh, 'elsewhere', 'v16', ran);
    const port = await adminPort(wh);
    const waiting = await waitFor(async () => JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries
      .find((d: any) => d.cluster === 'prod' && d.decision === 'waiting' && d.approveUrl), { timeoutMs: CHAIN_TIMEOUT_MS, what: 'prod\'s waiting record' });
    // A replica that starts now finds the waiting promotion where the stage puts it (and would expire it there).
    const later = await start(settings, {}, args);
    const laterPort = await adminPort(later);
    await waitFor(async () => {
      const page = (await httpRequest(laterPort, '/deliveries')).body;
      const table = /<table class="waiting">[\s\S]*?<\/table>/.exec(page)?.[0] ?? '';
      return table.includes('elsewhere') && table.includes(other);
    }, { timeoutMs: 60_000, what: 'the waiting promotion listed by a replica that started after it' });
    const approved = await later.request(new URL(waiting.approveUrl).pathname, {
      method: 'POST', body: 'name=Ops+Wu', headers: { 'Content-Type': 'application/x-www-form-urlencoded' } });
    assert.equal(approved.status, 200, approved.body);
    assert.equal(await imageIn(namespacedGetter(kubectlProd, other), 'elsewhere'), `${image('v16')}@${ran}`);
  });

  test('a promotion record written by hand is not resumed: the soak is not skipped, prod is not patched', async () => {
    await workloadIn('forged');
    const ran = await publish('v66');
    // A staging editor sets the image by hand and records it as soaked already, naming another namespace for prod.
    await kubectlStaging(['-n', ns, 'set', 'image', 'deployment/forged', `app=${image('v66')}@${ran}`]);
    await kubectlStaging(['-n', ns, 'rollout', 'status', 'deployment/forged', '--timeout=90s']);
    const forged = { app: { hook: 'chain', request: 'forged-request', image: `${image('v66')}@${ran}`, namespace: 'payments',
      stage: 0, since: '2026-01-01T00:00:00.000Z', until: '2026-01-01T00:00:01.000Z', restarts: 0, mac: 'AAAA' } };
    await kubectlStaging(['-n', ns, 'annotate', 'deployment/forged', `webhook/promotion=${JSON.stringify(forged)}`]);
    const wh = await start({ APP_WORKLOAD: 'deployment/forged' });
    await logLine(wh, /\[forged-request\] deployment\/forged in \S+ \(cluster staging\): the soak recorded there is not resumed: the promotion record of .* is not the service's own \(its MAC does not verify/);
    const refused = await waitFor(async () => (JSON.parse(await kubectlStaging(['-n', ns, 'get', 'events', '--field-selector',
      'involvedObject.name=forged,reason=UpgradeRefused', '-o', 'json'])).items as { type: string; message: string }[])
      .find((e) => e.type === 'Warning' && /is not the service's own/.test(e.message)), { timeoutMs: 30_000, what: 'the Warning Event' });
    assert.match(refused.message, /not promoted; asked by hook "chain", request forged-request$/);
    assert.equal(await imageIn(getProd, 'forged'), image('v1'), 'nothing reaches prod');
    assert.doesNotMatch(wh.output(), /promoted to prod/);
  });

  test('a promotion record put back after its promotion is stale: a replica that starts does not resume it', async () => {
    await workloadIn('again');
    const ran = await publish('v21');
    const settings = { APP_WORKLOAD: 'deployment/again', PROMOTE_AFTER: '2s' };
    const first = await start(settings);
    await push(first, 'again', 'v21', ran);
    await logLine(first, /deployment\/again in .* \(cluster staging\): rollout complete; .* goes to prod once healthy/);
    const record = (await getStaging('deployment/again')).metadata.annotations['webhook/promotion'];
    assert.equal(JSON.parse(record).app.stored, true, 'the soak is named in the ledger');
    await logLine(first, /\/prod\] deployment\/again in .* \(cluster prod\): promoted to prod after/);
    await waitFor(async () => (await getStaging('deployment/again')).metadata.annotations['webhook/promotion'] === '{}',
      { timeoutMs: 30_000, what: 'the record taken off after the promotion' });
    await first.stop();
    // A staging editor puts the record back byte for byte: its MAC verifies where it sits.
    await kubectlStaging(['-n', ns, 'annotate', '--overwrite', 'deployment/again', `webhook/promotion=${record}`]);
    const second = await start(settings);
    await logLine(second, /deployment\/again in \S+ \(cluster staging\): the soak recorded there is not resumed: the promotion record of .* is stale: the record ledger \S+\/webhook-records does not name it live there/);
    const refused = await waitFor(async () => (JSON.parse(await kubectlStaging(['-n', ns, 'get', 'events', '--field-selector',
      'involvedObject.name=again,reason=UpgradeRefused', '-o', 'json'])).items as { type: string; message: string }[])
      .find((e) => e.type === 'Warning' && /is stale/.test(e.message)), { timeoutMs: 30_000, what: 'the Warning Event' });
    assert.match(refused.message, /not promoted; asked by hook "chain", request \S+$/);
    assert.doesNotMatch(second.output(), /resuming the soak/);
  });

  test('staging > prod-a/<ns> prod-b/<ns>: two clusters in the later stage, each promoted to as a cluster of its own', async () => {
    // Two control planes only: prod-a and prod-b are two contexts of the shared one, each stage item in a namespace
    // of its own, so the two targets are distinct workloads.
    const [nsA, nsB] = [freshNamespaceName('promotion-a'), freshNamespaceName('promotion-b')];
    for (const n of [nsA, nsB]) {
      await kubectlProd(['create', 'namespace', n]);
      closers.push(() => removeNamespace(kubectlProd, n));
      await kubectlProd(['-n', n, 'apply', '-f', '-'], JSON.stringify(deployment('twin', [{ name: 'app', image: image('v1') }], { replicas: 1 })));
    }
    await kubectlStaging(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('twin', [{ name: 'app', image: image('v1') }], { replicas: 1 })));
    const kubeconfig = [renamedKubeconfig(shared!, 'prod-a', path.join(dir, 'prod-a.json')),
      renamedKubeconfig(shared!, 'prod-b', path.join(dir, 'prod-b.json')),
      renamedKubeconfig(second!, 'staging', path.join(dir, 'staging.json'))].join(path.delimiter);
    const ran = await publish('v17');
    const wh = await start({ PROMOTE_AFTER: '0s', CLUSTERS: `staging > prod-a/${nsA} prod-b/${nsB}` }, { KUBECONFIG: kubeconfig });
    const res = await push(wh, 'twin', 'v17', ran);
    assert.match(res.body, /^cluster: +staging$/m);
    for (const [cluster, n] of [['prod-a', nsA], ['prod-b', nsB]])
      await logLine(wh, new RegExp(`/${cluster}\\] deployment/twin in ${n} \\(cluster ${cluster}\\): promoted to ${cluster} after \\d+s healthy in staging: image updated`));
    for (const n of [nsA, nsB]) assert.equal(await imageIn(namespacedGetter(kubectlProd, n), 'twin'), `${image('v17')}@${ran}`);
    const to = `prod-a/${nsA}, prod-b/${nsB}`;
    assert.match((await wh.metrics()).body, new RegExp(`webhook_promotions_total\\{hook="chain",from="staging",to="${to}",outcome="promoted"\\} 2\n`));
    const port = await adminPort(wh);
    const records = await waitFor(async () => {
      const found = JSON.parse((await httpRequest(port, '/deliveries.json')).body).deliveries
        .filter((d: any) => ['prod-a', 'prod-b'].includes(d.cluster) && d.rollout?.state === 'complete');
      return found.length === 2 ? found : undefined;
    }, { timeoutMs: 90_000, what: 'a record per cluster of the later stage, its rollout complete' });
    assert.deepEqual(records.map((d: any) => [d.cluster, d.namespace, d.request_id.split('/')[1]]).sort(),
      [['prod-a', nsA, 'prod-a'], ['prod-b', nsB, 'prod-b']]);
  });
});

describe('the gate: a registry watch enters a chain at its first stage only', { skip: shared && second && registry ? false : 'no clusters or registry' }, () => {
  const ns = freshNamespaceName('promotion-watch');
  const kubectlProd = kubectlFor(shared!);
  const kubectlStaging = kubectlFor(second!);
  const dir = makeTempDir('promotion-watch-');
  let wh: Webhook | undefined;
  const image = (ref: string) => `${registry!.host}/${REPO}${ref}`;
  let built = 0;
  const publish = async (tag: string) => {
    const config = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', build: ++built, tag, watch: true }));
    const digest = await pushBlob(registry!, REPO, config);
    return pushManifest(registry!, REPO, {
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest, size: config.length }, layers: [],
    }, tag);
  };
  const imageIn = async (k: Kubectl, name: string) => containerImage(await namespacedGetter(k, ns)(`deployment/${name}`), 'app');
  const events = async (k: Kubectl, name: string, reason: string) =>
    (JSON.parse(await k(['-n', ns, 'get', 'events', '--field-selector', `involvedObject.name=${name},reason=${reason}`, '-o', 'json']))
      .items as { type: string; message: string }[]);

  before(() => Promise.all([kubectlProd, kubectlStaging].map((k) => k(['create', 'namespace', ns]))));
  after(async () => {
    await wh?.stop();
    await Promise.all([removeNamespace(kubectlProd, ns), removeNamespace(kubectlStaging, ns)]);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('POLL_INTERVAL on a staging > prod hook patches staging first and prod only after the soak; webhook/poll on prod is refused', async () => {
    const first = await publish('w1');
    const pinned = image(`:w1@${first}`);
    for (const k of [kubectlStaging, kubectlProd]) {
      const d: any = deployment('watched', [{ name: 'app', image: pinned }], { replicas: 1 });
      // On prod alone, a watch asked for by annotation: the chain is not entered there, whatever asks.
      if (k === kubectlProd) d.metadata.annotations = { 'webhook/poll': '2s', 'webhook/hook': 'chain' };
      await k(['-n', ns, 'apply', '-f', '-'], JSON.stringify(d));
      await k(['-n', ns, 'rollout', 'status', 'deployment/watched', '--timeout=90s']);
    }
    const caFile = path.join(dir, 'registry-ca.pem');
    fs.writeFileSync(caFile, registry!.caPem);
    const hooks = [upgradeHook('chain', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/watched', APP_CONTAINER: 'app',
      REGISTRY_CA: caFile, CLUSTERS: 'staging > prod', PROMOTE_AFTER: SOAK, POLL_INTERVAL: '2s' })];
    const kubeconfig = [renamedKubeconfig(shared!, 'prod', path.join(dir, 'prod.json')),
      renamedKubeconfig(second!, 'staging', path.join(dir, 'staging.json'))].join(path.delimiter);
    // A look every 2 s: the registry is on this machine (-poll-min-interval).
    wh = await startWebhook({ hooks, metrics: true, args: ['-rollout-follow', '60s', '-poll-min-interval', '1s'],
      env: { KUBECONFIG: kubeconfig } });
    // The Event this service records (another service watching the same cluster may record one of its own).
    const expected = 'not watched: hook "chain" is a promotion chain, entered at its first stage (staging) only: cluster "prod" is ' +
      'reached by the chain\'s promotion';
    const refused = await waitFor(async () => (await events(kubectlProd, 'watched', 'RegistryWatchRefused')).find((e) => e.message === expected),
      { timeoutMs: 60_000, what: 'the RegistryWatchRefused Event on prod' });
    assert.equal(refused.type, 'Warning');
    assert.match(wh.output(), /registry watch: deployment\/watched in \S+ is not watched: hook "chain" is a promotion chain/);
    const moved = await publish('w1');
    await waitForOutput(wh, /deployment\/watched in \S+ \(cluster staging\): rollout complete; .* goes to prod once healthy for 8s/, CHAIN_TIMEOUT_MS);
    assert.equal(await imageIn(kubectlStaging, 'watched'), image(`:w1@${moved}`));
    assert.equal(await imageIn(kubectlProd, 'watched'), pinned, 'prod is not patched before the soak ends');
    await waitForOutput(wh, /\/prod\] deployment\/watched in \S+ \(cluster prod\): promoted to prod after \d+s healthy in staging: image updated/, CHAIN_TIMEOUT_MS);
    assert.equal(await imageIn(kubectlProd, 'watched'), image(`:w1@${moved}`));
    // One look at the tag's move, in staging: prod was never watched, so nothing else patched it.
    assert.equal((await events(kubectlProd, 'watched', 'ImageUpdated')).length, 1);
  });
});
