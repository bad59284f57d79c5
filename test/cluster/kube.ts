/*
 * What tests need on the real test cluster: kubectl against it, a fresh namespace, workload
 * manifests and registry payloads. The cluster itself comes from ./cluster.ts.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as https from 'node:https';
import * as net from 'node:net';
import * as path from 'node:path';
import { peerOrSkip, waitFor } from '../harness.ts';
import { ensureCluster } from './cluster.ts';

export interface Cluster { kubeconfigPath: string; kubectl: string }

/**
 * The running test cluster, started if needed. In CI a cluster that cannot start fails the run;
 * locally the tests that need it are skipped with a loud message.
 */
export function clusterOrSkip(): Promise<Cluster | undefined> {
  return peerOrSkip(ensureCluster, 'cluster', 'cluster tests');
}

export type Kubectl = (args: string[], input?: string) => Promise<string>;

export function kubectlFor(cluster: Cluster): Kubectl {
  return (args, input) => new Promise((resolve, reject) => {
    const child = execFile(cluster.kubectl, ['--kubeconfig', cluster.kubeconfigPath, ...args], { maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`kubectl ${args.join(' ')}: ${stderr || error.message}`));
      else resolve(stdout);
    });
    if (input !== undefined) child.stdin!.end(input);
  });
}

