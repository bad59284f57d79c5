/*
 * ROLLBACK_ON_FAILURE on the real test cluster, through the built executable and a real MTA.
 *
 * A pushed image must make its pods fail. kwok fakes pods, so an image cannot really crash; the
 * test cluster's kwok stage (cluster/unready-stage.yaml) makes any pod labelled
 * webhook-test/unready=true run in CrashLoopBackOff. A MutatingAdmissionPolicy (a built-in
 * Kubernetes feature, no webhook server), created by this file for its own namespace only, puts
 * that label on every pod whose image has a tag starting "broken" as the pod is created. So a push
 * of `…:broken1` crash-loops exactly as a broken build would, and the image before it does not.
 * (The stage file is not changed: the shared cluster would be recreated for every other user.)
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { defaultBinary, makeTempDir, startWebhook, type Webhook } from './harness.ts';
import { readMail, serviceMailEnv, startMta, type Mta } from './mta.ts';
import {
  accountKubeconfig, acrImage, acrPayload, clusterOrSkip, containerImage, crashLoopInForce, cronJob, daemonSet, deployment, freshNamespaceName,
  kubectlFor, namespacedGetter, removeNamespace, statefulSet, type Kubectl,
} from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';
import { KubeClient, loadKubeconfig, rollBackFailedRollout, runUpgrade } from '../webhook.ts';

const TOKEN = 'rollback-token-77d0e2';
// A pod stuck 5 s fails the rollout (ROLLOUT_STUCK_TIMEOUT; 30 s by default): only kwok's crash-looping pods (of
// :broken images) are ever stuck here, so the tests wait for their failure, seen at the follow's next look at the
// pods (every 5 s), not for the default.
const STUCK = { ROLLOUT_STUCK_TIMEOUT: '5s' };
const cluster = await clusterOrSkip();

describe('a failed rollout, with and without ROLLBACK_ON_FAILURE', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('rollback');
  const policy = `webhook-test-crashloop-${ns}`;
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  let mta: Mta;
  let wh: Webhook;
  const push = (hook: string, workload: string, body: string) =>
    wh.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
    });

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await crashLoopInForce(kubectl, ns);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      deployment('guarded', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }),
      deployment('plain', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }),
      deployment('raced', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }),
      daemonSet('agent', [{ name: 'app', image: acrImage('v1') }]),
      deployment('synced', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }),
      cronJob('nightly', [{ name: 'app', image: acrImage('v1') }]),
    ] }));
    for (const w of ['deployment/guarded', 'deployment/plain', 'deployment/raced', 'deployment/synced', 'daemonset/agent']) await kubectl(['-n', ns, 'rollout', 'status', w, '--timeout=90s']);
    mta = await startMta();
    wh = await startWebhook({
      hooks: [
        upgradeHook('guarded', TOKEN, { ROLLBACK_ON_FAILURE: 'true', MAIL_TO: 'guarded@example.com', ...STUCK }),
        upgradeHook('plain', TOKEN, { MAIL_TO: 'plain@example.com', ...STUCK }),
      ],
      env: {
        KUBECONFIG: cluster!.kubeconfigPath,
        ...serviceMailEnv(mta),
      },
    });
  });
  after(async () => {
    await wh?.stop();
    await mta?.stop();
    await kubectl(['delete', 'mutatingadmissionpolicybinding,mutatingadmissionpolicy', policy, '--ignore-not-found']).catch(() => '');
    await removeNamespace(kubectl, ns);
  });

  test('a crash-looping push: rolled back with the setting (mail, log, Event say so), left in place without it', async () => {
    const broken = acrPayload('broken1');
    // With ROLLOUT_TIMEOUT the answer itself waits for the rollout, and so for the rollback.
    const syncEnv = { APP_NS: ns, APP_WORKLOAD: 'deployment/synced', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', ROLLOUT_TIMEOUT: '3m', ROLLBACK_ON_FAILURE: 'true', KUBECONFIG: cluster!.kubeconfigPath, ...STUCK };
    const [guarded, plain, agent, synced] = await Promise.all([
      push('guarded', 'deployment/guarded', broken), push('plain', 'deployment/plain', acrPayload('broken1')), push('guarded', 'daemonset/agent', acrPayload('broken1')),
      runUpgrade([acrPayload('broken1')], syncEnv),
    ]);
    assert.equal(synced.exitCode, 1, synced.output);
    assert.match(synced.output, /^action: +image updated, then rolled back to \S+:v1$/m);
    assert.match(synced.output, /^result: +failed: the rollout failed \(see rollout\)$/m);
    assert.match(synced.output, /^rollout: +failed: pods not ready: synced-\S+ CrashLoopBackOff \(stuck for \d+s\)$/m);
    // ROLLOUT_STUCK_TIMEOUT=5s, not the 30 s default: failed after 5 s stuck, at the look after.
    const stuck = Number(/stuck for (\d+)s/.exec(synced.output)![1]);
    assert.ok(stuck >= 5 && stuck < 30, synced.output);
    assert.match(synced.output, /^rollback: +rolled back to \S+:v1: the rollout of \S+:broken1 failed: .*; its rollout complete/m);
    assert.equal(containerImage(await getJson('deployment/synced'), 'app'), acrImage('v1'));
    for (const res of [guarded, plain, agent]) {
      assert.equal(res.status, 200, res.body);
      assert.match(res.body, /^action: +image updated$/m);
    }
    const mails = (await mta.waitForMessages(3, 180_000)).map(readMail);
    const rolled = mails.find((m) => m.subject.includes('deployment/guarded'))!;
    const stayed = mails.find((m) => m.to.includes('plain@'))!;
    const daemons = mails.find((m) => m.subject.includes('daemonset/agent'))!;
    assert.equal(rolled.subject, `Webhooks通知: ${ns}-deployment/guarded-app 更新结果: failed`);
    assert.match(rolled.body, new RegExp(`^outcome: failed \\(image updated, then rolled back to ${acrImage('v1').replace(/\./g, '\\.')}\\)$`, 'm'));
    assert.match(rolled.body, /^rollout: +failed: pods not ready: guarded-\S+ CrashLoopBackOff \(stuck for \d+s\)$/m);
    assert.match(rolled.body, /^pod guarded-\S+: Running, not ready, image \S+:broken1, restarts \d+, CrashLoopBackOff; last exit 1 \(Error\)$/m);
    assert.match(rolled.body, new RegExp(`^rollback: +rolled back to ${acrImage('v1').replace(/\./g, '\\.')}: the rollout of \\S+:broken1 failed: pods not ready: .*CrashLoopBackOff.*; its rollout complete`, 'm'));
    assert.equal(containerImage(await getJson('deployment/guarded'), 'app'), acrImage('v1'));
    const record = JSON.parse((await getJson('deployment/guarded')).metadata.annotations['webhook/last-push']).app;
    assert.match(record.rolledBack, /the rollout of \S+:broken1 failed/);
    const events = (await getJson('events')).items.filter((e: any) => e.involvedObject.name === 'guarded' && e.reason === 'RolledBack');
    assert.equal(events.length, 1);
    assert.match(events[0].message, new RegExp(`^container app: rolled back to ${acrImage('v1').replace(/\./g, '\\.')}: the rollout of \\S+:broken1 failed: pods not ready: .*CrashLoopBackOff`));
    assert.match(wh.output(), new RegExp(`deployment/guarded in ${ns}: rollout failed: .*; rolled back to `));

    assert.equal(stayed.subject, `Webhooks通知: ${ns}-deployment/plain-app 更新结果: failed`);
    assert.match(stayed.body, /^outcome: failed \(image updated\)$/m);
    assert.match(stayed.body, /^rollout: +failed: pods not ready: plain-\S+ CrashLoopBackOff/m);
    assert.doesNotMatch(stayed.body, /rolled back/);
    assert.equal(containerImage(await getJson('deployment/plain'), 'app'), acrImage('broken1'));
    // A DaemonSet is rolled back the same way.
    assert.equal(daemons.subject, `Webhooks通知: ${ns}-daemonset/agent-app 更新结果: failed`);
    assert.match(daemons.body, /^rollout: +failed: pods not ready: agent-\S+ CrashLoopBackOff/m);
    assert.match(daemons.body, new RegExp(`^rollback: +rolled back to ${acrImage('v1').replace(/\./g, '\\.')}: .*; its rollout complete`, 'm'));
    assert.equal(containerImage(await getJson('daemonset/agent'), 'app'), acrImage('v1'));

    // The broken push delivered again is a repeat: it is not applied a second time.
    const again = await push('guarded', 'deployment/guarded', broken);
    assert.match(again.body, /^action: +none \(the same push was applied \S+ ago and rolled back: a repeated notification\)$/m);
    assert.equal(containerImage(await getJson('deployment/guarded'), 'app'), acrImage('v1'));
    await mta.clear();
  });

  test('a rollback never overrides a newer push applied meanwhile', async () => {
    const client = new KubeClient(loadKubeconfig(cluster!.kubeconfigPath));
    try {
      const env = { APP_NS: ns, APP_WORKLOAD: 'deployment/raced', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', ROLLBACK_ON_FAILURE: 'true' };
      const first = await runUpgrade([acrPayload('broken2')], env, { client, requestId: 'r1' });
      assert.equal(first.exitCode, 0, first.output);
      const newer = await runUpgrade([acrPayload('v3')], env, { client, requestId: 'r2' });
      assert.match(newer.output, /^action: +image updated$/m);
      // The first push's rollout is then found failed (as a follow would report it).
      const report = { ...first.report, rollout: { state: 'failed' as const, detail: 'pods not ready: raced-x CrashLoopBackOff', pods: [] } };
      const back = await rollBackFailedRollout(client, first.report.target!, report, 0, { requestId: 'r1' });
      assert.equal(back.image, undefined, 'nothing was set back');
      assert.match(back.rollback.notDone ?? '', new RegExp(`^a newer push \\(${acrImage('v3').replace(/\./g, '\\.')}, pushed at \\S+\\) was applied meanwhile$`));
      assert.equal(containerImage(await getJson('deployment/raced'), 'app'), acrImage('v3'));
    } finally {
      client.close();
    }
  });

  test('a CronJob has no rollout: the answer says nothing will be rolled back', async () => {
    const res = await push('guarded', 'cronjob/nightly', acrPayload('v2'));
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /^note: +ROLLBACK_ON_FAILURE: a cronjob has no rollout that could fail, so none is rolled back$/m);
  });

  test('a malformed ROLLBACK_ON_FAILURE fails the push and changes nothing', async () => {
    const before = containerImage(await getJson('deployment/plain'), 'app');
    const res = await runUpgrade([acrPayload('v9')], { APP_NS: ns, APP_WORKLOAD: 'deployment/plain', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', ROLLBACK_ON_FAILURE: 'sometimes', KUBECONFIG: cluster!.kubeconfigPath });
    assert.equal(res.exitCode, 1);
    assert.match(res.output, /^result: +failed: ROLLBACK_ON_FAILURE "sometimes" is not a boolean \(true or false\)$/m);
    assert.equal(containerImage(await getJson('deployment/plain'), 'app'), before);
  });

  test('forged follow and last-push records: a resumed follow\'s rollback refuses an image outside the image pin', async () => {
    // A crash-looping workload whose records (written by anyone who may edit it) name an image elsewhere as "before".
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('forged', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    await kubectl(['-n', ns, 'rollout', 'status', 'deployment/forged', '--timeout=90s']);
    await kubectl(['-n', ns, 'set', 'image', 'deployment/forged', `app=${acrImage('broken5')}`]);
    const evil = 'evil.example/attacker/miner:latest';
    const now = new Date().toISOString();
    const follow = { app: { request: 'forged-rb', hook: 'pinned', deadline: new Date(Date.now() + 120_000).toISOString(), mailTo: 'attacker@evil.example' } };
    const lastPush = { app: { pushedAt: now, timeFrom: 'received', image: acrImage('broken5'), push: '|', previous: evil, appliedAt: now, request: 'forged-rb' } };
    await kubectl(['-n', ns, 'annotate', '--overwrite', 'deployment/forged', `webhook/follow=${JSON.stringify(follow)}`, `webhook/last-push=${JSON.stringify(lastPush)}`]);
    const hook = upgradeHook('pinned', TOKEN, { ROLLBACK_ON_FAILURE: 'true', MAIL_TO: 'pinned@example.com', ...STUCK }) as Record<string, unknown>;
    const rule = (name: string, value: string) => ({ match: { type: 'value', value, parameter: { source: 'url', name } } });
    hook['trigger-rule'] = { and: [rule('token', TOKEN), rule('ns', ns), rule('workload', 'deployment/forged'), rule('container', 'app')] };
    await mta.clear();
    const resumer = await startWebhook({
      hooks: [hook],
      env: { KUBECONFIG: cluster!.kubeconfigPath, ...serviceMailEnv(mta) },
    });
    try {
      const [raw] = await mta.waitForMessages(1, 180_000);
      const mail = readMail(raw);
      assert.ok(mail.to.includes('pinned@example.com') && !mail.to.includes('attacker'), mail.to);
      assert.match(mail.body, /^rollout: +failed: /m);
      assert.match(mail.body, /^rollback: +not rolled back: the image before the push is refused by the image pin: /m);
      const d = await getJson('deployment/forged');
      assert.equal(containerImage(d, 'app'), acrImage('broken5'), 'the container was not set to the forged image');
      assert.doesNotMatch(resumer.output(), /rolled back to evil/);
    } finally {
      await resumer.stop();
    }
  });
});

/** `webhook -print-rbac` (the built executable) for these hooks: its YAML. */
function printRbac(hooks: object[], serviceAccount: string): Promise<string> {
  const dir = makeTempDir('webhook-rbac-');
  fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify(hooks));
  return new Promise((resolve, reject) => {
    execFile(defaultBinary(), ['-print-rbac', '-hooks', path.join(dir, 'hooks.json'), '-rbac-service-account', serviceAccount], (error, stdout, stderr) => {
      if (error) reject(new Error(`webhook -print-rbac: ${stderr || error.message}`));
      else resolve(stdout);
    });
  });
}

