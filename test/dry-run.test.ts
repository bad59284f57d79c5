/*
 * DRY_RUN through the built executable, on the real test cluster and git's http-backend: a push to a dry-run hook is
 * decided as it would be and told as what it would do (the answer, the JSON notification, the deliveries page, one
 * DryRun Event), and nothing is written: the workload's resourceVersion, its annotations and the repository's head
 * stay as they were; a push that would wait leaves no pending entry; -validate names the hook a dry run.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter, removeNamespace } from './cluster/kube.ts';
import { git, makeRepository, startGitServer, type GitServer } from './git-server.ts';
import { adminPort, defaultBinary, httpRequest, makeTempDir, startWebhook, waitFor, type Webhook } from './harness.ts';
import { startReceiver, type Receiver } from './receiver.ts';
import { fixedSettings, upgradeHook } from './upgrade-hooks.ts';

const TOKEN = 'dry-run-token-5e2a91';
const GIT_TOKEN = 'dry-run-git-token-7c4d0b';
const cluster = await clusterOrSkip();

describe('DRY_RUN: decided and told, nothing written', { skip: cluster ? false : 'no cluster' }, () => {
  const kubectl = kubectlFor(cluster!);
  const ns = freshNamespaceName('dry-run');
  const get = namespacedGetter(kubectl, ns);
  const root = makeTempDir('dry-run-');
  let rx: Receiver;
  let server: GitServer;
  let bare: string;
  let wh: Webhook;
  let hooksFile: string;
  const push = (hook: string, workload: string, tag: string) =>
    wh.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload: `deployment/${workload}`, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
    });
  const posted = (id: unknown) => waitFor(() => rx.requests.filter((r) => r.url === '/json').map((r) => JSON.parse(r.body))
    .find((d) => d.request_id === id), { timeoutMs: 60_000, what: `the JSON result of ${id}` });
  const events = async (name: string) => (JSON.parse(await kubectl(['-n', ns, 'get', 'events', '--field-selector',
    `involvedObject.name=${name}`, '-o', 'json'])).items as { reason: string; type: string; message: string }[]);

  before(async () => {
    rx = await startReceiver();
    const manifest = `apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: viagit\n  namespace: ${ns}\nspec:\n  template:\n    spec:\n      containers:\n        - name: app\n          image: ${acrImage('v1')}\n`;
    bare = makeRepository(root, 'deploy', { 'apps/viagit.yaml': manifest });
    server = await startGitServer(root, 'x-access-token', GIT_TOKEN);
    const tokenFile = path.join(root, 'git-token');
    fs.writeFileSync(tokenFile, `${GIT_TOKEN}\n`);
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items:
      ['web', 'gated', 'viagit'].map((n) => deployment(n, [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })) }));
    const notify = { NOTIFY_URL: `${rx.base}/json`, NOTIFY_FORMAT: 'json', DRY_RUN: 'true' };
    const fixed = (id: string, workload: string, settings: Record<string, string>) => ({ ...upgradeHook(id, TOKEN),
      'pass-environment-to-command': fixedSettings({ APP_NS: ns, APP_WORKLOAD: `deployment/${workload}`, APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', ...notify, ...settings }) });
    hooksFile = path.join(root, 'hooks.json');
    fs.writeFileSync(hooksFile, JSON.stringify([
      fixed('web', 'web', {}),
      fixed('gated', 'gated', { REQUIRE_APPROVAL: 'true' }),
      fixed('viagit', 'viagit', { GIT_REPO: `${server.base}/deploy.git`, GIT_PATH: 'apps/viagit.yaml', GIT_TOKEN: tokenFile }),
    ]));
    const key = path.join(root, 'approval-key');
    fs.writeFileSync(key, 'dry-run-approval-key-3f8a1c6e9b2d4f7a0c5e8b1d3f6a9c2e\n');
    wh = await startWebhook({ hooks: hooksFile, metrics: true, env: { KUBECONFIG: cluster!.kubeconfigPath, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64') },
      args: ['-rollout-follow', '0s', '-deliveries', '20', '-public-url', 'https://webhook.example.test', '-approval-key-file', key] });
  });
  after(async () => {
    await wh?.stop();
    await rx?.close();
    await server?.close();
    await removeNamespace(kubectl, ns);
  });

  test('an applied push: "would set app\'s image", dry_run in the JSON and on the page, one DryRun Event, the workload untouched', async () => {
    const before = await get('deployment/web');
    const res = await push('web', 'web', 'v2');
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, new RegExp(`^action: +would set app's image to ${acrImage('v2').replace(/[.]/g, '\\.')}; dry run$`, 'm'));
    assert.match(res.body, /^dry run: +nothing was written \(DRY_RUN=true\)$/m);
    const doc = await posted(res.headers['x-request-id']);
    assert.equal(doc.dry_run, true);
    assert.equal(doc.decision, 'applied');
    assert.match(doc.detail, /would set app's image to .*:v2; dry run/);
    const event = await waitFor(async () => (await events('web')).find((e) => e.reason === 'DryRun'), { timeoutMs: 30_000, what: 'the DryRun Event' });
    assert.equal(event.type, 'Normal');
    assert.match(event.message, /^container app: dry run: would set app's image to .*:v2; nothing was written \(DRY_RUN\); asked by hook "web", request /);
    const page = JSON.parse((await httpRequest(await adminPort(wh), '/deliveries.json')).body).deliveries
      .find((d: any) => d.request_id === res.headers['x-request-id']);
    assert.equal(page.dry_run, true);
    // The DryRun Event is the only one: no ImageUpdated.
    assert.deepEqual((await events('web')).map((e) => e.reason).filter((r) => r !== 'DryRun' && !['ScalingReplicaSet', 'SuccessfulCreate'].includes(r)), []);
    const after = await get('deployment/web');
    assert.equal(after.metadata.resourceVersion, before.metadata.resourceVersion, 'no PATCH');
    assert.equal(containerImage(after, 'app'), acrImage('v1'));
  });

  test('a push that would wait for an approval: no pending entry, no links; a Git hook: the repository\'s head unchanged', async () => {
    const gated = await get('deployment/gated');
    const waits = await push('gated', 'gated', 'v3');
    assert.equal(waits.status, 202, waits.body);
    assert.match(waits.body, /^action: +would wait: waiting for approval until .*; dry run$/m);
    const doc = await posted(waits.headers['x-request-id']);
    assert.equal(doc.dry_run, true);
    assert.equal(doc.approveUrl, undefined, 'no links: nothing waits');
    assert.equal((await get('deployment/gated')).metadata.resourceVersion, gated.metadata.resourceVersion, 'no pending entry');
    const head = git(bare, ['rev-parse', 'main']).trim();
    const viaGit = await get('deployment/viagit');
    const res = await push('viagit', 'viagit', 'v4');
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, new RegExp(`^action: +would commit .*:v4 to apps/viagit\\.yaml on main of ${server.base.replace(/[.]/g, '\\.')}/deploy\\.git; dry run$`, 'm'));
    assert.equal(git(bare, ['rev-parse', 'main']).trim(), head, 'nothing committed');
    assert.equal((await get('deployment/viagit')).metadata.resourceVersion, viaGit.metadata.resourceVersion, 'nothing recorded on the workload');
  });

  test('-validate names each dry-run hook', () => {
    // Exit status 0, or execFileSync throws.
    const out = execFileSync(defaultBinary(), ['-validate', '-hooks', hooksFile], { encoding: 'utf8' });
    assert.equal(out.match(/dry run: each push is decided and told, nothing is written \(DRY_RUN\)/g)?.length, 3, out);
  });
});
