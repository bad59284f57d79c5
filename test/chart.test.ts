/*
 * charts/webhook with Helm itself (built from the Go module proxy: test/helm.ts) and the real test
 * cluster:
 *
 *   - `helm lint --strict`; questions.yaml (Rancher's install form) sets only values that exist;
 *   - for the same settings, the chart and deploy/ (kustomize) produce the same objects;
 *   - `helm template … | kubectl apply --dry-run=server` succeeds, in both RBAC modes;
 *   - the NetworkPolicy's namespaces are values (defaults: Rancher's kube-system for the ingress
 *     controller, ingress-nginx on RKE1 by one value; cattle-monitoring-system for Prometheus); an empty
 *     list opens its port;
 *   - an Ingress for the hooks, off by default, with its class, host and TLS Secret from the values; the
 *     notes give the URLs on its host and warn of an Ingress without TLS and of mailTo without a mail server;
 *   - `helm install --wait` into a fresh namespace rolls out on kwok's fake nodes; the API server
 *     accepts the NetworkPolicy as rendered; the installed pod starts with its admin token file on
 *     a metrics listener other hosts reach, and its deliveries page asks for that token; a push
 *     through the installed Service upgrades a workload; `helm upgrade` changing a hook reloads it
 *     without a restart; `helm uninstall` leaves nothing behind.
 *
 * kwok's nodes run no containers, so the pod the chart deploys is stood in for the way the kubelet
 * would run it: the executable started here with the installed Deployment's arguments and
 * environment, the installed Secret as its environment (envFrom), the installed ConfigMap written
 * as the kubelet writes a ConfigMap volume (files behind a `..data` symlink swapped on update), the
 * installed admin token Secret written as a Secret volume (its items at their paths, the mount path
 * in WEBHOOK_CMD mapped to that directory), and a token of the installed ServiceAccount as its
 * credentials. The Service is checked to select the
 * Deployment's pods (its EndpointSlice lists the ready pod on the container's port), and the push
 * goes to the stand-in at the URL the chart's notes print. So the install, its RBAC, its hooks and
 * its Secret are what is proven, as deploy.test.ts proves deploy/.
 * Outside CI the tests are skipped when Helm or the cluster cannot start; with CI=true they fail.
 */
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { acrImage, acrPayload, clusterOrSkip, containerImage, deployment, kubectlFor } from './cluster/kube.ts';
import { defaultBinary, freePort, httpRequest, makeTempDir, REPO_ROOT, startWebhook, waitFor, waitForOutput, type Webhook } from './harness.ts';
import { helmOrSkip, helmRunner } from './helm.ts';
import { parseYaml } from '../webhook.ts';

const CHART = path.join(REPO_ROOT, 'charts', 'webhook');
const helm = await helmOrSkip();
const cluster = helm ? await clusterOrSkip() : undefined;
const helmHome = makeTempDir('helm-home-');

const runHelm = (args: string[]) => helmRunner(helm!, helmHome, cluster?.kubeconfigPath)(args);

function writeValues(values: object): string {
  const file = path.join(makeTempDir('chart-values-'), 'values.yaml');
  fs.writeFileSync(file, JSON.stringify(values));
  return file;
}

/** Objects from YAML or JSON documents, as kubectl parses them (one JSON document per object). */
async function parseManifests(text: string, kubectl: (a: string[], i?: string) => Promise<string>, kustomize?: string): Promise<any[]> {
  const out = kustomize
    ? await kubectl(['create', '--dry-run=client', '-o', 'json', '-k', kustomize])
    : await kubectl(['create', '--dry-run=client', '-o', 'json', '-f', '-'], text);
  const objects: any[] = JSON.parse(`[${out.trim().replace(/\n}\n{/g, '\n},\n{')}]`);
  // kubectl fills in its context's namespace where a document names none; Helm's release namespace goes there.
  if (!kustomize) for (const o of objects) if (o.metadata.namespace === 'default' && !/^\s*namespace: default$/m.test(text)) delete o.metadata.namespace;
  return objects;
}

const b64 = (s: string) => Buffer.from(s).toString('base64');