/** The rules of the Role in a -print-rbac output, as kubectl parses them. */
async function roleRules(kubectl: Kubectl, yaml: string): Promise<any[]> {
  const parsed = await kubectl(['create', '--dry-run=client', '-o', 'json', '-f', '-'], yaml);
  const items: any[] = JSON.parse(`[${parsed.trim().replace(/\n}\n{/g, '\n},\n{')}]`);
  return items.filter((i) => i.kind === 'Role').flatMap((r) => r.rules);
}

describe('a StatefulSet: the forced rollback deletes the stuck pods', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('rollback-sts');
  const policy = `webhook-test-crashloop-${ns}`;
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  const dir = makeTempDir('webhook-sts-');
  // Both hooks fix namespace, workload and ROLLBACK_ON_FAILURE in the file, as -print-rbac covers them.
  const fixed = (name: string, rollback: boolean) => upgradeHook(name, TOKEN, {
    APP_NS: ns, APP_WORKLOAD: `statefulset/${name}`, MAIL_TO: `${name}@example.com`, ...STUCK, ...(rollback ? { ROLLBACK_ON_FAILURE: 'true' } : {}),
  });
  let mta: Mta;
  const webhooks: Webhook[] = [];
  const push = (wh: Webhook, name: string, body: string) =>
    wh.request(`/hooks/${name}?${new URLSearchParams({ token: TOKEN, ns, workload: `statefulset/${name}`, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
    });
  /** A ServiceAccount bound to the Role -print-rbac printed, and a kubeconfig with its token. */
  const serviceAccount = async (name: string, rbac: string) => {
    await kubectl(['-n', ns, 'create', 'serviceaccount', name]);
    await kubectl(['apply', '-f', '-'], rbac);
    return accountKubeconfig(kubectl, cluster!, ns, name, path.join(dir, `${name}.json`), '30m');
  };
  let withDelete = '';
  let withoutDelete = '';

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await crashLoopInForce(kubectl, ns);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      statefulSet('db', 2, [{ name: 'app', image: acrImage('v1') }]),
      statefulSet('store', 2, [{ name: 'app', image: acrImage('v1') }]),
    ] }));
    for (const w of ['statefulset/db', 'statefulset/store']) await kubectl(['-n', ns, 'rollout', 'status', w, '--timeout=120s']);
    // The account of "db" holds what -print-rbac prints for its hook (ROLLBACK_ON_FAILURE=true);
    // the account of "store" what it prints for the same hook without the setting: no delete on pods.
    withDelete = await printRbac([fixed('db', true)], `${ns}/webhook`);
    withoutDelete = await printRbac([fixed('store', false)], `${ns}/nodelete`);
    const accounts = { webhook: await serviceAccount('webhook', withDelete), nodelete: await serviceAccount('nodelete', withoutDelete) };
    mta = await startMta();
    const mailEnv = serviceMailEnv(mta);
    webhooks.push(await startWebhook({ hooks: [fixed('db', true)], env: { KUBECONFIG: accounts.webhook, ...mailEnv } }));
    webhooks.push(await startWebhook({ hooks: [fixed('store', true)], env: { KUBECONFIG: accounts.nodelete, ...mailEnv } }));
  });
  after(async () => {
    for (const wh of webhooks) await wh.stop();
    await mta?.stop();
    await kubectl(['delete', 'mutatingadmissionpolicybinding,mutatingadmissionpolicy', policy, '--ignore-not-found']).catch(() => '');
    await removeNamespace(kubectl, ns);
  });

  test('-print-rbac grants delete on pods only for a StatefulSet hook that fixes ROLLBACK_ON_FAILURE=true', async () => {
    const podVerbs = async (yaml: string) => (await roleRules(kubectl, yaml)).find((r) => r.resources.includes('pods'))?.verbs;
    assert.deepEqual(await podVerbs(withDelete), ['list', 'watch', 'delete']);
    assert.match(withDelete, /^#   hook "db": statefulset\/db in namespace \S+, delete on its stuck pods \(ROLLBACK_ON_FAILURE: forced rollback\)$/m);
    assert.deepEqual(await podVerbs(withoutDelete), ['list', 'watch']);
    // A Deployment with the setting is rolled back without deleting pods: no delete either.
    const deploymentHook = upgradeHook('web', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'deployment/web', ROLLBACK_ON_FAILURE: 'true' });
    assert.deepEqual(await podVerbs(await printRbac([deploymentHook], `${ns}/webhook`)), ['list', 'watch']);
    // The setting from the URL is not fixed in the file: no delete.
    const fromUrl = upgradeHook('db', TOKEN, { APP_NS: ns, APP_WORKLOAD: 'statefulset/db' }) as any;
    fromUrl['pass-environment-to-command'].push({ envname: 'ROLLBACK_ON_FAILURE', source: 'url', name: 'rollback' });
    assert.deepEqual(await podVerbs(await printRbac([fromUrl], `${ns}/webhook`)), ['list', 'watch']);
    // One such hook in a namespace is enough, and only that namespace gets it.
    const both = await printRbac([fixed('db', true), upgradeHook('web', TOKEN, { APP_NS: 'other', APP_WORKLOAD: 'statefulset/web' })], `${ns}/webhook`);
    const roles = both.split('---\n').filter((d) => d.startsWith('apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n'));
    assert.equal(roles.length, 2);
    assert.match(roles.find((r) => r.includes(`namespace: "${ns}"`))!, /resources: \["pods"\]\n    verbs: \["list", "watch", "delete"\]/);
    assert.match(roles.find((r) => r.includes('namespace: "other"'))!, /resources: \["pods"\]\n    verbs: \["list", "watch"\]\n/);
  });

  test('a crash-looping push: set back, the stuck pods deleted, all replicas ready again; without delete, the mail names them', async () => {
    const [db, store] = webhooks;
    const [dbRes, storeRes] = await Promise.all([push(db, 'db', acrPayload('broken1')), push(store, 'store', acrPayload('broken1'))]);
    for (const res of [dbRes, storeRes]) {
      assert.equal(res.status, 200, res.body);
      assert.match(res.body, /^action: +image updated$/m);
    }
    const mails = (await mta.waitForMessages(2, 300_000)).map(readMail);
    const v1 = acrImage('v1').replace(/\./g, '\\.');

    const dbMail = mails.find((m) => m.to.includes('db@'))!;
    assert.equal(dbMail.subject, `Webhooks通知: ${ns}-statefulset/db-app 更新结果: failed`);
    assert.match(dbMail.body, new RegExp(`^outcome: failed \\(image updated, then rolled back to ${v1}\\)$`, 'm'));
    assert.match(dbMail.body, /^rollout: +failed: pods not ready: db-1 CrashLoopBackOff \(stuck for \d+s\)$/m);
    assert.match(dbMail.body, new RegExp(`^rollback: +rolled back to ${v1}: the rollout of \\S+:broken1 failed: .*; deleted the stuck pods db-1 for the StatefulSet's forced rollback; its rollout complete`, 'm'));
    const sts = await getJson('statefulset/db');
    assert.equal(containerImage(sts, 'app'), acrImage('v1'));
    // Really rolled out: every replica ready, on the revision the template was set back to.
    assert.equal(sts.status.readyReplicas, 2);
    assert.equal(sts.status.updateRevision, sts.status.currentRevision);
    const pods = (await getJson('pods')).items.filter((p: any) => p.metadata.name.startsWith('db-'));
    assert.deepEqual(pods.map((p: any) => [p.metadata.name, p.spec.containers[0].image]).sort(), [['db-0', acrImage('v1')], ['db-1', acrImage('v1')]]);
    const events = (await getJson('events')).items.filter((e: any) => e.involvedObject.name === 'db' && e.reason === 'RolledBack');
    assert.equal(events.length, 1);
    assert.match(events[0].message, /; deleted the stuck pods db-1 for the StatefulSet's forced rollback; /);
    assert.match(db.output(), new RegExp(`statefulset/db in ${ns}: rollout failed: .*; rolled back to ${v1}: .*; deleted the stuck pods db-1 for the StatefulSet's forced rollback; its rollout complete`));

    // Without delete on pods: the image is set back all the same, and the mail says which pods to delete.
    const storeMail = mails.find((m) => m.to.includes('store@'))!;
    assert.match(storeMail.body, new RegExp(`^outcome: failed \\(image updated, then rolled back to ${v1}\\)$`, 'm'));
    assert.match(storeMail.body, new RegExp(
      `^rollback: +rolled back to ${v1}: .*; the stuck pods store-1 must be deleted by hand for the StatefulSet's forced rollback ` +
      `\\(kubectl -n ${ns} delete pod store-1\\): forbidden: the service account "nodelete" of namespace "${ns}" cannot "delete" pods "store-1" in namespace "${ns}"`, 'm'));
    assert.match(storeMail.body, /; its rollout progressing \(not followed: it waits until the stuck pods are deleted\)$/m);
    assert.equal(containerImage(await getJson('statefulset/store'), 'app'), acrImage('v1'));
    // The StatefulSet does wait for that pod: it is still there, broken, and the set not ready.
    const stuck = await getJson('pod/store-1');
    assert.equal(stuck.spec.containers[0].image, acrImage('broken1'));
    assert.equal((await getJson('statefulset/store')).status.readyReplicas, 1);
    // Deleted by hand as the mail says, the rollback completes.
    await kubectl(['-n', ns, 'delete', 'pod', 'store-1']);
    await kubectl(['-n', ns, 'rollout', 'status', 'statefulset/store', '--timeout=120s']);
    assert.equal((await getJson('pod/store-1')).spec.containers[0].image, acrImage('v1'));
  });
});
