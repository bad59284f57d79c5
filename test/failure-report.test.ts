/*
 * Why a rollout failed, in its mail and chat, through the built executable on the real test cluster: kwok gives the
 * crash-looping pods their container states (a waiting CrashLoopBackOff after an exit 1, Error) and serves their logs
 * through the API server's pods/log (test/cluster/cluster.ts). The service runs as a ServiceAccount with the Roles
 * `webhook -print-rbac` prints: without -rbac-pod-logs the report names the last exit and says the log was not
 * readable; with the Roles -rbac-pod-logs prints, it quotes the previous run's last lines, the hook's token taken out.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import { after, before, describe, test } from 'node:test';
import * as path from 'node:path';
import { CRASH_LOG_PREVIOUS, CRASH_LOG_SECRET, UNREADY_LABEL } from './cluster/cluster.ts';
import { acrImage, acrPayload, clusterOrSkip, deployment, freshNamespaceName, kubectlFor, removeNamespace, shippedServiceAccount } from './cluster/kube.ts';
import { adminPort, defaultBinary, httpRequest, makeTempDir, REPO_ROOT, startWebhook, waitFor, type Webhook } from './harness.ts';
import { readMail, serviceMailEnv, startMta, type Mta } from './mta.ts';
import { startReceiver, type Receiver } from './receiver.ts';
import { fixedSettings, upgradeHook } from './upgrade-hooks.ts';

const cluster = await clusterOrSkip();

describe('a failed rollout says why: the last exit and the log\'s last lines', { skip: cluster ? false : 'no cluster' }, () => {
  const kubectl = kubectlFor(cluster!);
  const ns = freshNamespaceName('failure-report');
  const dir = makeTempDir('failure-report-');
  const hooksFile = path.join(dir, 'hooks.json');
  let sa: Awaited<ReturnType<typeof shippedServiceAccount>>;
  let mta: Mta;
  let rx: Receiver;
  let wh: Webhook;
  const printRbac = (extra: string[]) => new Promise<string>((resolve, reject) => {
    execFile(defaultBinary(), ['-print-rbac', '-template', ...extra, '-hooks', hooksFile, '-rbac-service-account', `${ns}/webhook`],
      { env: { ...process.env, HOOK_TOKEN: CRASH_LOG_SECRET } }, (error, stdout, stderr) => (error ? reject(new Error(stderr || error.message)) : resolve(stdout)));
  });
  const push = (tag: string) =>
    wh.request(`/hooks/crash?${new URLSearchParams({ token: CRASH_LOG_SECRET })}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: acrPayload(tag) });
  /** The mail and the chat message of one push, once both have come. */
  const told = async (tag: string) => {
    const mail = (await waitFor(async () => (await mta.messages()).map(readMail).find((m) => m.body.includes(`:${tag}`)),
      { timeoutMs: 180_000, what: `the mail of the push of ${tag}` }))!;
    const chat = (await waitFor(() => rx.requests.find((r) => r.body.includes(`:${tag}`)), { timeoutMs: 60_000, what: `the chat of ${tag}` }))!;
    return { mail: mail.body.replace(/\r\n/g, '\n'), chat: chat.body };
  };

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    // Every pod of this template crash-loops (kwok's stage for the label): each new image's rollout fails.
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('crash', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }, { [UNREADY_LABEL]: 'true' })));
    mta = await startMta();
    rx = await startReceiver({ status: 200, body: 'ok' });
    fs.writeFileSync(hooksFile, JSON.stringify([{
      ...upgradeHook('crash', '{{ getenv "HOOK_TOKEN" }}'),
      'pass-environment-to-command': fixedSettings({
        APP_NS: ns, APP_WORKLOAD: 'deployment/crash', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry', ROLLOUT_STUCK_TIMEOUT: '5s',
        MAIL_TO: 'crash@example.com', NOTIFY_URL: `${rx.base}/slack`, NOTIFY_FORMAT: 'slack',
      }),
    }]));
    sa = await shippedServiceAccount(kubectl, cluster!, ns, [path.join(REPO_ROOT, 'deploy', 'serviceaccount.yaml')], dir);
    await kubectl(['apply', '-f', '-'], await printRbac([]));
    wh = await startWebhook({ hooks: hooksFile, metrics: true, args: ['-template', '-deliveries', '10'], env: {
      HOOK_TOKEN: CRASH_LOG_SECRET, KUBECONFIG: sa.kubeconfig, NOTIFY_CACERT: Buffer.from(rx.certPem).toString('base64'), ...serviceMailEnv(mta),
    } });
  });
  after(async () => {
    await wh?.stop();
    await mta?.stop();
    await rx?.close();
    await sa?.remove();
    await removeNamespace(kubectl, ns);
  });

  test('without pods/log: the pod\'s last exit, and that its log was not readable', async () => {
    const res = await push('crash1');
    assert.equal(res.status, 200, res.body);
    const { mail, chat } = await told('crash1');
    assert.match(mail, /^rollout: +failed: pods not ready: crash-\S+ CrashLoopBackOff/m);
    assert.match(mail, /^pod crash-\S+: Running, not ready, image \S+:crash1, restarts 1, CrashLoopBackOff; last exit 1 \(Error\)$/m);
    assert.match(mail, /^ {2}log \(container app, previous run\): not readable: not granted get on pods\/log \(`webhook -print-rbac -rbac-pod-logs` grants it\)$/m);
    assert.match(chat, /last exit 1 \(Error\)/);
    assert.match(chat, /not readable: not granted get on pods\/log/);
  });

  test('with the Roles -rbac-pod-logs prints: the previous run\'s last lines, the hook\'s token taken out', async () => {
    const rbac = await printRbac(['-rbac-pod-logs']);
    assert.match(rbac, /^ {2}- apiGroups: \[""\]\n {4}resources: \["pods\/log"\]\n {4}verbs: \["get"\]$/m);
    await kubectl(['apply', '-f', '-'], rbac);
    // The API server's authorizer has the new Role within moments.
    await waitFor(async () => (await kubectl(['auth', 'can-i', 'get', 'pods', '--subresource=log', '-n', ns, `--as=system:serviceaccount:${ns}:webhook`]).catch(() => 'no')).trim() === 'yes',
      { timeoutMs: 30_000, what: 'get on pods/log granted' });
    const res = await push('crash2');
    assert.equal(res.status, 200, res.body);
    const { mail, chat } = await told('crash2');
    assert.match(mail, /^pod crash-\S+: Running, not ready, image \S+:crash2, restarts 1, CrashLoopBackOff; last exit 1 \(Error\)$/m);
    const quoted = CRASH_LOG_PREVIOUS.map((l) => `  | ${l.replace(CRASH_LOG_SECRET, 'REDACTED')}`).join('\n');
    assert.ok(mail.includes(`  log (container app, previous run), last 3 lines:\n${quoted}\n`), mail);
    assert.match(chat, /panic: database unreachable/);
    assert.match(chat, /with token REDACTED/);
    for (const text of [mail, chat, res.body, wh.output()]) assert.equal(text.includes(CRASH_LOG_SECRET), false, text);
    // The page's JSON record carries the same, in the document's words, scrubbed as well.
    const page = JSON.parse((await httpRequest(await adminPort(wh), '/deliveries.json')).body).deliveries
      .find((d: any) => d.request_id === res.headers['x-request-id']);
    const pod = page.pods.find((p: any) => p.image.endsWith(':crash2'));
    assert.deepEqual(pod.failure, { container: 'app', last_exit: { code: 1, reason: 'Error', previous_run: true },
      log: CRASH_LOG_PREVIOUS.map((l) => l.replace(CRASH_LOG_SECRET, 'REDACTED')) });
    assert.equal(JSON.stringify(page).includes(CRASH_LOG_SECRET), false);
  });
});