describe('charts/webhook', { skip: helm ? false : 'no helm' }, () => {
  test('helm lint --strict passes, with the defaults and with hooks', async () => {
    await runHelm(['lint', '--strict', CHART]);
    const values = writeValues({ hooks: [{ namespace: 'prod', workload: 'deployment/web', container: 'app' }] });
    const out = await runHelm(['lint', '--strict', CHART, '-f', values]);
    assert.match(out, /1 chart\(s\) linted, 0 chart\(s\) failed/);
  });

  test("Rancher's conventions: catalog annotations, app-readme.md, a form whose questions set existing values", () => {
    const chart = parseYaml(fs.readFileSync(path.join(CHART, 'Chart.yaml'), 'utf8')).value as any;
    for (const key of ['display-name', 'release-name', 'namespace', 'kube-version', 'rancher-version', 'os'])
      assert.ok(chart.annotations[`catalog.cattle.io/${key}`], `catalog.cattle.io/${key}`);
    assert.ok(fs.statSync(path.join(CHART, 'app-readme.md')).size > 0);
    const values = parseYaml(fs.readFileSync(path.join(CHART, 'values.yaml'), 'utf8')).value as any;
    const questions = (parseYaml(fs.readFileSync(path.join(CHART, 'questions.yaml'), 'utf8')).value as any).questions;
    const all = questions.flatMap((q: any) => [q, ...(q.subquestions ?? [])]);
    assert.ok(all.length >= 10);
    for (const q of all) {
      const keys = q.variable.split('.');
      const parent = keys.slice(0, -1).reduce((o: any, k: string) => o?.[k], values);
      assert.ok(parent && Object.hasOwn(parent, keys.at(-1)), `questions.yaml: ${q.variable} is not in values.yaml`);
      assert.ok(q.label && q.type, `${q.variable}: label and type`);
      if (q.default !== undefined && q.type !== 'multiline') assert.equal(String(q.default), String(parent[keys.at(-1)]), `${q.variable}: default`);
    }
  });

  test('invalid hooks are refused with the field named', async () => {
    const cases: [object, RegExp][] = [
      [{ hooks: [{ namespace: 'prod', workload: 'web', container: 'app' }] }, /hooks\[0\]\.workload "web": use <kind>\/<name>/],
      [{ hooks: [{ namespace: 'prod', workload: 'deployment/web' }] }, /hooks\[0\]\.container is required/],
      [{ hooks: [{ namespace: 'prod', workload: 'deployment/web', container: 'app', registryType: 'quay' }] }, /hooks\[0\]\.registryType "quay"/],
      [{ hooks: [{ id: 'a', namespace: 'x', workload: 'deployment/a', container: 'c' }, { id: 'a', namespace: 'y', workload: 'deployment/b', container: 'c' }] }, /hooks\[1\]\.id "a": another hook has this id/],
      [{ rbac: { mode: 'everything' } }, /rbac\.mode "everything"/],
    ];
    for (const [values, message] of cases) await assert.rejects(runHelm(['template', 'x', CHART, '-f', writeValues(values)]), message);
  });

  test('hooksYaml (the form) renders the same hooks as the hooks list; a ServiceMonitor only where the CRD is', async () => {
    const hooks = [{ namespace: 'prod', workload: 'deployment/web', container: 'app', mailTo: 'ops@example.com' }];
    const fixed = { token: { values: { 'prod-web': 'x'.repeat(32) } }, adminToken: { value: 'y'.repeat(32) } };
    const fromList = await runHelm(['template', 'r', CHART, '-f', writeValues({ ...fixed, hooks })]);
    const fromText = await runHelm(['template', 'r', CHART, '-f', writeValues({ ...fixed, hooksYaml: JSON.stringify(hooks) })]);
    assert.equal(fromText, fromList);
    assert.doesNotMatch(fromList, /kind: ServiceMonitor/);
    const withCrd = await runHelm(['template', 'r', CHART, '-f', writeValues({ ...fixed, hooks }), '--api-versions', 'monitoring.coreos.com/v1/ServiceMonitor']);
    assert.match(withCrd, /kind: ServiceMonitor[\s\S]*path: \/metrics/);
  });

  test("helmRelease is the hook's HELM_RELEASE; its namespace's Role grants what Helm needs on Secrets, the others none; rbac.mode cluster refuses it", async () => {
    const hooks = [
      { id: 'web', namespace: 'prod', workload: 'deployment/web', container: 'app', helmRelease: 'auto' },
      { id: 'blog', namespace: 'blog', workload: 'deployment/blog', container: 'app', helmRelease: 'none' },
    ];
    const out = await runHelm(['template', 'r', CHART, '-f', writeValues({ hooks })]);
    const docs = out.split(/^---$/m).map((d) => parseYaml(d).value as any).filter(Boolean);
    const configMap = docs.find((o) => o.kind === 'ConfigMap' && o.data?.['web.json']);
    const env = (file: string) => JSON.parse(configMap.data[file])[0]['pass-environment-to-command'].filter((e: any) => e.envname === 'HELM_RELEASE');
    assert.deepEqual(env('web.json'), [{ envname: 'HELM_RELEASE', source: 'string', name: 'auto' }]);
    assert.deepEqual(env('blog.json'), [{ envname: 'HELM_RELEASE', source: 'string', name: 'none' }]);
    const role = (ns: string) => docs.find((o) => o.kind === 'Role' && o.metadata.namespace === ns);
    assert.deepEqual(role('prod').rules.filter((r: any) => r.resources.includes('secrets')), [{ apiGroups: [''], resources: ['secrets'], verbs: ['list', 'create', 'patch', 'delete'] }]);
    assert.deepEqual(role('blog').rules.filter((r: any) => r.resources.includes('secrets')), []);
    await assert.rejects(runHelm(['template', 'r', CHART, '-f', writeValues({ hooks, rbac: { mode: 'cluster' } })]),
      /hooks\[0\]\.helmRelease: the release's records are Secrets, which rbac\.mode cluster does not grant; use rbac\.mode namespaced/);
  });

  test('updatePolicy is the UPDATE_POLICY of every hook that sets no policy of its own; empty sets none', async () => {
    const hooks = [
      { id: 'web', namespace: 'prod', workload: 'deployment/web', container: 'app' },
      { id: 'api', namespace: 'prod', workload: 'deployment/api', container: 'app', policy: 'glob:release-*' },
    ];
    const policies = async (values: object) => {
      const out = await runHelm(['template', 'r', CHART, '-f', writeValues({ hooks, ...values })]);
      const configMap = out.split(/^---$/m).map((d) => parseYaml(d).value as any).find((o) => o?.kind === 'ConfigMap');
      return Object.fromEntries(Object.entries(configMap.data as Record<string, string>).map(([file, text]) => {
        const env = JSON.parse(text)[0]['pass-environment-to-command'];
        return [file, env.filter((e: any) => e.envname === 'UPDATE_POLICY')];
      }));
    };
    assert.deepEqual(await policies({ updatePolicy: 'semver:^1.4' }), {
      'web.json': [{ envname: 'UPDATE_POLICY', source: 'string', name: 'semver:^1.4' }],
      'api.json': [{ envname: 'UPDATE_POLICY', source: 'string', name: 'glob:release-*' }],
    });
    assert.deepEqual(await policies({}), { 'web.json': [], 'api.json': [{ envname: 'UPDATE_POLICY', source: 'string', name: 'glob:release-*' }] });
  });

  test('an Ingress for the hooks, off by default: its class, host, paths and TLS from the values; no host, no Ingress', async () => {
    const ingress = async (values: object) => {
      const out = await runHelm(['template', 'r', CHART, '--show-only', 'templates/ingress.yaml', '-f', writeValues(values)]);
      return parseYaml(out).value as any;
    };
    await assert.rejects(ingress({}), /could not find template templates\/ingress\.yaml/);
    const on = await ingress({ ingress: { enabled: true, className: 'nginx', host: 'webhook.example.com', tls: { secretName: 'webhook-tls' } } });
    assert.equal(on.kind, 'Ingress');
    assert.equal(on.metadata.name, 'r-webhook');
    assert.deepEqual(on.spec, {
      ingressClassName: 'nginx',
      tls: [{ hosts: ['webhook.example.com'], secretName: 'webhook-tls' }],
      rules: [{ host: 'webhook.example.com', http: { paths: [
        { path: '/hooks/', pathType: 'Prefix', backend: { service: { name: 'r-webhook', port: { number: 9000 } } } },
      ] } }],
    });
    const plain = await ingress({ ingress: { enabled: true, host: 'hooks.internal', annotations: { 'cert-manager.io/cluster-issuer': 'ca' } } });
    assert.equal(plain.spec.ingressClassName, undefined, "no class: the cluster's default");
    assert.equal(plain.spec.tls, undefined);
    assert.deepEqual(plain.metadata.annotations, { 'cert-manager.io/cluster-issuer': 'ca' });
    await assert.rejects(ingress({ ingress: { enabled: true } }), /ingress\.host is required with ingress\.enabled/);
  });

  test("the NetworkPolicy: Rancher's namespaces by default, the operator's from the values, an empty list opens its port, off when disabled", async () => {
    const policy = async (values: object) => {
      const out = await runHelm(['template', 'r', CHART, '--show-only', 'templates/networkpolicy.yaml', '-f', writeValues(values)]);
      return (parseYaml(out).value as any).spec;
    };
    const namespaces = (spec: any) => spec.ingress.map((r: any) => [r.ports[0].port, r.from?.map((f: any) => f.namespaceSelector.matchLabels['kubernetes.io/metadata.name'])]);
    const defaults = await policy({});
    assert.deepEqual(defaults.policyTypes, ['Ingress']);
    assert.deepEqual(defaults.podSelector.matchLabels, { 'app.kubernetes.io/name': 'webhook', 'app.kubernetes.io/instance': 'r' });
    assert.deepEqual(namespaces(defaults), [[9000, ['kube-system']], [9100, ['cattle-monitoring-system']]]);
    const ns = (name: string) => ({ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': name } } });
    const chosen = await policy({ metrics: { port: 9200 }, networkPolicy: { hookFrom: [ns('ingress-nginx'), ns('builds')], metricsFrom: [ns('monitoring')] } });
    assert.deepEqual(namespaces(chosen), [[9000, ['ingress-nginx', 'builds']], [9200, ['monitoring']]]);
    assert.deepEqual(namespaces(await policy({ networkPolicy: { hookFrom: [] } })), [[9000, undefined], [9100, ['cattle-monitoring-system']]]);
    // RKE1 runs its ingress-nginx in the namespace ingress-nginx: one value (a question of the form).
    assert.deepEqual(namespaces(await policy({ networkPolicy: { ingressNamespace: 'ingress-nginx' } })),
      [[9000, ['ingress-nginx']], [9100, ['cattle-monitoring-system']]]);
    await assert.rejects(policy({ networkPolicy: { ingressNamespace: '' } }), /networkPolicy\.ingressNamespace is empty/);
    await assert.rejects(policy({ networkPolicy: { enabled: false } }), /could not find template templates\/networkpolicy\.yaml/);
  });
});

describe('charts/webhook on the cluster', { skip: helm && cluster ? false : 'no helm or no cluster' }, () => {
  const kubectl = cluster ? kubectlFor(cluster) : async () => '';
  const suffix = randomBytes(4).toString('hex');
  // Containing the chart's name, the release name is the objects' name too.
  const release = `webhook-${suffix}`;
  const ns = `chart-${suffix}`;
  const appNs = `chart-apps-${suffix}`;
  const getJson = async (args: string[]) => JSON.parse(await kubectl([...args, '-o', 'json']));

  before(async () => {
    for (const n of [ns, appNs]) await kubectl(['create', 'namespace', n]);
    await kubectl(['-n', appNs, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      deployment('web', [{ name: 'app', image: acrImage('v1') }, { name: 'sidecar', image: acrImage('v1', 'vpc') }], { replicas: 1 }),
      deployment('other', [{ name: 'app', image: acrImage('v1') }], { replicas: 1 }),
    ] }));
  });
  after(async () => {
    if (process.env.KEEP_NAMESPACE) return;
    await runHelm(['uninstall', release, '-n', ns, '--ignore-not-found']).catch(() => '');
    for (const n of [ns, appNs]) await kubectl(['delete', 'namespace', n, '--wait=false']).catch(() => '');
  });

  test('for the same settings, deploy/ (with -print-rbac or rbac-cluster.yaml) and the chart produce the same objects', async () => {
    const token = randomBytes(24).toString('hex');
    const adminToken = randomBytes(24).toString('hex');
    // rbac.podLogs is -print-rbac -rbac-pod-logs: get on pods/log beside the Roles' other rules.
    for (const [mode, podLogs] of [['namespaced', false], ['namespaced', true], ['cluster', false]] as const) {
      const overlay = filledDeploy(token, adminToken, mode === 'cluster');
      const fromDeploy = await parseManifests('', kubectl, overlay);
      if (mode === 'namespaced') {
        // deploy/'s Roles are what `webhook -print-rbac` prints for its hooks.
        const logs = podLogs ? ['-rbac-pod-logs'] : [];
        const rbac = execFileSync(defaultBinary(), ['-print-rbac', ...logs, '-hooks', path.join(overlay, 'hooks'), '-template', '-rbac-service-account', 'cattle-system/webhook'], {
          env: { PATH: process.env.PATH, HOOK_TOKEN: token }, encoding: 'utf8',
        });
        fromDeploy.push(...await parseManifests(rbac, kubectl));
      }
      const values = writeValues({
        image: { repository: 'webhook', tag: 'latest' },
        hooks: [{ id: 'web', namespace: 'prod', workload: 'deployment/web', container: 'app', mailTo: 'ops@example.com' }],
        token: { perHook: false, value: token },
        adminToken: { value: adminToken },
        mail: { server: 'smtp.example.com', port: 465, from: 'webhook@example.com', password: 'the password', tlsCheck: true },
        rbac: { mode, podLogs },
      });
      const rendered = await runHelm(['template', 'webhook', CHART, '-n', 'cattle-system', '-f', values]);
      const fromChart = await parseManifests(rendered, kubectl);
      const byName = (objects: any[]) => new Map(objects.map((o) => [`${o.kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`, normalise(o)]));
      const [d, c] = [byName(fromDeploy.map((o) => withNamespace(o, 'cattle-system'))), byName(fromChart.map((o) => withNamespace(o, 'cattle-system')))];
      assert.deepEqual([...c.keys()].sort(), [...d.keys()].sort(), mode);
      assert.ok(d.has(mode === 'cluster' ? 'ClusterRole//webhook' : 'Role/prod/webhook'), mode);
      assert.equal(JSON.stringify(c.get('Role/prod/webhook') ?? null).includes('pods/log'), podLogs, mode);
      for (const key of ['NetworkPolicy/cattle-system/webhook', 'Secret/cattle-system/webhook-admin']) assert.ok(d.has(key), `${mode}: ${key}`);
      for (const [key, object] of d) assert.deepEqual(c.get(key), object, `${mode}: ${key}`);
    }
  });

  test("the notes: each hook's URL on the Ingress's host; a warning for an Ingress without TLS and for mailTo without a mail server", async () => {
    // helm install renders the notes; --dry-run=client still asks the cluster its version.
    const notes = (values: object) => runHelm(['install', 'r', CHART, '-n', ns, '--dry-run=client', '-f', writeValues(values)]);
    const hooks = [{ id: 'web', namespace: 'prod', workload: 'deployment/web', container: 'app', mailTo: 'ops@example.com' }];
    const bare = await notes({ hooks });
    assert.match(bare, /^ {2}https:\/\/<host>\/hooks\/web\?token=<HOOK_TOKEN_WEB>&ns=prod/m);
    assert.match(bare, /set ingress\.enabled, ingress\.host and ingress\.tls\.secretName/);
    assert.match(bare, /WARNING: hook\(s\) web set mailTo, but mail\.server is empty: mail is off and no result\nis mailed/);
    const mailed = await notes({ hooks, mail: { server: 'smtp.example.com', from: 'webhook@example.com' },
      ingress: { enabled: true, host: 'webhook.example.com', tls: { secretName: 'webhook-tls' } } });
    assert.match(mailed, /^ {2}https:\/\/webhook\.example\.com\/hooks\/web\?token=<HOOK_TOKEN_WEB>&ns=prod/m);
    assert.doesNotMatch(mailed, /WARNING/);
    const clear = await notes({ hooks: [{ ...hooks[0], mailTo: '' }], ingress: { enabled: true, host: 'webhook.example.com' } });
    assert.match(clear, /^ {2}http:\/\/webhook\.example\.com\/hooks\/web\?/m);
    assert.match(clear, /WARNING: the Ingress for webhook\.example\.com has no ingress\.tls\.secretName/);
    assert.doesNotMatch(clear, /set mailTo/);
  });

  test('helm template | kubectl apply --dry-run=server succeeds, in both RBAC modes', async () => {
    for (const mode of ['namespaced', 'cluster']) {
      const values = writeValues({
        hooks: [{ namespace: appNs, workload: 'deployment/web', container: 'app' }], rbac: { mode }, podDisruptionBudget: { enabled: true },
        ingress: { enabled: true, className: 'nginx', host: 'webhook.example.com', tls: { secretName: 'webhook-tls' } },
      });
      const rendered = await runHelm(['template', `${release}-dry`, CHART, '-n', ns, '-f', values]);
      const objects = (await parseManifests(rendered, kubectl)).map((o) => withNamespace(o, ns));
      const out = await kubectl(['apply', '--dry-run=server', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }));
      const kinds = mode === 'cluster' ? ['clusterrole', 'clusterrolebinding'] : ['role', 'rolebinding'];
      for (const kind of ['serviceaccount', 'secret', 'configmap', 'service', 'deployment', 'poddisruptionbudget', 'networkpolicy', 'ingress', ...kinds])
        assert.match(out, new RegExp(`^${kind}(\\.[a-z0-9.]+)?/\\S+ created \\(server dry run\\)$`, 'm'), out);
    }
  });

  describe('installed', () => {
    let wh: Webhook | undefined;
    let hooksDir = '';
    let notes = '';
    let metricsAt = 0;
    const values = (container: string) => writeValues({ hooks: [{ id: 'web', namespace: appNs, workload: 'deployment/web', container, mailTo: 'ops@example.com' }] });
    after(async () => wh?.stop());

    test('helm install rolls out; the Service selects its pod; a push through it upgrades the workload', async () => {
      notes = await runHelm(['install', release, CHART, '-n', ns, '-f', values('app'), '--wait', '--timeout', '2m']);
      assert.match(notes, /STATUS: deployed/);
      const podLabels = (await getJson(['-n', ns, 'get', 'deployment', release])).spec.template.metadata.labels;
      const svc = await getJson(['-n', ns, 'get', 'service', release]);
      for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(podLabels[k], v, `selector ${k}`);
      // replicaCount's default: two replicas, both ready behind the Service. The EndpointSlice
      // controller catches up with the pods' readiness after helm's --wait has seen the Deployment.
      const readyEndpoints = async () => {
        const slices = await getJson(['-n', ns, 'get', 'endpointslices', '-l', `kubernetes.io/service-name=${release}`]);
        return { slices, endpoints: slices.items.flatMap((s: any) => s.endpoints ?? []).filter((e: any) => e.conditions?.ready) };
      };
      const { slices, endpoints } = await waitFor(async () => {
        const found = await readyEndpoints();
        return found.endpoints.length >= 2 && found;
      }, { timeoutMs: 60_000, what: 'two ready endpoints behind the Service' });
      assert.equal(endpoints.length, 2, JSON.stringify(slices));
      assert.notEqual(endpoints[0].nodeName, endpoints[1].nodeName, 'spread one per node');
      assert.deepEqual(slices.items[0].ports.map((p: any) => [p.name, p.port]), [['http', 9000]]);
      wh = await standInPod();
      const metrics = await httpRequest(metricsAt, '/metrics');
      assert.match(metrics.body, /webhook_hooks_loaded 1/);
      // The pod as installed starts on a listener other hosts reach, its deliveries page asking for
      // the token of the installed Secret.
      assert.match(wh.output(), new RegExp(`serving metrics on http://(\\[::\\]|0\\.0\\.0\\.0):${metricsAt}/metrics`));
      assert.match(wh.output(), /serving deliveries on \S+ \(asking for the -admin-token\)/);
      const refused = await httpRequest(metricsAt, '/deliveries');
      assert.equal(refused.status, 401);
      assert.match(String(refused.headers['www-authenticate']), /^Basic /);
      const bearer = { Authorization: `Bearer ${await adminToken()}` };
      assert.equal((await httpRequest(metricsAt, '/deliveries.json', { headers: bearer })).status, 200);
      assert.ok(!wh.output().includes(await adminToken()), 'the admin token is not logged');
      assert.match(notes, new RegExp(`get secret ${release}-admin -o jsonpath='\\{\\.data\\.token\\}'`), "the notes say where the page's token is");
      assert.equal((await wh.request('/metrics')).status, 404, 'the hooks port does not serve /metrics');
      const url = /https:\/\/<host>(\/hooks\/web\?\S+)&repo_type=</.exec(notes)?.[1];
      assert.ok(url, notes);
      const res = await push(`${url!.replace('<HOOK_TOKEN_WEB>', await token())}&repo_type=regionalregistry`, acrPayload('v2'));
      assert.equal(res.status, 200, res.body);
      assert.equal(containerImage(await getJson(['-n', appNs, 'get', 'deployment/web']), 'app'), acrImage('v2'));
      // Least privilege: the ServiceAccount may change that workload and no other.
      assert.equal(await canI('patch', 'deployments/web'), 'yes');
      assert.equal(await canI('patch', 'deployments/other'), 'no');
      assert.equal(await canI('get', 'secrets'), 'no');
    });

    test('the API server accepts the NetworkPolicy as rendered; it selects the installed pods', async () => {
      const stored = (await getJson(['-n', ns, 'get', 'networkpolicy', release])).spec;
      const rendered = (parseYaml(await runHelm(['template', release, CHART, '-n', ns, '-f', values('app'), '--show-only', 'templates/networkpolicy.yaml'])).value as any).spec;
      assert.deepEqual(stored, rendered);
      const from = (name: string) => [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': name } } }];
      assert.deepEqual(stored.ingress, [
        { ports: [{ port: 9000, protocol: 'TCP' }], from: from('kube-system') },
        { ports: [{ port: 9100, protocol: 'TCP' }], from: from('cattle-monitoring-system') },
      ]);
      const selector = Object.entries(stored.podSelector.matchLabels).map(([k, v]) => `${k}=${v}`).join(',');
      const pods = (await getJson(['-n', ns, 'get', 'pods', '-l', selector])).items.filter((p: any) => !p.metadata.deletionTimestamp);
      assert.equal(pods.length, 2);
      const c = (await getJson(['-n', ns, 'get', 'deployment', release])).spec.template.spec.containers[0];
      assert.deepEqual(c.ports.map((p: any) => p.containerPort), stored.ingress.map((r: any) => r.ports[0].port), "the policy's ports are the container's");
    });

    test('helm upgrade changing the hook: reloaded by the running pod, no restart, the token kept', async () => {
      const before = await getJson(['-n', ns, 'get', 'deployment', release]);
      const tokenBefore = await token();
      await runHelm(['upgrade', release, CHART, '-n', ns, '-f', values('sidecar'), '--wait', '--timeout', '2m']);
      const afterUpgrade = await getJson(['-n', ns, 'get', 'deployment', release]);
      assert.equal(afterUpgrade.metadata.generation, before.metadata.generation, 'the pod template is unchanged: no restart');
      assert.equal(await token(), tokenBefore);
      // The kubelet's update of the ConfigMap volume, which the running service watches; marked first, so that a
      // reload logged before is not taken for this one.
      const mark = wh!.output().length;
      writeConfigMapVolume(hooksDir, (await getJson(['-n', ns, 'get', 'configmap', `${release}-hooks`])).data);
      await waitForOutput(wh!, /reloaded 1 hook\(s\) from 1 file\(s\)/, 10_000, mark);
      const q = (container: string) => `/hooks/web?token=${tokenBefore}&ns=${appNs}&workload=deployment/web&container=${container}&repo_type=regionalregistry`;
      const res = await push(q('sidecar'), acrPayload('v3'));
      assert.equal(res.status, 200, res.body);
      assert.equal(containerImage(await getJson(['-n', appNs, 'get', 'deployment/web']), 'sidecar'), acrImage('v3'));
      assert.equal((await push(q('app'), acrPayload('v4'))).status, 500, 'the old container is no longer accepted');
    });

    test('helm uninstall leaves nothing behind', async () => {
      await wh?.stop();
      wh = undefined;
      await runHelm(['uninstall', release, '-n', ns, '--wait', '--timeout', '2m']);
      const selector = `app.kubernetes.io/instance=${release}`;
      const kinds = 'deployments,replicasets,pods,services,configmaps,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets,networkpolicies';
      for (const n of [ns, appNs]) {
        const left = () => kubectl(['-n', n, 'get', kinds, '-l', selector, '-o', 'name']).then((out) => out.trim());
        // Helm waits for what it deleted; the Deployment's ReplicaSets and pods go after it, with
        // the garbage collector.
        await waitFor(async () => ((await left()) === '' ? true : undefined), { timeoutMs: 60_000, what: `nothing left in ${n}` }).catch(() => undefined);
        assert.equal(await left(), '', `left in ${n}`);
      }
      assert.equal((await kubectl(['get', 'clusterroles,clusterrolebindings', '-l', selector, '-o', 'name'])).trim(), '');
      assert.equal((await kubectl(['-n', ns, 'get', 'secrets', '-o', 'name'])).split('\n').filter((s) => s.includes(release)).join(), '', 'no release record left');
    });

    async function adminToken(): Promise<string> {
      const secret = await getJson(['-n', ns, 'get', 'secret', `${release}-admin`]);
      return Buffer.from(secret.data.token, 'base64').toString();
    }

    async function token(): Promise<string> {
      const secret = await getJson(['-n', ns, 'get', 'secret', `${release}-env`]);
      return Buffer.from(secret.data.HOOK_TOKEN_WEB, 'base64').toString();
    }

    function push(urlPath: string, body: string) {
      return wh!.request(urlPath, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });
    }

    function canI(verb: string, resource: string): Promise<string> {
      return new Promise((resolve) => {
        execFile(cluster!.kubectl, ['--kubeconfig', cluster!.kubeconfigPath, 'auth', 'can-i', verb, resource, '-n', appNs, '--as', `system:serviceaccount:${ns}:${release}`],
          (_e, stdout, stderr) => resolve(stdout.trim() || stderr.trim()));
      });
    }

    /** The installed pod as the kubelet would run it (see the header): its arguments, environment, volume and account. */
    async function standInPod(): Promise<Webhook> {
      const d = await getJson(['-n', ns, 'get', 'deployment', release]);
      const pod = d.spec.template.spec;
      const c = pod.containers[0];
      const mount = c.volumeMounts.find((m: any) => pod.volumes.find((v: any) => v.name === m.name)?.configMap);
      const configMap = pod.volumes.find((v: any) => v.name === mount.name).configMap.name;
      hooksDir = makeTempDir('chart-volume-');
      writeConfigMapVolume(hooksDir, (await getJson(['-n', ns, 'get', 'configmap', configMap])).data);
      const env: Record<string, string> = Object.fromEntries(c.env.map((e: any) => [e.name, e.value]));
      for (const from of c.envFrom) {
        const secret = await getJson(['-n', ns, 'get', 'secret', from.secretRef.name]);
        for (const [k, v] of Object.entries(secret.data)) env[k] = Buffer.from(v as string, 'base64').toString();
      }
      // Secret volumes as the kubelet writes them (each item's key at its path), the pod's mount
      // path in WEBHOOK_CMD becoming the directory here.
      for (const m of c.volumeMounts) {
        const secretVolume = pod.volumes.find((v: any) => v.name === m.name)?.secret;
        if (!secretVolume) continue;
        const data = (await getJson(['-n', ns, 'get', 'secret', secretVolume.secretName])).data;
        const dir = makeTempDir('chart-secret-volume-');
        for (const item of secretVolume.items) fs.writeFileSync(path.join(dir, item.path), Buffer.from(data[item.key], 'base64'));
        assert.ok(env.WEBHOOK_CMD.includes(`${m.mountPath}/`), `WEBHOOK_CMD names ${m.mountPath}`);
        env.WEBHOOK_CMD = env.WEBHOOK_CMD.replaceAll(m.mountPath, dir);
      }
      assert.match(env.WEBHOOK_CMD, / -admin-token-file \S+\/token /);
      // The image's arguments (its CMD), unless the Deployment gives its own; the mount path is hooksDir here.
      const cmd: string[] = c.args ?? JSON.parse(/^CMD\s+(.+)$/m.exec(fs.readFileSync(path.join(REPO_ROOT, 'Dockerfile'), 'utf8'))![1]);
      const at = cmd.indexOf('-hooks');
      assert.equal(cmd[at + 1], mount.mountPath);
      const args = [...cmd.slice(0, at), ...cmd.slice(at + 2)].filter((a) => a !== '-verbose');
      const saToken = (await kubectl(['create', 'token', pod.serviceAccountName, '-n', ns, '--duration=10m'])).trim();
      const admin = JSON.parse(fs.readFileSync(cluster!.kubeconfigPath, 'utf8'));
      const kubeconfig = path.join(makeTempDir('chart-sa-'), 'kubeconfig.json');
      fs.writeFileSync(kubeconfig, JSON.stringify({
        'current-context': 'pod', contexts: [{ name: 'pod', context: { cluster: admin.clusters[0].name, user: 'pod' } }],
        clusters: [admin.clusters[0]], users: [{ name: 'pod', user: { token: saToken } }],
      }));
      // The pod's own port for /metrics becomes a free port here, still on every address as in the
      // pod, so the service's refusal of an unguarded deliveries page applies (the container port
      // is checked to be the one the flag names).
      const metricsPort = c.ports.find((p: any) => p.name === 'metrics').containerPort;
      assert.ok(env.WEBHOOK_CMD.includes(`-metrics-listen :${metricsPort} `), env.WEBHOOK_CMD);
      metricsAt = await freePort();
      env.WEBHOOK_CMD = env.WEBHOOK_CMD.replace(`-metrics-listen :${metricsPort} `, `-metrics-listen :${metricsAt} `);
      return startWebhook({ hooks: hooksDir, args: [...args, '-kubeconfig', kubeconfig], env: { ...env, PATH: process.env.PATH ?? '' } });
    }
  });
});

