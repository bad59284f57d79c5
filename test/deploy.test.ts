/*
 * deploy/ (the kustomization) on the real test cluster (test/cluster: kube-apiserver, controllers
 * and scheduler, kwok's fake nodes):
 *
 *   - rendered, it is what the issue asks for and agrees with the image (user, port, hooks dir,
 *     metrics port apart from the Service's); its NetworkPolicy lets only the ingress controller's
 *     namespace reach the hooks and only the monitoring namespace the metrics port, and the
 *     overlay patch kustomization.yaml documents changes both;
 *   - as deployed (the Deployment's WEBHOOK_CMD, its admin token Secret written as the kubelet
 *     writes a Secret volume), the service starts on a non-loopback metrics listener and its
 *     deliveries page asks for the token; the shipped <admin-token> placeholder stops it, naming
 *     the file;
 *   - its seed hook, as shipped, is refused by the real executable, naming each placeholder its
 *     rule compares against; filled in, it loads, and -print-rbac turns it into a Role;
 *   - `kubectl apply --dry-run=server -k deploy/` succeeds as shipped (namespace cattle-system);
 *   - applied for real into a fresh namespace through an overlay (namespace + nameSuffix), under
 *     the "restricted" Pod Security Standard, the Deployment rolls out on the fake nodes (kwok
 *     fakes the pods: the image need not be pullable); the Roles -print-rbac generates for its
 *     ServiceAccount allow exactly the hook's workload; the cluster-wide option follows the
 *     ServiceAccount to the overlay's namespace; the API server accepts the NetworkPolicy as it is
 *     and it selects the rolled-out pods (the test cluster enforces none: what is applied is
 *     asserted, not the traffic it stops);
 *   - everything it created is deleted afterwards.
 *
 * That the generated Roles are enough for an upgrade, and refuse any other workload, is proven in
 * test/e2e.test.ts; the cluster-wide option in test/upgrade.test.ts.
 * Outside CI the cluster tests are skipped when the cluster cannot start; with CI=true they fail.
 */
import { execFile, execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ensureCluster } from './cluster/cluster.ts';
import { defaultBinary, freePort, httpRequest, makeTempDir, REPO_ROOT, spawnWebhook, startWebhook, waitFor, waitForOutput } from './harness.ts';

const DEPLOY = path.join(REPO_ROOT, 'deploy');

const cluster = await ensureCluster().catch((e: Error) => {
  if (process.env.CI) throw e;
  process.stderr.write(`\n#### cluster unavailable, SKIPPING deploy tests: ${e.message}\n\n`);
  return undefined;
});

/** `webhook -print-rbac` for the hooks in `dir`: its YAML (stdout). */
function printRbac(dir: string, serviceAccount: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(defaultBinary(), ['-print-rbac', '-hooks', dir, '-rbac-service-account', serviceAccount], (error, stdout, stderr) => {
      if (error) reject(new Error(`webhook -print-rbac: ${stderr || error.message}`));
      else resolve(stdout);
    });
  });
}

function kubectl(args: string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(cluster!.kubectl, ['--kubeconfig', cluster!.kubeconfigPath, ...args], { maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`kubectl ${args.join(' ')}: ${stderr || error.message}`));
      else resolve(stdout + stderr);
    });
    if (input !== undefined) child.stdin!.end(input);
  });
}

/** The objects a kustomization renders to (kubectl prints one JSON document per object). */
async function render(dir: string): Promise<any[]> {
  const out = await kubectl(['create', '--dry-run=client', '--output', 'json', '--kustomize', dir]);
  return JSON.parse(`[${out.trim().replace(/\n}\n{/g, '\n},\n{')}]`);
}

/** The final stage's instruction (USER, EXPOSE, CMD …) in the Dockerfile, its argument text. */
function dockerfile(instruction: string): string {
  const text = fs.readFileSync(path.join(REPO_ROOT, 'Dockerfile'), 'utf8');
  const final = text.slice(text.lastIndexOf('\nFROM '));
  const m = new RegExp(`^${instruction}\\s+(.+)$`, 'm').exec(final);
  assert.ok(m, `Dockerfile: no ${instruction} in the final stage`);
  return m[1].trim();
}

