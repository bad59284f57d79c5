/*
 * Nothing lost while the API server is away. The built executable reaches the test cluster's API
 * server through a TCP proxy that this file starts and cuts (closing its listener, so connections
 * are refused, and dropping the ones open) and restores on the same port. The API server itself is
 * never stopped: the test cluster is shared with the other test files and with other people's
 * runs, which a stopped API server would break; to the executable a cut proxy is the same as an
 * API server that does not answer (connections refused for longer than its 20 s retry budget).
 * Real exim for the result mails.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { makeTempDir, startWebhook, waitForOutput, type Webhook } from './harness.ts';
import { readMail, serviceMailEnv, startMta, type Mta } from './mta.ts';
import {
  acrImage, acrPayload, ApiServerProxy, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter,
  removeNamespace,
} from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';

const TOKEN = 'outage-token-a93c5e';
const cluster = await clusterOrSkip();

describe('pushes while the API server is away', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('outage');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  const admin = JSON.parse(fs.readFileSync(cluster?.kubeconfigPath ?? '/dev/null', 'utf8') || '{}');
  const server = new URL(admin.clusters?.[0]?.cluster?.server ?? 'https://127.0.0.1:1');
  const proxy = new ApiServerProxy(server);
  let mta: Mta;
  const started: Webhook[] = [];
  const start = async (applyDeadline: string) => {
    const dir = makeTempDir('outage-');
    const kubeconfig = path.join(dir, 'kubeconfig.json');
    const proxied = JSON.parse(JSON.stringify(admin));
    proxied.clusters[0].cluster.server = `https://127.0.0.1:${proxy.port}`;
    fs.writeFileSync(kubeconfig, JSON.stringify(proxied), { mode: 0o600 });
    const wh = await startWebhook({
      hooks: [upgradeHook('deploy', TOKEN, { MAIL_TO: 'ops@example.com' })],
      args: ['-apply-deadline', applyDeadline],
      env: {
        KUBECONFIG: kubeconfig,
        ...serviceMailEnv(mta),
      },
    });
    started.push(wh);
    return wh;
  };
  const base = Math.floor(Date.now() / 1000) * 1000 - 600_000;
  const push = (wh: Webhook, tag: string, second: number) =>
    wh.request(`/hooks/deploy?${new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: acrPayload(tag, 'shop/web-api', { pushed_at: new Date(base + second * 1000).toISOString() }),
    });

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('web', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 })));
    await kubectl(['-n', ns, 'rollout', 'status', 'deployment/web', '--timeout=90s']);
    await proxy.restore();
    mta = await startMta();
  });
  after(async () => {
    await Promise.all(started.map((w) => w.stop()));
    await proxy.cut();
    await mta?.stop();
    await removeNamespace(kubectl, ns);
  });

  test('kept (202, the newest per container) and applied when the API server answers again; the replaced one reported superseded and never written', async () => {
    const wh = await start('5m');
    const warm = await push(wh, 'v2', 2);
    assert.equal(warm.status, 200, warm.body);
    await mta.waitForMessages(1, 60_000);
    await mta.clear();

    await proxy.cut();
    const older = await push(wh, 'v3', 3);
    assert.equal(older.status, 202, older.body);
    assert.match(older.body, /^action: +waiting for the API server \(.+\): kept, and applied when it answers until \S+$/m);
    assert.match(older.body, /^result: +ok$/m);
    const newer = await push(wh, 'v4', 4);
    assert.equal(newer.status, 202, newer.body);
    // The older one is settled at once: superseded by the newer one kept for the same container.
    const [supersededRaw] = await mta.waitForMessages(1, 60_000);
    const superseded = readMail(supersededRaw);
    assert.equal(superseded.subject, `Webhooks通知: ${ns}-deployment/web-app 更新结果: no change`);
    assert.match(superseded.body, /^action: +none \(superseded: a newer push to this container arrived while the API server was away\)$/m);
    assert.match(superseded.body, new RegExp(`^image after: +${acrImage('v3').replace(/\./g, '\\.')}$`, 'm'));
    assert.equal(containerImage(await getJson('deployment/web'), 'app'), acrImage('v2'), 'nothing written while cut');

    await proxy.restore();
    await waitForOutput(wh, new RegExp(`deployment/web in ${ns}: the API server answered again; image updated`), 60_000);
    assert.equal(containerImage(await getJson('deployment/web'), 'app'), acrImage('v4'));
    const mails = (await mta.waitForMessages(2, 90_000)).map(readMail);
    const applied = mails.find((m) => m.body.includes(`image after:  ${acrImage('v4')}`))!;
    assert.equal(applied.subject, `Webhooks通知: ${ns}-deployment/web-app 更新结果: succeeded`);
    assert.match(applied.body, /^action: +image updated$/m);
    assert.match(applied.body, new RegExp(`^image before: +${acrImage('v2').replace(/\./g, '\\.')}$`, 'm'));
    assert.match(applied.body, /^rollout: +complete/m);
    await mta.clear();
  });

  test('past -apply-deadline: reported as failed, and never applied afterwards', async () => {
    await mta.clear();
    const wh = await start('2s');
    await proxy.cut();
    const res = await push(wh, 'v5', 5);
    assert.equal(res.status, 202, res.body);
    const [raw] = await mta.waitForMessages(1, 60_000);
    const mail = readMail(raw);
    assert.equal(mail.subject, `Webhooks通知: ${ns}-deployment/web-app 更新结果: failed`);
    assert.match(mail.body, /^result: +failed: the API server did not answer within -apply-deadline 2s/m);
    assert.match(wh.output(), new RegExp(`deployment/web in ${ns}: push not applied: the API server did not answer within -apply-deadline 2s`));
    await proxy.restore();
    assert.equal(containerImage(await getJson('deployment/web'), 'app'), acrImage('v4'));
    // The next push through the same replica finds v4 still in place: v5 was dropped, not applied late.
    const next = await push(wh, 'v6', 6);
    assert.equal(next.status, 200, next.body);
    assert.match(next.body, new RegExp(`^image before: +${acrImage('v4').replace(/\./g, '\\.')}$`, 'm'));
    await mta.clear();
  });
});