/** Deletes a suite's namespace, without waiting; kept when KEEP_NAMESPACE is set, to look at after a failure. */
export async function removeNamespace(kubectl: Kubectl, ns: string): Promise<void> {
  if (!process.env.KEEP_NAMESPACE) await kubectl(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
}

/** `kubectl get <what> -o json` in namespace `ns`, parsed. */
export function namespacedGetter(kubectl: Kubectl, ns: string): (what: string) => Promise<any> {
  return async (what) => JSON.parse(await kubectl(['-n', ns, 'get', what, '-o', 'json']));
}

/**
 * Sets the imageID the kubelet reports once it has pulled an image (kwok reports none) on the container `app` of
 * the pods labelled app=<workload> in `ns`: `<repo>@sha256:…`, what status.containerStatuses[].imageID says.
 */
export async function reportPulled(kubectl: Kubectl, ns: string, workload: string, imageId: string): Promise<void> {
  const pods = JSON.parse(await kubectl(['-n', ns, 'get', 'pods', '-l', `app=${workload}`, '-o', 'json'])).items;
  if (pods.length === 0) throw new Error(`no pods of ${workload}`);
  for (const pod of pods) {
    const i = pod.status.containerStatuses.findIndex((c: any) => c.name === 'app');
    const patch = [{ op: 'add', path: `/status/containerStatuses/${i}/imageID`, value: imageId }];
    await kubectl(['-n', ns, 'patch', 'pod', pod.metadata.name, '--subresource=status', '--type=json', '-p', JSON.stringify(patch)]);
  }
}

export function freshNamespaceName(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString('hex')}`;
}

export function podTemplate(labels: Record<string, string>, containers: unknown[]) {
  return { metadata: { labels }, spec: { containers, terminationGracePeriodSeconds: 0 } };
}

export function deployment(name: string, containers: unknown[], extra: Record<string, unknown> = {}, labels: Record<string, string> = {}) {
  return {
    apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name },
    spec: { replicas: 2, selector: { matchLabels: { app: name } }, template: podTemplate({ app: name, ...labels }, containers), ...extra },
  };
}

export function daemonSet(name: string, containers: unknown[], labels: Record<string, string> = {}) {
  return {
    apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name },
    spec: { selector: { matchLabels: { app: name } }, template: podTemplate({ app: name, ...labels }, containers) },
  };
}

export function statefulSet(name: string, replicas: number, containers: unknown[]) {
  return {
    apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name },
    spec: { replicas, serviceName: name, selector: { matchLabels: { app: name } }, template: podTemplate({ app: name }, containers) },
  };
}

/** A nightly CronJob whose job pods run `containers` (and `initContainers`, when given). */
export function cronJob(name: string, containers: unknown[], initContainers?: unknown[]) {
  return {
    apiVersion: 'batch/v1', kind: 'CronJob', metadata: { name },
    spec: { schedule: '0 3 * * *', jobTemplate: { spec: { template: { spec: { restartPolicy: 'OnFailure', ...(initContainers ? { initContainers } : {}), containers } } } } },
  };
}

/** An ACR push notification (the shape of REFERENCE.md's example) with a fresh digest. */
export function acrPayload(tag: string, repo = 'shop/web-api', extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    push_data: { digest: `sha256:${randomBytes(32).toString('hex')}`, pushed_at: new Date().toISOString(), tag, ...extra },
    repository: { name: repo.split('/')[1], namespace: repo.split('/')[0], region: 'cn-hangzhou', repo_full_name: repo, repo_type: 'PRIVATE' },
  });
}

/** The image an ACR push of `tag` names, for each network type. */
export function acrImage(tag: string, netType: '' | 'vpc' | 'internal' = ''): string {
  return `registry${netType ? `-${netType}` : ''}.cn-hangzhou.aliyuncs.com/shop/web-api:${tag}`;
}

export function containerImage(obj: any, name: string, template = obj.spec.template): string | undefined {
  return template.spec.containers.find((c: any) => c.name === name)?.image;
}

/**
 * What a push may change on a workload: its pod template and the newest-push record. Not
 * metadata.generation: a Deployment's also counts annotation changes, and a follow's record is
 * taken off its annotations when the rollout ends, whenever that is.
 */
export function pushedState(obj: any): string {
  const template = obj.spec.template ?? obj.spec.jobTemplate;
  return JSON.stringify({ template, lastPush: obj.metadata.annotations?.['webhook/last-push'] });
}

/**
 * Applies deploy/ files (serviceaccount.yaml, and rbac-cluster.yaml for the cluster-wide option)
 * with the ServiceAccount in `namespace` and cluster-scoped objects renamed `webhook-<namespace>`
 * (so runs do not clash), and writes a JSON kubeconfig that authenticates with a token of that
 * ServiceAccount (valid for tokenDuration). `unbind` deletes the cluster binding; `remove` the cluster-scoped objects.
 */
export async function shippedServiceAccount(
  kubectl: Kubectl, cluster: Cluster, namespace: string, rbacFiles: string[], dir: string, tokenDuration = '10m',
) {
  // kubectl parses the YAML (we have no YAML parser): one pretty-printed JSON object per document.
  const parsed = await kubectl(['create', '--dry-run=client', '-o', 'json', ...rbacFiles.flatMap((f) => ['-f', f])]);
  const items: any[] = JSON.parse(`[${parsed.trim().replace(/\n}\n{/g, '\n},\n{')}]`);
  const name = `webhook-${namespace}`;
  for (const item of items) {
    if (item.kind === 'ServiceAccount') item.metadata.namespace = namespace;
    if (item.kind === 'ClusterRole' || item.kind === 'ClusterRoleBinding') item.metadata.name = name;
    if (item.kind === 'ClusterRoleBinding') {
      item.roleRef.name = name;
      for (const s of item.subjects) s.namespace = namespace;
    }
  }
  await kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
  const token = (await kubectl(['create', 'token', 'webhook', '-n', namespace, `--duration=${tokenDuration}`])).trim();
  const admin = JSON.parse(fs.readFileSync(cluster.kubeconfigPath, 'utf8'));
  const kubeconfig = path.join(dir, 'sa-kubeconfig.json');
  fs.writeFileSync(kubeconfig, JSON.stringify({
    'current-context': 'sa', contexts: [{ name: 'sa', context: { cluster: admin.clusters[0].name, user: 'webhook' } }],
    clusters: [admin.clusters[0]], users: [{ name: 'webhook', user: { token } }],
  }));
  return {
    kinds: items.map((i) => String(i.kind)),
    token,
    kubeconfig,
    admin,
    unbind: () => kubectl(['delete', 'clusterrolebinding', name, '--ignore-not-found']),
    remove: () => kubectl(['delete', 'clusterrolebinding,clusterrole', name, '--ignore-not-found']).catch(() => ''),
  };
}

/** Where and as whom raw requests go: a server URL, its CA, a bearer token. */
export interface Caller { server: string; ca?: Buffer; token?: string }

/** One raw request; resolves with the status and headers once the answer has been read. */
function rawRequest(caller: Caller, method: string, urlPath: string): Promise<{ status: number; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    https.request(`${caller.server}${urlPath}`, { method, ca: caller.ca, headers: { Authorization: `Bearer ${caller.token}` } }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers }));
    }).on('error', reject).end();
  });
}

/**
 * The real API server throttling one ServiceAccount: API Priority and Fairness sends its requests
 * to a priority level with no seats of its own and none to borrow, whose excess is rejected (429
 * with Retry-After) rather than queued. Such a level still runs one request when none of its own
 * is running, so `hold()` takes that one seat with a request whose body never ends (the API server
 * admits a request before it reads the body); until the returned release is called, every other
 * request of the ServiceAccount is answered 429. The caller must be allowed to create events in
 * `namespace`: an unauthorized request would end at once and free the seat.
 */
export async function apfThrottle(kubectl: Kubectl, namespace: string, serviceAccount: string, caller: Caller) {
  const name = `webhook-test-throttle-${namespace}`;
  await kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
    { apiVersion: 'flowcontrol.apiserver.k8s.io/v1', kind: 'PriorityLevelConfiguration', metadata: { name },
      spec: { type: 'Limited', limited: { nominalConcurrencyShares: 0, lendablePercent: 0, borrowingLimitPercent: 0, limitResponse: { type: 'Reject' } } } },
    { apiVersion: 'flowcontrol.apiserver.k8s.io/v1', kind: 'FlowSchema', metadata: { name },
      spec: { matchingPrecedence: 200, priorityLevelConfiguration: { name }, distinguisherMethod: { type: 'ByUser' },
        rules: [{ subjects: [{ kind: 'ServiceAccount', serviceAccount: { name: serviceAccount, namespace } }],
          resourceRules: [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'], namespaces: ['*'], clusterScope: true }] }] } },
  ] }));
  const uid = JSON.parse(await kubectl(['get', 'flowschema', name, '--output', 'json'])).metadata.uid;
  const probe = () => rawRequest(caller, 'GET', `/api/v1/namespaces/${namespace}/serviceaccounts/${serviceAccount}`);
  // The API server applies a new FlowSchema within moments; its answers name the one that matched.
  for (let i = 0; (await probe()).headers['x-kubernetes-pf-flowschema-uid'] !== uid; i++) {
    if (i === 100) throw new Error(`FlowSchema ${name} not in effect after 10 s`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return {
    async hold(): Promise<() => void> {
      // A probe that reaches the API server before the held request takes the seat for a moment, and the held
      // request is then rejected (answered 429, so it holds nothing): it is made again, a few times.
      for (let attempt = 1; attempt <= 5; attempt++) {
        const held = https.request(`${caller.server}/api/v1/namespaces/${namespace}/events`, {
          method: 'POST', ca: caller.ca, headers: { Authorization: `Bearer ${caller.token}`, 'Content-Type': 'application/json', 'Content-Length': '4096' },
        });
        let answered = false;
        held.on('response', (res) => {
          answered = true;
          res.resume();
        });
        // Released by destroying it: the error that follows is the point.
        held.on('error', () => undefined);
        held.write('{');
        for (let i = 0; i < 100 && !answered; i++) {
          if ((await probe()).status === 429 && !answered) return () => held.destroy();
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        held.destroy();
      }
      throw new Error(`priority level ${name}: the held request did not take the seat in 5 tries`);
    },
    /** How many requests the priority level has rejected so far. */
    async rejected(): Promise<number> {
      const dump = await kubectl(['get', '--raw', '/debug/api_priority_and_fairness/dump_priority_levels']);
      const [header, ...rows] = dump.split('\n').map((l) => l.split(',').map((c) => c.trim()));
      const row = rows.find((cells) => cells[0] === name);
      if (!row) throw new Error(`priority level ${name} not in the API server's dump`);
      return Number(row[header.indexOf('RejectedRequests')]);
    },
    /** Resolves once the priority level has rejected more than `count` requests (some 429 went out). */
    async rejectedBeyond(count: number): Promise<void> {
      for (let i = 0; (await this.rejected()) <= count; i++) {
        if (i === 300) throw new Error(`priority level ${name}: no request rejected within 30 s`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    },
    remove: () => kubectl(['delete', 'flowschema,prioritylevelconfiguration', name, '--ignore-not-found']).catch(() => ''),
  };
}