describe('deploy/', { skip: cluster ? false : 'no cluster' }, () => {
  let objects: any[] = [];
  /** The one object of this kind (and name). */
  const find = (kind: string, name?: string) => {
    const found = objects.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
    assert.equal(found.length, 1, `one ${kind} ${name ?? ''}`);
    return found[0];
  };
  /** deploy/hooks/web.json with its placeholders filled in, in a directory of its own. */
  const filledHooks = (ns = 'prod') => {
    const dir = makeTempDir('deploy-hooks-');
    fs.writeFileSync(path.join(dir, 'web.json'), find('ConfigMap').data['web.json']
      .replace('<namespace>', ns).replace('<workload>', 'deployment/web').replace('<container>', 'app').replace('<mail-to>', 'ops@example.com'));
    return dir;
  };

  before(async () => {
    objects = await render(DEPLOY);
    if (!fs.existsSync(path.join(REPO_ROOT, 'dist', 'webhook'))) {
      execFileSync(process.execPath, ['--disable-warning=ExperimentalWarning', path.join(REPO_ROOT, 'scripts', 'build.ts')], { stdio: 'inherit' });
    }
  });

  test('renders the ServiceAccount, the hooks, the two secrets, the Deployment, its PodDisruptionBudget, the Service, the NetworkPolicy and the record ledger\'s Role, in cattle-system; no cluster-wide role', () => {
    assert.deepEqual(objects.map((o) => `${o.kind}/${o.metadata.name}`).sort(), [
      'ConfigMap/webhook-hooks', 'Deployment/webhook', 'NetworkPolicy/webhook', 'PodDisruptionBudget/webhook', 'Role/webhook-records',
      'RoleBinding/webhook-records', 'Secret/webhook-admin', 'Secret/webhook-env', 'Service/webhook', 'ServiceAccount/webhook',
    ]);
    // The ledger's Role: its one ConfigMap, bound to the service's account (kustomize moved both into cattle-system).
    const role = objects.find((o) => o.kind === 'Role');
    assert.deepEqual(role.rules, [
      { apiGroups: [''], resources: ['configmaps'], resourceNames: ['webhook-records'], verbs: ['get', 'patch'] },
      { apiGroups: [''], resources: ['configmaps'], verbs: ['create'] },
    ]);
    assert.deepEqual(objects.find((o) => o.kind === 'RoleBinding').subjects, [{ kind: 'ServiceAccount', name: 'webhook', namespace: 'cattle-system' }]);
    for (const o of objects) assert.equal(o.metadata.namespace, 'cattle-system', `${o.kind} namespace`);
    // The ConfigMap is generated from deploy/hooks/, the files -print-rbac reads.
    assert.equal(find('ConfigMap').data['web.json'], fs.readFileSync(path.join(DEPLOY, 'hooks', 'web.json'), 'utf8'));
  });

  test('the Deployment: hardened, probed on /healthz, sized, and consistent with the image', () => {
    const d = find('Deployment');
    const pod = d.spec.template.spec;
    assert.equal(pod.serviceAccount, 'webhook');
    assert.equal(pod.serviceAccountName, 'webhook');
    assert.equal(pod.securityContext.runAsNonRoot, true);
    assert.equal(pod.securityContext.seccompProfile.type, 'RuntimeDefault');
    // The image's USER, so runAsNonRoot can be checked by the kubelet and files stay readable.
    assert.equal(`${pod.securityContext.runAsUser}:${pod.securityContext.runAsGroup}`, dockerfile('USER'));
    assert.equal(pod.containers.length, 1);
    const c = pod.containers[0];
    assert.equal(c.image, 'webhook:latest');
    assert.deepEqual(c.securityContext, { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: { drop: ['ALL'] } });
    // Port, probes and the hooks directory are the image's (EXPOSE, CMD's -hooks).
    const port = Number(dockerfile('EXPOSE'));
    assert.deepEqual(c.ports, [{ name: 'http', containerPort: port, protocol: 'TCP' }, { name: 'metrics', containerPort: 9100, protocol: 'TCP' }]);
    // Metrics are scraped from the pod, on the port given to -metrics-listen; the Service has only the hooks.
    assert.deepEqual(d.spec.template.metadata.annotations, { 'prometheus.io/scrape': 'true', 'prometheus.io/port': '9100', 'prometheus.io/path': '/metrics' });
    for (const probe of [c.readinessProbe, c.livenessProbe]) assert.deepEqual(probe.httpGet, { path: '/healthz', port });
    const cmd: string[] = JSON.parse(dockerfile('CMD'));
    const hooksDir = cmd[cmd.indexOf('-hooks') + 1];
    const mounts = Object.fromEntries(c.volumeMounts.map((m: any) => [m.mountPath, m]));
    const volumes = Object.fromEntries(pod.volumes.map((v: any) => [v.name, v]));
    assert.equal(volumes[mounts[hooksDir].name].configMap.name, find('ConfigMap').metadata.name);
    assert.equal(mounts[hooksDir].readOnly, true);
    assert.deepEqual(volumes[mounts['/tmp'].name].emptyDir, {});
    // The deliveries page's token: a file of its own Secret, only its key `token`, read-only.
    assert.deepEqual(volumes[mounts['/etc/webhook/admin'].name].secret, { secretName: 'webhook-admin', items: [{ key: 'token', path: 'token' }] });
    assert.equal(mounts['/etc/webhook/admin'].readOnly, true);
    assert.deepEqual(c.env, [{ name: 'WEBHOOK_CMD', value: '-template -metrics-listen :9100 -admin-token-file /etc/webhook/admin/token -shutdown-delay 5s' }]);
    assert.deepEqual(c.envFrom, [{ secretRef: { name: 'webhook-env' } }], 'the admin token is not in the environment');
    assert.deepEqual(c.resources, { requests: { cpu: '50m', memory: '128Mi' }, limits: { cpu: '1', memory: '256Mi' } });
    assert.equal(c.args, undefined, 'the image\'s default arguments are used');
    const svc = find('Service');
    assert.deepEqual(svc.spec.ports, [{ name: 'http', port, targetPort: 'http', protocol: 'TCP' }]);
    assert.deepEqual(svc.spec.selector, d.spec.selector.matchLabels);
  });

  test('two replicas, one per node, kept through drains; unready at the first 503 of a stopping pod, whose grace covers the delay', () => {
    const d = find('Deployment');
    const pod = d.spec.template.spec;
    assert.equal(d.spec.replicas, 2);
    assert.deepEqual(d.spec.strategy.rollingUpdate, { maxSurge: 1, maxUnavailable: 0 });
    assert.deepEqual(pod.topologySpreadConstraints, [{
      maxSkew: 1, topologyKey: 'kubernetes.io/hostname', whenUnsatisfiable: 'DoNotSchedule', nodeTaintsPolicy: 'Honor',
      labelSelector: { matchLabels: d.spec.selector.matchLabels }, matchLabelKeys: ['pod-template-hash'],
    }]);
    const pdb = find('PodDisruptionBudget');
    assert.equal(pdb.spec.minAvailable, 1);
    assert.deepEqual(pdb.spec.selector, d.spec.selector);
    const c = pod.containers[0];
    assert.equal(c.readinessProbe.failureThreshold, 1);
    const delay = Number(/-shutdown-delay (\d+)s/.exec(c.env[0].value)![1]);
    assert.ok(c.readinessProbe.periodSeconds < delay, 'probed at least once within the delay');
    assert.ok(pod.terminationGracePeriodSeconds >= delay + 25, 'the grace covers the delay and -shutdown-grace');
  });

  test('the Secrets: webhook-env holds HOOK_TOKEN and the MAIL_* variables the executable reads; webhook-admin the admin token, a placeholder', () => {
    assert.deepEqual(Object.keys(find('Secret', 'webhook-env').stringData).sort(), ['HOOK_TOKEN', 'MAIL_FROM', 'MAIL_PASSWORD', 'MAIL_SMTP_PORT', 'MAIL_SMTP_SERVER', 'MAIL_TLS_CHECK']);
    assert.deepEqual(find('Secret', 'webhook-admin').stringData, { token: '<admin-token>' });
  });

  test('the NetworkPolicy: the hooks port from kube-system (the ingress controller), the metrics port from cattle-monitoring-system, nothing else', () => {
    const d = find('Deployment');
    const c = d.spec.template.spec.containers[0];
    const from = (ns: string) => [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': ns } } }];
    assert.deepEqual(find('NetworkPolicy').spec, {
      podSelector: d.spec.selector,
      policyTypes: ['Ingress'],
      ingress: [
        { from: from('kube-system'), ports: [{ port: 9000, protocol: 'TCP' }] },
        { from: from('cattle-monitoring-system'), ports: [{ port: 9100, protocol: 'TCP' }] },
      ],
    });
    // Exactly the container's two ports: the hooks' and -metrics-listen's.
    assert.deepEqual(c.ports.map((p: any) => p.containerPort), [9000, 9100]);
    assert.match(c.env[0].value, / -metrics-listen :9100 /);
  });

  test('the overlay patch kustomization.yaml shows changes the two namespaces', async () => {
    const text = fs.readFileSync(path.join(DEPLOY, 'kustomization.yaml'), 'utf8');
    const shown = /^# {3}patches:\n(?:# {5}.*\n)+/m.exec(text);
    assert.ok(shown, 'kustomization.yaml: the patches example');
    const overlay = makeTempDir('deploy-overlay-netpol-');
    fs.writeFileSync(path.join(overlay, 'kustomization.yaml'), [
      'apiVersion: kustomize.config.k8s.io/v1beta1', 'kind: Kustomization', 'resources:', `  - ${path.relative(overlay, DEPLOY)}`,
      shown[0].replace(/^# {3}/gm, ''),
    ].join('\n'));
    const policy = (await render(overlay)).find((o) => o.kind === 'NetworkPolicy');
    assert.deepEqual(policy.spec.ingress.map((r: any) => [r.ports[0].port, r.from[0].namespaceSelector.matchLabels['kubernetes.io/metadata.name']]),
      [[9000, 'ingress-nginx'], [9100, 'monitoring']]);
  });

  test('as deployed, the service starts with the admin token file, on a metrics listener other hosts reach, and the deliveries page asks for the token; the shipped placeholder stops it', async () => {
    const pod = find('Deployment').spec.template.spec;
    const c = pod.containers[0];
    const cmd: string = c.env.find((e: any) => e.name === 'WEBHOOK_CMD').value;
    // The Secret volume as the kubelet writes it: each item's key at its path under the mount.
    const mount = c.volumeMounts.find((m: any) => pod.volumes.find((v: any) => v.name === m.name).secret);
    const volume = pod.volumes.find((v: any) => v.name === mount.name).secret;
    const secretDir = makeTempDir('deploy-admin-volume-');
    const writeVolume = (data: Record<string, string>) => {
      for (const item of volume.items) fs.writeFileSync(path.join(secretDir, item.path), data[item.key]);
    };
    const metricsPort = await freePort();
    // The pod's paths and port become this machine's: still every address (:PORT), as in the pod.
    const local = cmd.replace('-metrics-listen :9100', `-metrics-listen :${metricsPort}`).replaceAll(mount.mountPath, secretDir);
    assert.match(local, new RegExp(`-metrics-listen :${metricsPort} -admin-token-file ${secretDir}/token `));
    const env = { ...find('Secret', 'webhook-env').stringData, HOOK_TOKEN: randomBytes(24).toString('hex'), WEBHOOK_CMD: local };

    writeVolume(find('Secret', 'webhook-admin').stringData);
    const shipped = await spawnWebhook({ hooks: filledHooks(), env });
    assert.equal((await shipped.exited).code, 2, shipped.output());
    assert.ok(shipped.stderr().startsWith(`invalid value "${secretDir}/token" for flag -admin-token-file: the file still holds the placeholder "<admin-token>"; replace it\n`), shipped.stderr());

    const adminToken = randomBytes(24).toString('hex');
    writeVolume({ token: adminToken });
    const wh = await startWebhook({ hooks: filledHooks(), env });
    try {
      await waitForOutput(wh, /serving deliveries on http:\/\/\S+:\d+\/deliveries \(asking for the -admin-token\)/);
      assert.match(wh.output(), new RegExp(`serving metrics on http://(\\[::\\]|0\\.0\\.0\\.0):${metricsPort}/metrics`));
      const refused = await httpRequest(metricsPort, '/deliveries');
      assert.equal(refused.status, 401);
      assert.match(String(refused.headers['www-authenticate']), /^Basic /);
      const basic = `Basic ${Buffer.from(`anyone:${adminToken}`).toString('base64')}`;
      assert.equal((await httpRequest(metricsPort, '/deliveries', { headers: { Authorization: basic } })).status, 200);
      assert.equal((await httpRequest(metricsPort, '/metrics')).status, 200, 'scrapers need no token');
      assert.ok(!wh.output().includes(adminToken), 'the token is not logged');
    } finally {
      await wh.stop();
    }
  });

  test('the seed hook as shipped is refused, naming every placeholder its rule compares against; filled in, it loads and -print-rbac grants its workload', async () => {
    const configMap = find('ConfigMap');
    const env = { ...find('Secret', 'webhook-env').stringData, WEBHOOK_CMD: '-template' };
    assert.deepEqual(Object.keys(configMap.data), ['web.json']);
    const hooksDir = (text: string) => {
      const dir = makeTempDir('deploy-hooks-');
      fs.writeFileSync(path.join(dir, 'web.json'), text);
      return dir;
    };
    const shipped = await spawnWebhook({ hooks: hooksDir(configMap.data['web.json']), env });
    assert.equal((await shipped.exited).code, 1, shipped.output());
    // The token placeholder comes from the Secret through the template; it is named, being no secret.
    for (const [field, placeholder] of [['and[0]', '<hook-token>'], ['and[1]', '<namespace>'], ['and[2]', '<workload>'], ['and[3]', '<container>']]) {
      assert.match(shipped.output(), new RegExp(`web\\.json:\\d+: hook "web": trigger-rule\\.${field.replace(/[[\]]/g, '\\$&')}\\.match\\.value: still holds the placeholder "${placeholder}"; replace it`), placeholder);
    }
    const filled = configMap.data['web.json']
      .replace('<namespace>', 'prod').replace('<workload>', 'deployment/web').replace('<container>', 'app').replace('<mail-to>', 'ops@example.com');
    const token = randomBytes(24).toString('hex');
    // The hook filled in and the token set, the MAIL_* placeholders only turn the mail off.
    const mailOff = await startWebhook({ hooks: hooksDir(filled), env: { ...env, HOOK_TOKEN: token } });
    await mailOff.stop();
    for (const v of ['MAIL_SMTP_SERVER', 'MAIL_FROM', 'MAIL_PASSWORD']) assert.match(mailOff.output(), new RegExp(`mail is off: ${v}: not valid base64`));
    const b64 = (s: string) => Buffer.from(s).toString('base64');
    const wh = await startWebhook({ hooks: hooksDir(filled), env: { ...env, HOOK_TOKEN: token, MAIL_SMTP_SERVER: b64('smtp.example.com'), MAIL_FROM: b64('webhook@example.com'), MAIL_PASSWORD: b64('pw') } });
    await wh.stop();
    assert.doesNotMatch(wh.output(), /placeholder|error:/, wh.output());
    assert.match(wh.output(), /loaded 1 hook\(s\) from 1 file\(s\): web/);
    assert.match(wh.output(), /mail results through smtp\.example\.com:465/);
    const rbac = await printRbac(hooksDir(filled), 'cattle-system/webhook');
    assert.match(rbac, /^#   hook "web": deployment\/web in namespace prod$/m);
    assert.match(rbac, /^kind: Role\nmetadata:\n  name: "webhook"\n  namespace: "prod"\n/m);
    assert.match(rbac, /^  - apiGroups: \["apps"\]\n    resources: \["deployments"\]\n    resourceNames: \["web"\]\n    verbs: \["get", "patch", "list", "watch"\]$/m);
    assert.match(rbac, /^subjects:\n  - kind: ServiceAccount\n    name: "webhook"\n    namespace: "cattle-system"$/m);
  });

  test('kubectl apply --dry-run=server -k deploy/ succeeds', async () => {
    // The namespace of Rancher's System project; a plain cluster may not have it. Left in place:
    // it stands in for Rancher's, and parallel runs may be using it.
    await kubectl(['create', 'namespace', 'cattle-system']).catch((e: Error) => {
      if (!/AlreadyExists/.test(e.message)) throw e;
    });
    const out = await kubectl(['apply', '--dry-run=server', '--kustomize', DEPLOY]);
    for (const o of objects) assert.match(out, new RegExp(`^${o.kind.toLowerCase()}(\\.[a-z0-9.]+)?/${o.metadata.name} (created|configured|unchanged) \\(server dry run\\)$`, 'm'));
    assert.doesNotMatch(out, /Warning/, out);
  });

  describe('applied to a fresh namespace', () => {
    const suffix = randomBytes(4).toString('hex');
    const ns = `deploy-${suffix}`;
    const overlay = makeTempDir('deploy-overlay-');

    before(async () => {
      // kustomize requires relative paths to a base.
      fs.writeFileSync(path.join(overlay, 'kustomization.yaml'), [
        'apiVersion: kustomize.config.k8s.io/v1beta1',
        'kind: Kustomization',
        `namespace: ${ns}`,
        // Quoted: an all-digit suffix would otherwise be read as a YAML number.
        `nameSuffix: ${JSON.stringify(`-${suffix}`)}`,
        'resources:',
        `  - ${path.relative(overlay, DEPLOY)}`,
        '',
      ].join('\n'));
      // Pods that break the "restricted" Pod Security Standard are refused in this namespace.
      await kubectl(['create', 'namespace', ns]);
      await kubectl(['label', 'namespace', ns, 'pod-security.kubernetes.io/enforce=restricted', 'pod-security.kubernetes.io/warn=restricted']);
    });
    after(async () => {
      if (process.env.KEEP_NAMESPACE) return;
      await kubectl(['delete', '--kustomize', overlay, '--ignore-not-found', '--wait=false']).catch(() => '');
      await kubectl(['delete', 'namespace', ns, '--ignore-not-found', '--wait=false']).catch(() => '');
    });

    test('applies without a warning and rolls out on the fake nodes', async () => {
      const out = await kubectl(['apply', '--kustomize', overlay]);
      assert.doesNotMatch(out, /Warning/, out);
      await kubectl(['--namespace', ns, 'rollout', 'status', `deployment/webhook-${suffix}`, '--timeout=120s']).catch(async (e: Error) => {
        // What the pods and the controllers say makes a timeout explainable from the test output.
        const state = await kubectl(['--namespace', ns, 'get', 'deployments,replicasets,pods,events', '--output', 'wide']).catch((f: Error) => f.message);
        throw new Error(`${e.message}\n${state}`);
      });
      const pods = JSON.parse(await kubectl(['--namespace', ns, 'get', 'pods', '--selector', 'app.kubernetes.io/name=webhook', '--output', 'json'])).items;
      assert.equal(pods.length, 2);
      for (const pod of pods) {
        assert.equal(pod.status.phase, 'Running');
        assert.ok(pod.spec.nodeName.startsWith('node-'), pod.spec.nodeName);
        assert.equal(pod.spec.serviceAccountName, `webhook-${suffix}`);
        assert.equal(pod.spec.serviceAccount, `webhook-${suffix}`);
      }
      // The test cluster has two nodes: the spread puts one replica on each.
      assert.notEqual(pods[0].spec.nodeName, pods[1].spec.nodeName);
      // The disruption controller allows one of the two to be evicted at a time.
      const allowed = await waitFor(async () => {
        const pdb = JSON.parse(await kubectl(['--namespace', ns, 'get', 'poddisruptionbudget', `webhook-${suffix}`, '--output', 'json']));
        return pdb.status?.currentHealthy === 2 ? pdb.status.disruptionsAllowed : undefined;
      }, { timeoutMs: 60_000, what: 'the PodDisruptionBudget to count both replicas' });
      assert.equal(allowed, 1);
    });

    test('the API server accepts the NetworkPolicy as rendered, and it selects the rolled-out pods', async () => {
      const stored = JSON.parse(await kubectl(['--namespace', ns, 'get', 'networkpolicy', `webhook-${suffix}`, '--output', 'json']));
      assert.deepEqual(stored.spec, find('NetworkPolicy').spec);
      const selector = Object.entries(stored.spec.podSelector.matchLabels).map(([k, v]) => `${k}=${v}`).join(',');
      const selected = JSON.parse(await kubectl(['--namespace', ns, 'get', 'pods', '--selector', selector, '--output', 'json'])).items;
      assert.ok(selected.length >= 2, `the policy selects the webhook pods (${selected.length})`);
      for (const pod of selected) assert.ok(pod.metadata.name.startsWith(`webhook-${suffix}-`), pod.metadata.name);
      // The Secret volume follows the overlay's nameSuffix.
      const deployment = JSON.parse(await kubectl(['--namespace', ns, 'get', 'deployment', `webhook-${suffix}`, '--output', 'json']));
      const volume = deployment.spec.template.spec.volumes.find((v: any) => v.name === 'admin-token');
      assert.equal(volume.secret.secretName, `webhook-admin-${suffix}`);
      await kubectl(['--namespace', ns, 'get', 'secret', `webhook-admin-${suffix}`]);
    });

    test('a rolling restart keeps one replica on each node', async () => {
      const deployment = `deployment/webhook-${suffix}`;
      await kubectl(['--namespace', ns, 'rollout', 'restart', deployment]);
      await kubectl(['--namespace', ns, 'rollout', 'status', deployment, '--timeout=120s']);
      const pods = JSON.parse(await kubectl(['--namespace', ns, 'get', 'pods', '--selector', 'app.kubernetes.io/name=webhook', '--field-selector', 'status.phase=Running', '--output', 'json'])).items
        .filter((p: any) => !p.metadata.deletionTimestamp);
      assert.equal(pods.length, 2);
      assert.equal(new Set(pods.map((p: any) => p.metadata.labels['pod-template-hash'])).size, 1, 'all of the new revision');
      assert.notEqual(pods[0].spec.nodeName, pods[1].spec.nodeName);
    });

    // `auth can-i` prints yes or no, and exits 1 for no.
    const can = (verb: string, resource: string, namespace = ns) => new Promise<string>((resolve) => {
      execFile(cluster!.kubectl, ['--kubeconfig', cluster!.kubeconfigPath, 'auth', 'can-i', verb, resource, '--namespace', namespace, '--as', `system:serviceaccount:${ns}:webhook-${suffix}`],
        (_error, stdout, stderr) => resolve(stdout.trim() || stderr.trim()));
    });

    test('the Roles -print-rbac generates from the filled-in hook allow its workload and nothing else', async () => {
      assert.equal(await can('get', 'deployments.apps/web'), 'no', 'the ServiceAccount starts with no permission');
      const rbac = await printRbac(filledHooks(ns), `${ns}/webhook-${suffix}`);
      const out = await kubectl(['apply', '-f', '-'], rbac);
      assert.match(out, new RegExp(`role\\.rbac\\.authorization\\.k8s\\.io/webhook-${suffix} created`));
      for (const [verb, resource, expected] of [
        ['get', 'deployments.apps/web', 'yes'], ['patch', 'deployments.apps/web', 'yes'], ['list', 'replicasets.apps', 'yes'],
        ['list', 'pods', 'yes'], ['create', 'events', 'yes'],
        ['get', 'deployments.apps/other', 'no'], ['patch', 'deployments.apps/other', 'no'], ['list', 'deployments.apps', 'no'],
        ['patch', 'statefulsets.apps/web', 'no'], ['get', 'secrets', 'no'],
      ]) assert.equal(await can(verb, resource), expected, `${verb} ${resource}`);
      assert.equal(await can('get', 'deployments.apps/web', 'default'), 'no', 'not in another namespace');
    });

    test('the cluster-wide option (rbac-cluster.yaml in the resources) binds the ServiceAccount in its new namespace', async () => {
      const option = makeTempDir('deploy-overlay-cluster-');
      fs.copyFileSync(path.join(DEPLOY, 'rbac-cluster.yaml'), path.join(option, 'rbac-cluster.yaml'));
      fs.writeFileSync(path.join(option, 'kustomization.yaml'), [
        'apiVersion: kustomize.config.k8s.io/v1beta1', 'kind: Kustomization', `namespace: ${ns}`,
        `nameSuffix: ${JSON.stringify(`-${suffix}`)}`, 'resources:', `  - ${path.relative(option, DEPLOY)}`, '  - rbac-cluster.yaml', '',
      ].join('\n'));
      const rendered = await render(option);
      const binding = rendered.find((o) => o.kind === 'ClusterRoleBinding');
      assert.deepEqual(binding.subjects, [{ kind: 'ServiceAccount', name: `webhook-${suffix}`, namespace: ns }]);
      assert.equal(binding.roleRef.name, `webhook-${suffix}`);
      const role = rendered.find((o) => o.kind === 'ClusterRole');
      const listed = role.rules.filter((r: any) => r.verbs.includes('list')).flatMap((r: any) => r.resources).sort();
      assert.deepEqual(listed, ['daemonsets', 'deployments', 'nodes', 'pods', 'replicasets', 'statefulsets'],
        'list: followed workloads, replicasets, pods, and nodes (the platform check)');
      const watched = role.rules.filter((r: any) => r.verbs.includes('watch')).flatMap((r: any) => r.resources).sort();
      assert.deepEqual(watched, ['daemonsets', 'deployments', 'pods', 'statefulsets'], 'watch the followed workloads and pods only');
    });
  });
});
