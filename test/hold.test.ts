/*
 * A change made outside the service is respected (ON_OUTSIDE_CHANGE=hold): when a container's image is
 * not the one webhook last applied (its webhook/last-push record), managedFields say who set it and
 * when, and a push not strictly newer than the image replaced is held. Pure tables of the semver
 * comparison, of managedFields as the API server writes them and of the decision; then, through the
 * executable on the test cluster with ACR payloads, `kubectl set image` back to an old release holds the
 * release rolled back from, a newer one applies, follow keeps the old behaviour, and malformed
 * managedFields change nothing.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { adminPort, defaultBinary, httpRequest, makeTempDir, startWebhook, waitFor, type Webhook } from './harness.ts';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter,
  pushedState, removeNamespace,
} from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';
import {
  compareSemverTags, HOOK_SETTINGS, holdDecision, imageFieldPath, imageWriters, type IncomingPush, type PushRecord,
} from '../webhook.ts';

describe('compareSemverTags', () => {
  test("semver 2.0.0's precedence chain, with or without v; build metadata ignored", () => {
    // The semver chapter's numbers stop at Number.MAX_SAFE_INTEGER, as npm's do.
    const chain = ['1.0.0-alpha', '1.0.0-alpha.1', '1.0.0-alpha.beta', '1.0.0-beta', '1.0.0-beta.2', '1.0.0-beta.11',
      '1.0.0-rc.1', '1.0.0', '1.0.1', '1.1.0', '2.0.0', '2.1.0', '2.1.1', '10.0.0', '9007199254740991.0.0'];
    for (let i = 0; i < chain.length; i++)
      for (let j = 0; j < chain.length; j++)
        assert.equal(compareSemverTags(i % 2 ? `v${chain[i]}` : chain[i], chain[j]), Math.sign(i - j), `${chain[i]} vs ${chain[j]}`);
    assert.equal(compareSemverTags('v1.5.0', '1.5.0'), 0);
    assert.equal(compareSemverTags('1.5.0+build.7', 'v1.5.0+other'), 0);
  });
  test('tags that are not semantic versions compare as nothing', () => {
    for (const tag of ['latest', '1.4', 'v1', '01.2.3', '1.2.3-01', 'V1.2.3', '20240101', 'build-100', '1.2.3-', '', 'vv1.2.3'])
      assert.equal(compareSemverTags(tag, '1.0.0'), undefined, tag);
  });
});

// managedFields entries as the API server wrote them on the test cluster (kubectl 1.36): a Deployment
// created by `kubectl apply`, its status written by the controller, its image then set by `kubectl set image`.
const at = (time: string) => `2026-11-25T21:${time}Z`;
const appImage = { 'f:spec': { 'f:template': { 'f:spec': { 'f:containers': { 'k:{"name":"app"}': { 'f:image': {} } } } } } };
const created = {
  manager: 'kubectl-client-side-apply', operation: 'Update', apiVersion: 'apps/v1', time: at('00:11'), fieldsType: 'FieldsV1',
  fieldsV1: {
    'f:metadata': { 'f:annotations': { '.': {}, 'f:kubectl.kubernetes.io/last-applied-configuration': {} } },
    'f:spec': { 'f:replicas': {}, 'f:template': { 'f:spec': { 'f:containers': {
      'k:{"name":"app"}': { '.': {}, 'f:imagePullPolicy': {}, 'f:name': {} },
      'k:{"name":"side"}': { '.': {}, 'f:image': {}, 'f:imagePullPolicy': {}, 'f:name': {} },
    } } } },
  },
};
const status = {
  manager: 'kube-controller-manager', operation: 'Update', apiVersion: 'apps/v1', time: at('00:12'), fieldsType: 'FieldsV1',
  subresource: 'status', fieldsV1: { 'f:status': { 'f:replicas': {}, 'f:observedGeneration': {} } },
};
const setImage = { manager: 'kubectl-set', operation: 'Update', apiVersion: 'apps/v1', time: at('00:30'), fieldsType: 'FieldsV1', fieldsV1: appImage };
const applied = (manager: string, time: string) => ({ ...setImage, manager, operation: 'Apply', time: at(time) });
const PATH = imageFieldPath('deployment', 'containers', 'app');

describe('imageWriters: who owns a container image in managedFields', () => {
  test('the field paths of each kind and list', () => {
    assert.deepEqual(PATH, ['f:spec', 'f:template', 'f:spec', 'f:containers', 'k:{"name":"app"}', 'f:image']);
    assert.deepEqual(imageFieldPath('cronjob', 'initContainers', 'init'),
      ['f:spec', 'f:jobTemplate', 'f:spec', 'f:template', 'f:spec', 'f:initContainers', 'k:{"name":"init"}', 'f:image']);
  });
  const table: [string, unknown, string[]][] = [
    ['created by kubectl apply: the creator owns it', [created, status].map((e, i) => i ? e : {
      ...e, fieldsV1: { 'f:spec': { 'f:template': { 'f:spec': { 'f:containers': { 'k:{"name":"app"}': { 'f:image': {} } } } } } } }), ['kubectl-client-side-apply']],
    ['set by kubectl set image (the status subresource and another container do not count)', [created, status, setImage], ['kubectl-set']],
    ['server-side appliers sharing one value: each of them', [created, applied('helm', '00:20'), applied('kubectl', '00:40')], ['helm', 'kubectl']],
    ['a list key written with spaces', [{ ...setImage, fieldsV1: { 'f:spec': { 'f:template': { 'f:spec': { 'f:containers': { 'k:{ "name": "app" }': { 'f:image': {} } } } } } } }], ['kubectl-set']],
    ['no managedFields (not asked for, or cleared)', undefined, []],
    ['nobody owns it', [created, status], []],
  ];
  for (const [name, fields, managers] of table)
    test(name, () => {
      const found = imageWriters(fields, PATH);
      assert.ok('writers' in found, JSON.stringify(found));
      assert.deepEqual(found.writers.map((w) => w.manager), managers);
    });
  test('the writer keeps its operation, time and place', () => {
    assert.deepEqual(imageWriters([created, status, applied('argocd-controller', '00:50')], PATH),
      { writers: [{ manager: 'argocd-controller', operation: 'Apply', time: at('00:50'), index: 2 }] });
  });
  const malformed: [string, unknown, string][] = [
    ['not a list', { manager: 'x' }, 'metadata.managedFields is not a list'],
    ['an entry that is not an object', [created, 'kubectl-set'], 'metadata.managedFields[1] is not an object'],
    ['fieldsV1 that is not an object', [{ ...setImage, fieldsV1: 'f:image' }], 'metadata.managedFields[0].fieldsV1 is not an object'],
    ['an owner with no time', [created, { ...setImage, time: undefined }], 'metadata.managedFields[1] (manager "kubectl-set") owns the image but records no time'],
    ['an owner whose time is not a time', [{ ...setImage, time: 'yesterday' }], 'metadata.managedFields[0] (manager "kubectl-set").time "yesterday" is not a time'],
    ['an owner with no manager', [{ ...setImage, manager: '' }], 'metadata.managedFields[0] owns the image but names no manager'],
  ];
  for (const [name, fields, problem] of malformed)
    test(`malformed: ${name}`, () => assert.deepEqual(imageWriters(fields, PATH), { problem }));
});

describe('holdDecision', () => {
  const repo = 'registry.cn-hangzhou.aliyuncs.com/shop/web-api';
  const now = Date.parse(at('05:00'));
  const record = (over: Partial<PushRecord> = {}): PushRecord => ({
    pushedAt: at('00:20'), timeFrom: 'payload', image: `${repo}:v1.5.0`, push: 'sha256:aa|x', previous: `${repo}:v1.4.2`,
    appliedAt: at('00:21'), ...over,
  });
  const push = (tag: string, time = '01:00'): IncomingPush =>
    ({ pushedAtMs: Date.parse(at(time)), timeFrom: 'payload', image: tag.startsWith('@') ? `${repo}${tag}` : `${repo}:${tag}`, push: `sha256:bb|${time}` });
  const where = { workload: 'deployment/web', container: 'app', fieldPath: PATH };
  const decide = (r: PushRecord | undefined, running: string, fields: unknown, p: IncomingPush) =>
    holdDecision(r, `${repo}:${running}`, fields, p, now, where);
  const fields = [created, status, setImage];
  const held = (running: string, by: string, time: string, only: string) =>
    ({ kind: 'held', reason: `held: deployment/web was set to ${repo}:${running} outside webhook by ${by} at ${at(time)}; ${only}` });

  test('nothing changed outside: no record, the image the record applied, or after its rollback the image before', () => {
    assert.deepEqual(decide(undefined, 'v1.4.2', fields, push('v1.5.0')), { kind: 'none' });
    assert.deepEqual(decide(record(), 'v1.5.0', fields, push('v1.5.0')), { kind: 'none' });
    assert.deepEqual(holdDecision(record({ image: 'nginx:1' }), 'docker.io/library/nginx:1', fields, push('v1'), now, where), { kind: 'none' });
    // ROLLBACK_ON_FAILURE wrote the record (rolledBack) and set the image before: its own change holds nothing.
    assert.deepEqual(decide(record({ rolledBack: `${at('00:25')}: the rollout failed` }), 'v1.4.2', fields, push('v1.5.0')), { kind: 'none' });
    // The image owned by webhook's own field manager is webhook's change, whatever the record says.
    assert.deepEqual(decide(record(), 'v1.4.2', [created, { ...setImage, manager: 'webhook' }], push('v1.5.0')), { kind: 'none' });
  });

  test('set back by kubectl: the release rolled back from, and anything not newer, is held; a newer one ends the hold', () => {
    const only = `only a push newer than ${repo}:v1.5.0 is applied`;
    for (const tag of ['v1.5.0', '1.5.0', 'v1.4.2', 'v1.4.9', 'v1.5.0-rc.2', 'v0.9.0'])
      assert.deepEqual(decide(record(), 'v1.4.2', fields, push(tag)), held('v1.4.2', 'kubectl-set (kubectl set)', '00:30', only), tag);
    for (const tag of ['v1.5.1', 'v1.5.1-rc.1', '2.0.0'])
      assert.deepEqual(decide(record(), 'v1.4.2', fields, push(tag)), {
        kind: 'newer',
        note: `deployment/web was set to ${repo}:v1.4.2 outside webhook by kubectl-set (kubectl set) at ${at('00:30')}; ` +
          `${repo}:${tag} is newer than ${repo}:v1.5.0, so it is applied and ends the hold`,
      }, tag);
  });

  test('tags that are not versions, or a push by digest: a push pushed after the change applies', () => {
    const r = record({ image: `${repo}:build-100`, previous: `${repo}:build-099` });
    const before = push('build-100', '00:29');
    assert.deepEqual(decide(r, 'build-099', fields, before), held('build-099', 'kubectl-set (kubectl set)', '00:30',
      `only a push pushed after that is applied (this one was pushed at ${new Date(before.pushedAtMs).toISOString()})`));
    assert.equal(decide(r, 'build-099', fields, push('build-100', '00:31')).kind, 'newer');
    assert.equal(decide(record(), 'v1.4.2', fields, push('@sha256:' + 'c'.repeat(64), '00:29')).kind, 'held');
    assert.match((decide(record(), 'v1.4.2', fields, push('nightly', '00:31')) as { note: string }).note, /nightly was pushed after that \(\S+\), so it is applied/);
  });

  test('an image set outside newer than the one replaced is the one a push must beat', () => {
    const only = `only a push newer than ${repo}:v1.6.0 is applied`;
    assert.deepEqual(decide(record(), 'v1.6.0', fields, push('v1.5.1')), held('v1.6.0', 'kubectl-set (kubectl set)', '00:30', only));
    assert.equal(decide(record(), 'v1.6.0', fields, push('v1.6.1')).kind, 'newer');
  });

  test('who: the latest of several owners, each tool by the name it records', () => {
    const shared = [created, status, applied('helm', '00:20'), applied('kubectl', '00:40')];
    assert.deepEqual(decide(record(), 'v1.4.2', shared, push('v1.5.0')), held('v1.4.2',
      'kubectl (kubectl rollout undo, apply --server-side or another kubectl call)', '00:40', `only a push newer than ${repo}:v1.5.0 is applied`));
    for (const [manager, shown] of [['helm', 'helm (Helm)'], ['argocd-controller', 'argocd-controller (Argo CD)'], ['rancher', 'rancher (Rancher)'], ['kubectl-edit', 'kubectl-edit (kubectl edit)'], ['kubectl-client-side-apply', 'kubectl-client-side-apply (kubectl apply)'], ['my-operator', 'my-operator']])
      assert.match((decide(record(), 'v1.4.2', [{ ...setImage, manager }], push('v1.5.0')) as { reason: string }).reason, new RegExp(` by ${shown.replace(/[()]/g, '\\$&')} at `));
  });

  test('managedFields that cannot say who or when: not applied, and the message says why and what to do', () => {
    const why = (fields: unknown) => {
      const d = decide(record(), 'v1.4.2', fields, push('v1.5.1'));
      assert.equal(d.kind, 'malformed');
      return (d as { message: string }).message;
    };
    assert.equal(why([{ ...setImage, time: undefined }]),
      `deployment/web: container app runs ${repo}:v1.4.2, not ${repo}:v1.5.0 as webhook last set it, and ` +
      'metadata.managedFields[0] (manager "kubectl-set") owns the image but records no time: who changed it outside webhook, ' +
      'and when, is not known, so the push is not applied (ON_OUTSIDE_CHANGE=follow deploys it anyway); nothing was changed');
    assert.match(why([created, status]), /, and metadata\.managedFields names no owner of its image: /);
    assert.match(why('garbage'), /, and metadata\.managedFields is not a list: /);
    assert.match(why([{ ...setImage, time: '2099-01-01T00:00:00Z' }]), /, and metadata\.managedFields\[0\]\.time 2099-01-01T00:00:00Z is in the future: /);
    // Nothing changed outside: managedFields are not even read.
    assert.deepEqual(decide(record(), 'v1.5.0', 'garbage', push('v1.5.1')), { kind: 'none' });
  });

  test('ON_OUTSIDE_CHANGE: hold by default, or follow, any case; anything else names the setting', () => {
    const parse = HOOK_SETTINGS.ON_OUTSIDE_CHANGE.parse;
    assert.deepEqual([parse(undefined), parse(' '), parse('HOLD'), parse('Follow')], ['hold', 'hold', 'hold', 'follow']);
    assert.throws(() => parse('ignore'), { message: 'ON_OUTSIDE_CHANGE "ignore" is not hold or follow' });
    assert.equal(HOOK_SETTINGS.ON_OUTSIDE_CHANGE.fixed, true, 'follow would let a request override a person');
  });
});

describe('-validate shows what a hook does with a change made outside webhook', () => {
  test('unset: held; follow: followed; a bad value refused at load', () => {
    const dir = makeTempDir('webhook-hold-validate-');
    const file = path.join(dir, 'hooks.json');
    const run = (hooks: object[]) => {
      fs.writeFileSync(file, JSON.stringify(hooks));
      return spawnSync(defaultBinary(), ['-validate', '-hooks', file], { encoding: 'utf8', env: { PATH: process.env.PATH } });
    };
    const ok = run([upgradeHook('held', 't'), upgradeHook('followed', 't', { ON_OUTSIDE_CHANGE: 'follow' })]);
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stdout, /^ {15}outside changes: held \(ON_OUTSIDE_CHANGE unset\): once the image is changed outside webhook, only a newer push is applied$/m);
    assert.match(ok.stdout, /^ {15}outside changes: followed \(ON_OUTSIDE_CHANGE=follow\): every push is applied, whoever changed the image$/m);
    assert.match(ok.stdout, /^ {15}ON_OUTSIDE_CHANGE \(hold or follow; unset: hold; fixed in the file\): /m);
    const bad = run([upgradeHook('bad', 't', { ON_OUTSIDE_CHANGE: 'sometimes' })]);
    assert.equal(bad.status, 1);
    assert.match(bad.stderr, /hook "bad": .*ON_OUTSIDE_CHANGE "sometimes" is not hold or follow/);
  });
});

const cluster = await clusterOrSkip();

describe('a change made outside webhook, through the executable and the cluster', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('hold');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  const TOKEN = 'hold-token-4f1c9e2a';
  let wh: Webhook;
  const push = (hook: string, workload: string, body: string, replica = wh) =>
    replica.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
    });
  const image = async (name: string) => containerImage(await getJson(`deployment/${name}`), 'app');
  const re = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const hooks = [upgradeHook('deploy', TOKEN), upgradeHook('follow', TOKEN, { ON_OUTSIDE_CHANGE: 'follow' })];

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    const items = ['web', 'free', 'odd'].map((name) => deployment(name, [{ name: 'app', image: acrImage('v1.4.2') }], { replicas: 1 }));
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
    wh = await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath }, metrics: true });
  });
  after(async () => {
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('set back by kubectl set image: the release rolled back from is held (answer, Event, record, page, a second replica); a newer one applies', async () => {
    const first = await push('deploy', 'deployment/web', acrPayload('v1.5.0'));
    assert.match(first.body, /^action: +image updated$/m, first.body);
    await kubectl(['-n', ns, 'set', 'image', 'deployment/web', `app=${acrImage('v1.4.2')}`]);
    const before = pushedState(await getJson('deployment/web'));

    const again = await push('deploy', 'deployment/web', acrPayload('v1.5.0'));
    assert.equal(again.status, 200, again.body);
    const heldAction = new RegExp(`^action: +none \\(held: deployment/web was set to ${re(acrImage('v1.4.2'))} outside webhook by ` +
      `kubectl-set \\(kubectl set\\) at \\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ; only a push newer than ${re(acrImage('v1.5.0'))} is applied\\)$`, 'm');
    assert.match(again.body, heldAction);
    assert.match(again.body, /^result: +ok$/m);
    assert.equal(pushedState(await getJson('deployment/web')), before, 'neither the image nor the record changed');
    const older = await push('deploy', 'deployment/web', acrPayload('v1.4.9'));
    assert.match(older.body, /^action: +none \(held: /m, older.body);

    const events = (await getJson('events')).items.filter((e: any) => e.involvedObject.name === 'web' && e.reason === 'UpgradeHeld');
    assert.equal(events.length, 2);
    assert.deepEqual(events.map((e: any) => e.type), ['Warning', 'Warning']);
    const message = new RegExp(`^container app: ${re(acrImage('v1.5.0'))} held: deployment/web was set to .* by kubectl-set .*; ` +
      `asked by hook "deploy", request ${again.headers['x-request-id']}$`);
    assert.ok(events.some((e: any) => message.test(e.message)), JSON.stringify(events.map((e: any) => e.message)));

    const admin = await adminPort(wh);
    const page = JSON.parse((await httpRequest(admin, '/deliveries.json')).body);
    const shown = page.deliveries.find((d: any) => d.request_id === again.headers['x-request-id']);
    assert.equal(shown.decision, 'held');
    assert.match(shown.detail, /^held: deployment\/web was set to \S+:v1\.4\.2 outside webhook by kubectl-set/);

    // A second replica reads the same workload and holds the same push.
    const replica = await startWebhook({ hooks, env: { KUBECONFIG: cluster!.kubeconfigPath } });
    try {
      assert.match((await push('deploy', 'deployment/web', acrPayload('v1.5.0'), replica)).body, heldAction);
    } finally {
      await replica.stop();
    }

    const newer = await push('deploy', 'deployment/web', acrPayload('v1.5.1'));
    assert.match(newer.body, /^action: +image updated$/m, newer.body);
    assert.match(newer.body, new RegExp(`^note: +deployment/web was set to \\S+:v1\\.4\\.2 outside webhook by kubectl-set .*; ${re(acrImage('v1.5.1'))} is newer than \\S+:v1\\.5\\.0, so it is applied and ends the hold$`, 'm'));
    assert.equal(await image('web'), acrImage('v1.5.1'));
    assert.equal(JSON.parse((await getJson('deployment/web')).metadata.annotations['webhook/last-push']).app.image, acrImage('v1.5.1'));
    // The hold ended: the next push is decided as before (newest wins).
    assert.match((await push('deploy', 'deployment/web', acrPayload('v1.5.2'))).body, /^action: +image updated$/m);
  });

  test('ON_OUTSIDE_CHANGE=follow keeps the old behaviour: the next push applies whoever changed the image', async () => {
    assert.match((await push('follow', 'deployment/free', acrPayload('v1.5.0'))).body, /^action: +image updated$/m);
    await kubectl(['-n', ns, 'set', 'image', 'deployment/free', `app=${acrImage('v1.4.2')}`]);
    const again = await push('follow', 'deployment/free', acrPayload('v1.5.0'));
    assert.match(again.body, /^action: +image updated$/m, again.body);
    assert.equal(await image('free'), acrImage('v1.5.0'));
  });

  test('managedFields that cannot say who changed the image: a clear failure, nothing changed', async () => {
    assert.match((await push('deploy', 'deployment/odd', acrPayload('v1.5.0'))).body, /^action: +image updated$/m);
    await kubectl(['-n', ns, 'set', 'image', 'deployment/odd', `app=${acrImage('v1.4.2')}`]);
    // The API server keeps an entry whose time was taken off by hand. The entries are addressed by index, and the
    // Deployment's controller writes its own as the rollout goes on (which may move them): the patch tests that the
    // index still holds kubectl-set's entry, and is made again on the workload as read again until it holds.
    const setBy = async () => {
      const d = JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/odd', '-o', 'json', '--show-managed-fields']));
      const entries = d.metadata.managedFields as any[];
      const index = entries.findIndex((f) => f.manager === 'kubectl-set');
      return { index, timed: entries[index]?.time !== undefined };
    };
    await waitFor(async () => {
      const { index, timed } = await setBy();
      if (!timed) return true;
      const remove = [{ op: 'test', path: `/metadata/managedFields/${index}/manager`, value: 'kubectl-set' },
        { op: 'remove', path: `/metadata/managedFields/${index}/time` }];
      await kubectl(['-n', ns, 'patch', 'deployment/odd', '--type=json', '-p', JSON.stringify(remove)]).catch(() => undefined);
      return !(await setBy()).timed;
    }, { timeoutMs: 30_000, what: 'kubectl-set\'s managedFields entry without its time' });
    const before = pushedState(await getJson('deployment/odd'));
    const res = await push('deploy', 'deployment/odd', acrPayload('v1.6.0'));
    assert.equal(res.status, 500, res.body);
    assert.match(res.body, new RegExp(`^result: +failed: deployment/odd: container app runs ${re(acrImage('v1.4.2'))}, not ${re(acrImage('v1.5.0'))} as webhook ` +
      'last set it, and metadata\\.managedFields\\[\\d+\\] \\(manager "kubectl-set"\\) owns the image but records no time: who changed it ' +
      'outside webhook, and when, is not known, so the push is not applied \\(ON_OUTSIDE_CHANGE=follow deploys it anyway\\); nothing was changed$', 'm'));
    assert.equal(pushedState(await getJson('deployment/odd')), before);
    const events = (await getJson('events')).items.filter((e: any) => e.involvedObject.name === 'odd' && e.reason === 'UpgradeFailed');
    assert.match(events.at(-1).message, /records no time: .*; asked by hook "deploy"/);
  });
});