/** A copy of deploy/ with its placeholders filled in (and, for `cluster`, rbac-cluster.yaml among its resources). */
function filledDeploy(token: string, adminToken: string, cluster: boolean): string {
  const fill = (text: string) => text
    .replaceAll('<namespace>', 'prod').replaceAll('<workload>', 'deployment/web').replaceAll('<container>', 'app')
    .replaceAll('<mail-to>', 'ops@example.com').replaceAll('<hook-token>', token).replaceAll('<admin-token>', adminToken)
    .replaceAll('<base64-of-smtp-host>', b64('smtp.example.com')).replaceAll('<base64-of-sender-address>', b64('webhook@example.com'))
    .replaceAll('<base64-of-smtp-password>', b64('the password'));
  const overlay = makeTempDir('chart-deploy-');
  fs.cpSync(path.join(REPO_ROOT, 'deploy'), overlay, { recursive: true });
  for (const f of fs.readdirSync(overlay, { recursive: true, encoding: 'utf8' })) {
    const file = path.join(overlay, f);
    if (fs.statSync(file).isFile()) fs.writeFileSync(file, fill(fs.readFileSync(file, 'utf8')));
  }
  if (cluster) {
    const k = path.join(overlay, 'kustomization.yaml');
    const text = fs.readFileSync(k, 'utf8');
    assert.match(text, /^ {2}# - rbac-cluster\.yaml$/m, 'deploy/kustomization.yaml offers rbac-cluster.yaml');
    fs.writeFileSync(k, text.replace(/^ {2}# - rbac-cluster\.yaml$/m, '  - rbac-cluster.yaml'));
  }
  return overlay;
}

/** Writes a ConfigMap volume as the kubelet does: the files in a fresh directory behind `..data`, swapped at once. */
function writeConfigMapVolume(dir: string, data: Record<string, string>): void {
  const stamp = `..${Date.now()}_${randomBytes(4).toString('hex')}`;
  fs.mkdirSync(path.join(dir, stamp));
  for (const [name, text] of Object.entries(data)) fs.writeFileSync(path.join(dir, stamp, name), text);
  const old = fs.existsSync(path.join(dir, '..data')) ? fs.readlinkSync(path.join(dir, '..data')) : undefined;
  fs.symlinkSync(stamp, path.join(dir, '..data_tmp'));
  fs.renameSync(path.join(dir, '..data_tmp'), path.join(dir, '..data'));
  for (const name of Object.keys(data)) if (!fs.existsSync(path.join(dir, name))) fs.symlinkSync(path.join('..data', name), path.join(dir, name));
  for (const name of fs.readdirSync(dir)) if (!name.startsWith('..') && !(name in data)) fs.rmSync(path.join(dir, name));
  if (old) fs.rmSync(path.join(dir, old), { recursive: true, force: true });
}

function withNamespace(o: any, ns: string): any {
  const clusterScoped = ['ClusterRole', 'ClusterRoleBinding', 'Namespace'];
  return clusterScoped.includes(o.kind) || o.metadata.namespace ? o : { ...o, metadata: { ...o.metadata, namespace: ns } };
}

/**
 * An object with what Helm adds as such left out: the objects' own labels and annotations
 * (app.kubernetes.io/managed-by, helm.sh/chart…), the release's instance label in selectors and
 * pod labels, and the pod template's checksum annotation. Hook files are compared as the JSON
 * they hold.
 */
function normalise(o: any): any {
  const copy = JSON.parse(JSON.stringify(o));
  delete copy.metadata.labels;
  delete copy.metadata.annotations;
  const strip = (v: any): void => {
    if (!v || typeof v !== 'object') return;
    if (!Array.isArray(v)) delete v['app.kubernetes.io/instance'];
    for (const child of Object.values(v)) strip(child);
  };
  strip(copy);
  const template = copy.spec?.template?.metadata;
  if (template?.annotations) {
    delete template.annotations['checksum/env'];
    if (Object.keys(template.annotations).length === 0) delete template.annotations;
  }
  if (copy.kind === 'ConfigMap') copy.data = Object.fromEntries(Object.entries(copy.data).map(([k, v]) => [k, JSON.parse(v as string)]));
  return copy;
}