/**
 * Counts the API requests of one ServiceAccount from the API server's own metrics: a FlowSchema
 * of its own (ahead of the built-in `service-accounts`, at the same priority level `workload-low`,
 * so the account is treated exactly as before) gives its requests a `flow_schema` label in
 * apiserver_flowcontrol_dispatched_requests_total and …_rejected_requests_total (429s). Resource
 * and non-resource requests (kubectl's discovery) both count; the metrics are read as the
 * cluster's admin, whose requests are exempt and never counted here.
 */
export async function apiRequestCounter(kubectl: Kubectl, namespace: string, serviceAccount: string, caller: Caller) {
  const name = `webhook-count-${namespace}-${serviceAccount}`;
  await kubectl(['apply', '-f', '-'], JSON.stringify({
    apiVersion: 'flowcontrol.apiserver.k8s.io/v1', kind: 'FlowSchema', metadata: { name },
    spec: { matchingPrecedence: 8999, priorityLevelConfiguration: { name: 'workload-low' }, distinguisherMethod: { type: 'ByUser' },
      rules: [{ subjects: [{ kind: 'ServiceAccount', serviceAccount: { name: serviceAccount, namespace } }],
        resourceRules: [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'], namespaces: ['*'], clusterScope: true }],
        nonResourceRules: [{ verbs: ['*'], nonResourceURLs: ['*'] }] }] },
  }));
  const uid = JSON.parse(await kubectl(['get', 'flowschema', name, '--output', 'json'])).metadata.uid;
  for (let i = 0; (await rawRequest(caller, 'GET', '/version')).headers['x-kubernetes-pf-flowschema-uid'] !== uid; i++) {
    if (i === 100) throw new Error(`FlowSchema ${name} not in effect after 10 s`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const total = (metrics: string, metric: string) => metrics.split('\n')
    .filter((l) => l.startsWith(`${metric}{`) && l.includes(`flow_schema="${name}"`))
    .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
  return {
    /** Requests of the account so far: dispatched to a handler, and rejected (429) by the API server. */
    async count(): Promise<{ dispatched: number; rejected: number }> {
      const metrics = await kubectl(['get', '--raw', '/metrics']);
      return {
        dispatched: total(metrics, 'apiserver_flowcontrol_dispatched_requests_total'),
        rejected: total(metrics, 'apiserver_flowcontrol_rejected_requests_total'),
      };
    },
    remove: () => kubectl(['delete', 'flowschema', name, '--ignore-not-found']).catch(() => ''),
  };
}

/**
 * A ServiceAccount `name` in `namespace` allowed everything in that namespace (a Role and a
 * RoleBinding), and a JSON kubeconfig at `file` that authenticates with a token of it.
 */
export async function namespaceAdminAccount(kubectl: Kubectl, cluster: Cluster, namespace: string, name: string, file: string) {
  await roleBoundAccount(kubectl, namespace, name, [{ apiGroups: ['*'], resources: ['*'], verbs: ['*'] }]);
  const token = (await kubectl(['create', 'token', name, '-n', namespace, '--duration=1h'])).trim();
  const admin = JSON.parse(fs.readFileSync(cluster.kubeconfigPath, 'utf8'));
  fs.writeFileSync(file, JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': name,
    contexts: [{ name, context: { cluster: admin.clusters[0].name, user: name, namespace } }],
    clusters: [admin.clusters[0]], users: [{ name, user: { token } }],
  }));
  return { token, kubeconfig: file };
}

/** A ServiceAccount `name` in `namespace` bound to a Role of its own name with these rules. */
export async function roleBoundAccount(kubectl: Kubectl, namespace: string, name: string, rules: object[]): Promise<void> {
  await kubectl(['-n', namespace, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name } },
    { apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'Role', metadata: { name }, rules },
    { apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'RoleBinding', metadata: { name },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name },
      subjects: [{ kind: 'ServiceAccount', name, namespace }] },
  ] }));
}

