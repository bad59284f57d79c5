/*
 * A workload a Helm release installed is upgraded in its release, as `helm upgrade --reuse-values --set
 * image.tag=<tag>` would upgrade it (releaseOut): through the executable on the test cluster, a chart installed with
 * Helm itself (built from the Go module proxy: test/helm.ts), then a push. Helm is the judge of what was written:
 * `helm get values` shows the new tag, `helm history` the new revision (the one before superseded), `helm get
 * manifest` the new image; a later `helm upgrade --reuse-values` changing another value keeps the image, `helm
 * rollback` restores the old one and the hold takes that for a change made outside webhook. A release that cannot
 * be written refuses the push when the hook asked for it (nothing written, in the cluster or the release), and is
 * patched alone with a note when it did not. The settings' parse and -print-rbac's grant need no peer.
 * Outside CI the cluster tests are skipped when Helm or the cluster cannot start; with CI=true they fail.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, crashLoopInForce, deployment, freshNamespaceName, kubectlFor,
  namespacedGetter, removeNamespace,
} from './cluster/kube.ts';
import { adminPort, defaultBinary, httpRequest, makeTempDir, startWebhook, waitFor, type Webhook } from './harness.ts';
import { helmOrSkip, helmRunner } from './helm.ts';
import { upgradeHook } from './upgrade-hooks.ts';
import { helmFieldPath, helmReleaseSetting, helmSettings } from '../webhook.ts';

/** The seed hook with its target fixed in the file (deployment/web's container app, in APP_NS): none from the URL. */
function fixedHook(id: string, settings: Record<string, string>): object {
  const hook: any = upgradeHook(id, 't', { APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', ...settings });
  return { ...hook, 'pass-environment-to-command': hook['pass-environment-to-command'].filter((e: any) => e.source === 'string') };
}

describe('HELM_RELEASE and HELM_FIELD', () => {
  test('unset, auto, none and a name; unset is lenient, anything the hook asks for is strict', () => {
    assert.deepEqual(helmSettings(helmReleaseSetting(undefined), helmFieldPath(undefined)), { release: undefined, field: 'image.tag', strict: false });
    assert.deepEqual(helmSettings(helmReleaseSetting(' AUTO '), helmFieldPath(undefined)), { release: undefined, field: 'image.tag', strict: true });
    assert.deepEqual(helmSettings(helmReleaseSetting('web.v2'), helmFieldPath('app.image.tag')), { release: 'web.v2', field: 'app.image.tag', strict: true });
    assert.deepEqual(helmSettings(helmReleaseSetting(''), helmFieldPath('images.api.tag')), { release: undefined, field: 'images.api.tag', strict: true });
    assert.equal(helmSettings(helmReleaseSetting('None'), helmFieldPath('image.tag')), undefined);
  });
  test('what Helm would not name a release, and a field that is no path of keys, are refused naming the setting', () => {
    for (const bad of ['Web', 'web_1', '-web', 'web.', 'a'.repeat(54), 'web/other'])
      assert.throws(() => helmReleaseSetting(bad), /^Error: HELM_RELEASE ".*" is neither auto, none nor a Helm release name/, bad);
    for (const bad of ['image..tag', '.tag', 'image tag', 'image.tag.'])
      assert.throws(() => helmFieldPath(bad), /^Error: HELM_FIELD ".*" is not a dotted path of keys \(e\.g\. image\.tag\)$/, bad);
  });
  test('-print-rbac grants what Helm is granted on Secrets only to a hook that fixes HELM_RELEASE', () => {
    const dir = makeTempDir('helm-rbac-');
    const hooks = [
      fixedHook('released', { APP_NS: 'shop', HELM_RELEASE: 'auto' }),
      fixedHook('plain', { APP_NS: 'blog' }),
      fixedHook('patched', { APP_NS: 'docs', HELM_RELEASE: 'none' }),
    ];
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify(hooks));
    const out = execFileSync(defaultBinary(), ['-print-rbac', '-hooks', path.join(dir, 'hooks.json')], { encoding: 'utf8' });
    const roles = out.split('\n---\n').filter((d) => /^kind: Role$/m.test(d));
    const role = (ns: string) => roles.find((r) => r.includes(`namespace: "${ns}"`))!;
    const helmRule = /resources: \["secrets"\]\n {4}verbs: \["list", "create", "patch", "delete"\]/;
    assert.match(role('shop'), helmRule);
    assert.doesNotMatch(role('blog'), /secrets/);
    assert.doesNotMatch(role('docs'), /secrets/);
    assert.match(out, /hook "released": deployment\/web in namespace shop, its Helm release's records \(HELM_RELEASE\)/);
  });
  test('-validate says where each hook writes: the cluster, a Helm release, a branch, a request', () => {
    const dir = makeTempDir('helm-validate-');
    const git = { GIT_REPO: 'https://github.com/shop/deploy.git', GIT_PATH: 'apps/web.yaml', GIT_TOKEN: 'ghp-validate-token' };
    const hooks = [
      fixedHook('unset', { APP_NS: 'shop' }),
      fixedHook('auto', { APP_NS: 'shop', HELM_RELEASE: 'auto', HELM_FIELD: 'app.image.tag' }),
      fixedHook('named', { APP_NS: 'shop', HELM_RELEASE: 'shop' }),
      fixedHook('none', { APP_NS: 'shop', HELM_RELEASE: 'none' }),
      fixedHook('branch', { APP_NS: 'shop', ...git }),
      fixedHook('request', { APP_NS: 'shop', ...git, GIT_PULL_REQUEST: 'GitHub' }),
    ];
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify(hooks));
    const out = execFileSync(defaultBinary(), ['-validate', '-hooks', path.join(dir, 'hooks.json')], { encoding: 'utf8' });
    const writes = [...out.matchAll(/^\s*writes to: (.*)$/gm)].map((m) => m[1]);
    assert.deepEqual(writes, [
      "the cluster (a PATCH); a workload of a Helm release (meta.helm.sh/release-name) gets the release's next revision (values image.tag, HELM_FIELD), then the workload's PATCH, where the service may write the release (HELM_RELEASE unset; auto requires it)",
      "the workload's Helm release (meta.helm.sh/release-name): the release's next revision (values app.image.tag, HELM_FIELD), then the workload's PATCH",
      "Helm release shop: the release's next revision (values image.tag, HELM_FIELD), then the workload's PATCH",
      'the cluster, the workload patched alone (HELM_RELEASE=none)',
      'a commit of apps/web.yaml on branch main of https://github.com/shop/deploy.git (GIT_REPO); the GitOps tool applies it',
      "a commit of apps/web.yaml on a branch of the workload's own, and a github request into main (GIT_PULL_REQUEST) of https://github.com/shop/deploy.git (GIT_REPO); the GitOps tool applies it",
    ]);
    assert.ok(!out.includes('ghp-validate-token'));
  });
});

const helm = await helmOrSkip();
const cluster = helm ? await clusterOrSkip() : undefined;

/** A chart as `helm create` lays one out, cut to a Deployment whose image is `repository:tag` from its values. */
function writeChart(dir: string): string {
  const chart = path.join(dir, 'shop');
  fs.mkdirSync(path.join(chart, 'templates'), { recursive: true });
  fs.writeFileSync(path.join(chart, 'Chart.yaml'), 'apiVersion: v2\nname: shop\nversion: 0.1.0\nappVersion: "1.0"\n');
  const repository = acrImage('x').replace(/:x$/, '');
  fs.writeFileSync(path.join(chart, 'values.yaml'), `replicaCount: 1\nimage:\n  repository: ${repository}\n  tag: v1.0.0\n  pullPolicy: IfNotPresent\n`);
  fs.writeFileSync(path.join(chart, 'templates', 'deployment.yaml'), [
    'apiVersion: apps/v1',
    'kind: Deployment',
    'metadata:',
    '  name: {{ .Release.Name }}',
    'spec:',
    '  replicas: {{ .Values.replicaCount }}',
    '  selector:',
    '    matchLabels:',
    '      app: {{ .Release.Name }}',
    '  template:',
    '    metadata:',
    '      labels:',
    '        app: {{ .Release.Name }}',
    '    spec:',
    '      containers:',
    '        - name: app',
    '          image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"',
    '          imagePullPolicy: {{ .Values.image.pullPolicy }}',
    '',
  ].join('\n'));
  return chart;
}

describe('a Helm release, through the executable and the cluster', { skip: helm && cluster ? false : 'no helm or no cluster' }, () => {
  const ns = freshNamespaceName('helm');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  const runHelm = helmRunner(helm!, makeTempDir('helm-home-'), cluster!.kubeconfigPath);
  const chart = writeChart(makeTempDir('helm-chart-'));
  const TOKEN = 'helm-token-9b2e41c7';
  let wh: Webhook;
  const push = (hook: string, workload: string, tag: string) =>
    wh.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag),
    });
  const image = async (name: string) => containerImage(await getJson(`deployment/${name}`), 'app');
  const history = async (release: string) => JSON.parse(await runHelm(['history', release, '-n', ns, '-o', 'json']));
  const values = async (release: string) => JSON.parse(await runHelm(['get', 'values', release, '-n', ns, '-o', 'json']));
  const releaseSecrets = async (release: string) =>
    JSON.parse(await kubectl(['-n', ns, 'get', 'secrets', '-l', `owner=helm,name=${release}`, '-o', 'json'])).items.map((s: any) => s.metadata.name).sort();

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    for (const release of ['web', 'other', 'api']) await runHelm(['install', release, chart, '-n', ns, '--set', 'image.tag=v1.4.2']);
    // A workload that says it is a release's, with no release behind it (a record Helm has lost, a copied manifest).
    const ghost = deployment('ghost', [{ name: 'app', image: acrImage('v1.4.2') }], { replicas: 1 });
    Object.assign(ghost.metadata, { annotations: { 'meta.helm.sh/release-name': 'ghost', 'meta.helm.sh/release-namespace': ns } });
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(ghost));
    const hooks = [
      upgradeHook('deploy', TOKEN),
      upgradeHook('no-field', TOKEN, { HELM_FIELD: 'image.version' }),
      upgradeHook('named', TOKEN, { HELM_RELEASE: 'missing' }),
      upgradeHook('auto', TOKEN, { HELM_RELEASE: 'auto' }),
      // A pod stuck 5 s fails the rollout (only pods of :broken images are ever stuck here).
      upgradeHook('rollback', TOKEN, { HELM_RELEASE: 'auto', ROLLBACK_ON_FAILURE: 'true', ROLLOUT_STUCK_TIMEOUT: '5s' }),
    ];
    wh = await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath }, args: ['-deliveries', '50'], metrics: true });
  });
  after(async () => {
    await wh?.stop();
    await kubectl(['delete', 'mutatingadmissionpolicybinding,mutatingadmissionpolicy', `webhook-test-crashloop-${ns}`, '--ignore-not-found']).catch(() => '');
    await removeNamespace(kubectl, ns);
  });

  test("a push writes the release's next revision as helm upgrade --reuse-values would; Helm's later upgrade keeps it, its rollback is held", async () => {
    const res = await push('deploy', 'deployment/web', 'v1.5.0');
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^action: +image updated; Helm release web revision 2$/m);
    assert.equal(await image('web'), acrImage('v1.5.0'));
    assert.equal((await values('web')).image.tag, 'v1.5.0');
    const revisions = await history('web');
    assert.deepEqual(revisions.map((r: any) => [r.revision, r.status, r.description]), [
      [1, 'superseded', 'Install complete'], [2, 'deployed', 'Upgrade complete'],
    ]);
    assert.equal(revisions[1].chart, 'shop-0.1.0');
    const manifest = await runHelm(['get', 'manifest', 'web', '-n', ns]);
    assert.match(manifest, new RegExp(`image: "?${acrImage('v1.5.0').replace(/[.]/g, '\\.')}"?$`, 'm'));

    // Helm's own upgrade with another value changed renders the pushed tag from the values it reuses.
    await runHelm(['upgrade', 'web', chart, '-n', ns, '--reuse-values', '--set', 'replicaCount=2']);
    const upgraded = await getJson('deployment/web');
    assert.equal(containerImage(upgraded, 'app'), acrImage('v1.5.0'));
    assert.equal(upgraded.spec.replicas, 2);

    // Helm's rollback to revision 1 sets the old image back: Helm's field manager wrote it, so the hold takes it
    // for a change made outside webhook, and a push not newer than what it replaced is held, writing no revision.
    await runHelm(['rollback', 'web', '1', '-n', ns]);
    assert.equal(await image('web'), acrImage('v1.4.2'));
    const held = await push('deploy', 'deployment/web', 'v1.5.0');
    assert.match(held.body, /^action: +none \(held: deployment\/web was set to \S+:v1\.4\.2 outside webhook by helm/m, held.body);
    assert.equal((await history('web')).length, 4);
    assert.equal(await image('web'), acrImage('v1.4.2'));
  });

  test('a values path the release lacks, or a release HELM_RELEASE names that has no record, is refused: nothing is written', async () => {
    const secrets = await releaseSecrets('other');
    const noField = await push('no-field', 'deployment/other', 'v1.6.0');
    assert.notEqual(noField.status, 200);
    assert.match(noField.body, /^result: +failed: Helm release other revision 1: HELM_FIELD image\.version: the values have no image\.version$/m, noField.body);
    const named = await push('named', 'deployment/other', 'v1.6.0');
    assert.match(named.body, new RegExp(`^result: +failed: Helm release missing of namespace ${ns} has no record \\(no Secret labelled owner=helm,name=missing\\)$`, 'm'), named.body);
    const auto = await push('auto', 'deployment/ghost', 'v1.6.0');
    assert.match(auto.body, /^result: +failed: Helm release ghost of namespace \S+ has no record/m, auto.body);
    assert.equal(await image('other'), acrImage('v1.4.2'));
    assert.equal(await image('ghost'), acrImage('v1.4.2'));
    assert.deepEqual(await releaseSecrets('other'), secrets);
    assert.equal((await values('other')).image.tag, 'v1.4.2');
  });

  test('HELM_RELEASE unset: a workload whose release cannot be written is patched alone, and the answer says why', async () => {
    const res = await push('deploy', 'deployment/ghost', 'v1.6.0');
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^action: +image updated$/m);
    assert.match(res.body, /Helm release ghost of namespace \S+ has no record \(no Secret labelled owner=helm,name=ghost\); the workload was patched alone/);
    assert.equal(await image('ghost'), acrImage('v1.6.0'));
  });

  test('ROLLBACK_ON_FAILURE: a failed rollout sets the workload back and rolls the release back as helm rollback would', async () => {
    await crashLoopInForce(kubectl, ns);
    const res = await push('rollback', 'deployment/api', 'broken1');
    assert.match(res.body, /^action: +image updated; Helm release api revision 2/m, res.body);
    const admin = await adminPort(wh);
    const done = await waitFor(async () => {
      const d = JSON.parse((await httpRequest(admin, '/deliveries.json')).body).deliveries.find((x: any) => x.request_id === res.headers['x-request-id']);
      return d?.state === 'done' ? d : undefined;
    }, { timeoutMs: 120_000, what: 'the failed rollout rolled back' });
    assert.match(done.report, /^rollback: +rolled back to \S+:v1\.4\.2: the rollout of \S+:broken1 failed/m, done.report);
    assert.match(done.report, /Helm release api rolled back to revision 1 as revision 3/);
    assert.deepEqual((await history('api')).map((r: any) => [r.revision, r.status, r.description]), [
      [1, 'superseded', 'Install complete'], [2, 'superseded', 'Upgrade complete'], [3, 'deployed', 'Rollback to 1'],
    ]);
    assert.equal((await values('api')).image.tag, 'v1.4.2');
    assert.equal(await image('api'), acrImage('v1.4.2'));
  });

  test('-validate -check-clusters asks for what Helm needs on the Secrets of a HELM_RELEASE hook\'s namespace', () => {
    const dir = makeTempDir('helm-check-');
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([fixedHook('released', { APP_NS: ns, HELM_RELEASE: 'auto' }), fixedHook('plain', { APP_NS: ns })]));
    const out = execFileSync(defaultBinary(), ['-validate', '-check-clusters', '-hooks', path.join(dir, 'hooks.json')],
      { encoding: 'utf8', env: { ...process.env, KUBECONFIG: cluster!.kubeconfigPath } });
    assert.match(out, /hook "released", cluster \(the default\): reachable \(\S+\); get and patch on deployments\.apps "web" in namespace "[^"]+", list, create, patch, delete on its namespace's secrets \(HELM_RELEASE\): allowed/);
    assert.match(out, /hook "plain", cluster \(the default\): reachable \(\S+\); get and patch on deployments\.apps "web" in namespace "[^"]+": allowed/);
  });
});
