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
import { after, before, describe, test } from 'node:test';
import { startWebhook, waitFor, type Webhook } from './harness.ts';
import { startMta, type Mta } from './mta.ts';
import { acrImage, acrPayload, clusterOrSkip, containerImage, cronJob, daemonSet, deployment, freshNamespaceName, kubectlFor } from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';
import { KubeClient, loadKubeconfig, rollBackFailedRollout, runUpgrade } from '../webhook.ts';

const TOKEN = 'rollback-token-77d0e2';
const cluster = await clusterOrSkip();
const b64 = (t: string) => Buffer.from(t).toString('base64');

/** Subject (RFC 2047 B-words decoded) and base64 body of a delivered message. */
function readMail(raw: string): { subject: string; to: string; body: string } {
  const [head, body] = raw.replace(/\r\n/g, '\n').split('\n\n');
  const subject = /^Subject: (.*(?:\n[ \t].*)*)/m.exec(head)![1].replace(/\n[ \t]/g, '')
    .replace(/=\?UTF-8\?B\?([^?]*)\?=/g, (_, b: string) => Buffer.from(b, 'base64').toString('utf8'));
  const to = /^To: (.*)$/m.exec(head)?.[1] ?? '';
  return { subject, to, body: Buffer.from(body.replace(/\s+/g, ''), 'base64').toString('utf8') };
}

/** The admission policy that makes pods of `:broken…` images crash-loop, in one namespace. */
function crashLoopPolicy(name: string, ns: string): object[] {
  return [
    {
      apiVersion: 'admissionregistration.k8s.io/v1', kind: 'MutatingAdmissionPolicy', metadata: { name },
      spec: {
        matchConstraints: {
          namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': ns } },
          resourceRules: [{ apiGroups: [''], apiVersions: ['v1'], operations: ['CREATE'], resources: ['pods'] }],
        },
        matchConditions: [{ name: 'broken-image', expression: "object.spec.containers.exists(c, c.image.matches(':broken[^/]*$'))" }],
        failurePolicy: 'Fail',
        reinvocationPolicy: 'Never',
        mutations: [{
          patchType: 'ApplyConfiguration',
          applyConfiguration: { expression: 'Object{metadata: Object.metadata{labels: {"webhook-test/unready": "true"}}}' },
        }],
      },
    },
    { apiVersion: 'admissionregistration.k8s.io/v1', kind: 'MutatingAdmissionPolicyBinding', metadata: { name }, spec: { policyName: name } },
  ];
}

describe('a failed rollout, with and without ROLLBACK_ON_FAILURE', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('rollback');
  const policy = `webhook-test-crashloop-${ns}`;
  const kubectl = kubectlFor(cluster!);
  const getJson = async (what: string) => JSON.parse(await kubectl(['-n', ns, 'get', what, '-o', 'json']));
  let mta: Mta;
  let wh: Webhook;
  const push = (hook: string, workload: string, body: string) =>
    wh.request(`/hooks/${hook}?${new URLSearchParams({ token: TOKEN, ns, workload, container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
    });

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: crashLoopPolicy(policy, ns) }));
    // The API server applies a new policy once its informers have it: a server-side dry run of such
    // a pod shows when that is.
    const probe = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'probe', namespace: ns }, spec: { containers: [{ name: 'app', image: acrImage('broken-probe') }] } };
    await waitFor(async () => {
      const pod = JSON.parse(await kubectl(['create', '--dry-run=server', '-o', 'json', '-f', '-'], JSON.stringify(probe)));
      return pod.metadata.labels?.['webhook-test/unready'] === 'true';
    }, { timeoutMs: 60_000, what: 'the admission policy to label pods of :broken images' });
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
        upgradeHook('guarded', TOKEN, { ROLLBACK_ON_FAILURE: 'true', MAIL_TO: 'guarded@example.com' }),
        upgradeHook('plain', TOKEN, { MAIL_TO: 'plain@example.com' }),
      ],
      env: {
        KUBECONFIG: cluster!.kubeconfigPath,
        MAIL_SMTP_SERVER: b64('localhost'), MAIL_SMTP_PORT: String(mta.starttlsPort), MAIL_FROM: b64(mta.user), MAIL_PASSWORD: b64(mta.password), MAIL_CACERT: b64(mta.caPem),
      },
    });
  });
  after(async () => {
    await wh?.stop();
    await mta?.stop();
    await kubectl(['delete', 'mutatingadmissionpolicybinding,mutatingadmissionpolicy', policy, '--ignore-not-found']).catch(() => '');
    if (!process.env.KEEP_NAMESPACE) await kubectl(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
  });

  test('a crash-looping push: rolled back with the setting (mail, log, Event say so), left in place without it', async () => {
    const broken = acrPayload('broken1');
    // With ROLLOUT_TIMEOUT the answer itself waits for the rollout, and so for the rollback.
    const syncEnv = { APP_NS: ns, APP_WORKLOAD: 'deployment/synced', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', ROLLOUT_TIMEOUT: '3m', ROLLBACK_ON_FAILURE: 'true', KUBECONFIG: cluster!.kubeconfigPath };
    const [guarded, plain, agent, synced] = await Promise.all([
      push('guarded', 'deployment/guarded', broken), push('plain', 'deployment/plain', acrPayload('broken1')), push('guarded', 'daemonset/agent', acrPayload('broken1')),
      runUpgrade([acrPayload('broken1')], syncEnv),
    ]);
    assert.equal(synced.exitCode, 1, synced.output);
    assert.match(synced.output, /^action: +image updated, then rolled back to \S+:v1$/m);
    assert.match(synced.output, /^result: +failed: the rollout failed \(see rollout\)$/m);
    assert.match(synced.output, /^rollout: +failed: pods not ready: synced-\S+ CrashLoopBackOff \(stuck for \d+s\)$/m);
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
    assert.match(rolled.body, /^pod guarded-\S+: Running, not ready, image \S+:broken1, restarts \d+, CrashLoopBackOff$/m);
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
      await rollBackFailedRollout(client, first.report.target!, report, 0, { requestId: 'r1' });
      assert.match(report.rollback?.notDone ?? '', new RegExp(`^a newer push \\(${acrImage('v3').replace(/\./g, '\\.')}, pushed at \\S+\\) was applied meanwhile$`));
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
});