/**
 * A JSON kubeconfig at `file` that authenticates to the test cluster with a token (valid for `duration`) of the
 * ServiceAccount `name` in `namespace`, which the caller has created and bound.
 */
export async function accountKubeconfig(
  kubectl: Kubectl, cluster: Cluster, namespace: string, name: string, file: string, duration: string,
): Promise<string> {
  const token = (await kubectl(['create', 'token', name, '-n', namespace, `--duration=${duration}`])).trim();
  const admin = JSON.parse(fs.readFileSync(cluster.kubeconfigPath, 'utf8'));
  fs.writeFileSync(file, JSON.stringify({
    'current-context': name, contexts: [{ name, context: { cluster: admin.clusters[0].name, user: name } }],
    clusters: [admin.clusters[0]], users: [{ name, user: { token } }],
  }));
  return file;
}

/**
 * A cluster's admin kubeconfig with its context renamed, so two can sit in one KUBECONFIG list; `server` and `token`
 * replace its server URL and its user's credentials.
 */
export function renamedKubeconfig(c: Cluster, context: string, file: string, server?: string, token?: string): string {
  const admin = JSON.parse(fs.readFileSync(c.kubeconfigPath, 'utf8'));
  fs.writeFileSync(file, JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': context,
    contexts: [{ name: context, context: { cluster: context, user: context } }],
    clusters: [{ name: context, cluster: { ...admin.clusters[0].cluster, ...(server && { server }) } }],
    users: [{ name: context, user: token ? { token } : admin.users[0].user }],
  }), { mode: 0o600 });
  return file;
}

