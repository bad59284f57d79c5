/*
 * A rolling restart of the service itself during a burst of pushes loses nothing.
 *
 * What can be proven where: on the test cluster, kwok fakes pods (nothing runs in them), so
 * test/deploy.test.ts proves there what the manifests make Kubernetes do (two replicas on two
 * nodes, the disruption budget, a rolling restart that keeps them spread). What the processes do
 * is proven here, with the real built executable against the same cluster: two replicas behind a
 * stand-in for the Service's data path (a TCP proxy in this file that sends each new connection to
 * a replica whose /healthz answered 200 at its last probe, every 200 ms, as endpoints follow
 * readiness), restarted one after the other the way a rolling update does it (a new replica
 * ready, then SIGTERM to an old one, which turns unready at once and keeps serving for
 * -shutdown-delay) while pushes keep arriving. Every push gets an answer that says what happened
 * to it, none fails, and the workload ends on the newest.
 */
import assert from 'node:assert/strict';
import * as net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { httpRequest, startWebhook, type Webhook } from './harness.ts';
import {
  acrImage, acrPayload, clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, removeNamespace,
} from './cluster/kube.ts';
import { upgradeHook } from './upgrade-hooks.ts';

const TOKEN = 'rolling-token-0f6a2d';
const cluster = await clusterOrSkip();

/** The Service stand-in: new connections go round-robin to the replicas last probed ready. */
class ReadinessProxy {
  readonly server = net.createServer((client) => this.route(client));
  private readonly ready = new Map<Webhook, boolean>();
  private next = 0;
  private timer: NodeJS.Timeout | undefined;
  /** Connections that found no ready replica (a Service with no endpoints refuses them). */
  refused = 0;

  async listen(): Promise<number> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.timer = setInterval(() => void this.probe(), 200);
    return (this.server.address() as net.AddressInfo).port;
  }
  add(replica: Webhook): void {
    this.ready.set(replica, true);
  }
  remove(replica: Webhook): void {
    this.ready.delete(replica);
  }
  private async probe(): Promise<void> {
    for (const replica of [...this.ready.keys()]) {
      const status = await httpRequest(replica.port, '/healthz').then((r) => r.status, () => 0);
      if (this.ready.has(replica)) this.ready.set(replica, status === 200);
    }
  }
  private route(client: net.Socket): void {
    const ready = [...this.ready].filter(([, ok]) => ok).map(([r]) => r);
    if (ready.length === 0) {
      this.refused++;
      client.destroy();
      return;
    }
    const replica = ready[this.next++ % ready.length];
    const upstream = net.connect(replica.port, '127.0.0.1');
    client.pipe(upstream).pipe(client);
    const close = () => { client.destroy(); upstream.destroy(); };
    client.on('error', close);
    upstream.on('error', close);
  }
  close(): void {
    clearInterval(this.timer);
    this.server.close();
  }
}

describe('a rolling restart of the service during a burst of pushes', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('rolling');
  const kubectl = kubectlFor(cluster!);
  const proxy = new ReadinessProxy();
  const replicas: Webhook[] = [];
  let port = 0;
  const start = async () => {
    const wh = await startWebhook({ hooks: [upgradeHook('deploy', TOKEN)], args: ['-shutdown-delay', '2s'], env: { KUBECONFIG: cluster!.kubeconfigPath } });
    replicas.push(wh);
    proxy.add(wh);
    return wh;
  };

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(deployment('web', [{ name: 'app', image: acrImage('b-start') }], { replicas: 1 })));
    port = await proxy.listen();
  });
  after(async () => {
    proxy.close();
    await Promise.all(replicas.map((r) => r.stop()));
    await removeNamespace(kubectl, ns);
  });

  test('every push is answered with what happened to it; none is lost; the workload ends on the newest', async () => {
    const [old1, old2] = [await start(), await start()];
    const base = Math.floor(Date.now() / 1000) * 1000 - 600_000;
    const total = 80;
    const answers: { tag: string; status: number; action: string }[] = [];
    let sent = 0;
    const sender = async () => {
      while (sent < total) {
        const i = sent++;
        const tag = `b${String(i).padStart(3, '0')}`;
        const body = acrPayload(tag, 'shop/web-api', { pushed_at: new Date(base + i * 1000).toISOString() });
        const query = new URLSearchParams({ token: TOKEN, ns, workload: 'deployment/web', container: 'app', repo_type: 'regionalregistry' });
        const res = await httpRequest(port, `/hooks/deploy?${query}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body })
          .catch((e: Error) => ({ status: 0, body: e.message }));
        answers.push({ tag, status: res.status, action: /^action: +(.*)$/m.exec(res.body)?.[1] ?? res.body });
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    const burst = Promise.all([sender(), sender(), sender()]);
    // The rolling update, maxSurge 1 / maxUnavailable 0: a new replica, then an old one stops.
    for (const old of [old1, old2]) {
      await start();
      const exit = await old.stop();
      proxy.remove(old);
      assert.equal(exit.code, 0, old.output());
      assert.match(old.output(), /caught SIGTERM: not ready; still serving for 2s/);
    }
    await burst;
    const context = answers.map((a) => `${a.tag}: ${a.status} ${a.action}`).join('\n');
    assert.equal(answers.length, total);
    assert.equal(proxy.refused, 0, context);
    for (const a of answers) {
      assert.equal(a.status, 200, context);
      assert.match(a.action, /^(image updated|none \(superseded: a newer push, \S+ pushed at \S+, was applied already\))$/, context);
    }
    const newest = `b${String(total - 1).padStart(3, '0')}`;
    assert.equal(answers.find((a) => a.tag === newest)?.action, 'image updated', context);
    const d = JSON.parse(await kubectl(['-n', ns, 'get', 'deployment/web', '-o', 'json']));
    assert.equal(containerImage(d, 'app'), acrImage(newest));
  });
});