/**
 * A TCP proxy to the API server (its URL given), so that a test can cut it (its listener closed, so connections
 * are refused, and the open ones dropped) and restore it on the same port, and count the connections made through
 * it: `peak` is the most that were open at once.
 */
export class ApiServerProxy {
  port = 0;
  peak = 0;
  private server: net.Server | undefined;
  private readonly open = new Set<net.Socket>();
  private readonly target: URL;

  constructor(target: URL) {
    this.target = target;
  }
  async restore(): Promise<void> {
    const server = net.createServer((client) => {
      const upstream = net.connect(Number(this.target.port), this.target.hostname);
      this.open.add(client);
      this.peak = Math.max(this.peak, this.open.size);
      client.on('close', () => { this.open.delete(client); upstream.destroy(); });
      upstream.on('close', () => client.destroy());
      for (const s of [client, upstream]) s.on('error', () => s.destroy());
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve, reject) => server.once('error', reject).listen(this.port, '127.0.0.1', resolve));
    this.port = (server.address() as net.AddressInfo).port;
    this.server = server;
  }
  async cut(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    const closed = server ? new Promise((resolve) => server.close(resolve)) : Promise.resolve();
    for (const s of this.open) s.destroy();
    await closed;
  }
}

/** The admission policy that makes pods of `:broken…` images crash-loop, in one namespace (rollback, promotion). */
export function crashLoopPolicy(name: string, ns: string): object[] {
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

/**
 * Puts crashLoopPolicy in force in `ns` and waits until the API server applies it (once its informers have it): a
 * server-side dry run of a pod of `brokenImage` gets the label. Pods of `:broken…` images then crash-loop there.
 */
export async function crashLoopInForce(kubectl: Kubectl, ns: string, brokenImage = acrImage('broken-probe')): Promise<void> {
  await kubectl(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: crashLoopPolicy(`webhook-test-crashloop-${ns}`, ns) }));
  const probe = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'probe', namespace: ns }, spec: { containers: [{ name: 'app', image: brokenImage }] } };
  await waitFor(async () => {
    const pod = JSON.parse(await kubectl(['create', '--dry-run=server', '-o', 'json', '-f', '-'], JSON.stringify(probe)));
    return pod.metadata.labels?.['webhook-test/unready'] === 'true';
  }, { timeoutMs: 60_000, what: 'the admission policy to label pods of :broken images' });
}
