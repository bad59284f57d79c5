/*
 * Tests of the upgrade sections: pure composition, validation and normalisation against real
 * registry payloads (fixtures/), and runUpgrade against a real Kubernetes control plane (kwok
 * fake nodes; test/cluster/cluster.ts). Each run uses a fresh namespace and deletes it after.
 * Outside CI, the cluster tests skip when the cluster cannot start; with CI=true they fail.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  checkImagePin, compileHooksFile, IMAGE_PIN_SETTINGS, readImagePin, registryOf,
  composeImageRef, readPushReading, credentialsFromEnvironment, parsePushHeaders, REPO_TYPES, formatReport, inClusterCredentials, KubeClient, KubeConfigError, KubeError,
  labelSelector, leanWorkload, loadKubeconfig, normalizeImageRef, parsePushPayload, parseWorkload, planPatch, locateContainer, retryDelay,
  rolloutStatus, runUpgrade, summarizePod, logTail, type PodSummary, validateImageRef, WorkloadQueue, decidePush, type Delivery, newReport,
  asMarshalled, goJsonMarshal, parseJsonKeepingNumbers, pushPayload, webhookValidation,
} from '../webhook.ts';
import {
  acrImage, acrPayload, apfThrottle, clusterOrSkip, containerImage, cronJob, daemonSet, deployment,
  freshNamespaceName, kubectlFor, removeNamespace, shippedServiceAccount, statefulSet,
} from './cluster/kube.ts';

const here = path.dirname(fileURLToPath(import.meta.url));
const fixturesDir = path.join(here, 'fixtures', 'upgrade');
const repoRoot = path.join(here, '..');
const fixture = (name: string) => fs.readFileSync(path.join(fixturesDir, name), 'utf8');

// ------------------------------------------------------------------------------------------------
// Pure parts

describe('registry payloads → image reference', () => {
  const cases: Array<{
    fixture: string; env: Record<string, string>; headers?: Record<string, string>; ref?: string; noop?: string; error?: string; note?: string;
    answer?: string; candidates?: string[];
  }> = JSON.parse(fixture('expected.json'));
  for (const c of cases) {
    test(`${c.fixture} with ${JSON.stringify(c.env)}${c.headers ? ` and headers ${JSON.stringify(c.headers)}` : ''}`, () => {
      const parsed = parsePushPayload(fixture(c.fixture));
      assert.equal(parsed.kind, 'payload');
      // Headers arrive as the hook's entire-headers passes them: Go-canonical names, JSON.
      const headers = parsePushHeaders(c.headers ? JSON.stringify(c.headers) : undefined);
      const got = composeImageRef(parsed.kind === 'payload' ? parsed.payload : undefined, readPushReading(c.env), headers);
      if (c.ref !== undefined) {
        assert.equal(got.kind, 'ref', JSON.stringify(got));
        if (got.kind === 'ref') {
          assert.equal(got.ref, c.ref);
          assert.deepEqual(got.notes, c.note ? [c.note] : []);
          assert.deepEqual(got.candidates, c.candidates);
        }
      } else if (c.answer !== undefined) {
        assert.equal(got.kind === 'answer' && got.body, c.answer, JSON.stringify(got));
      } else if (c.noop !== undefined) {
        assert.deepEqual(got, { kind: 'noop', reason: c.noop });
      } else {
        assert.deepEqual(got, { kind: 'error', message: c.error });
      }
    });
  }

  test('every payload fixture has an expected outcome, and every registry type a fixture and an entry in docs/registries.md', () => {
    const covered = new Set(cases.map((c) => c.fixture));
    const fixtures = fs.readdirSync(fixturesDir).filter((f) => f.endsWith('.json') && f !== 'expected.json');
    assert.deepEqual(fixtures.filter((f) => !covered.has(f)), [], 'fixtures without an entry in expected.json');
    const types = new Set(cases.map((c) => (c.env.REPO_TYPE ?? '').toLowerCase()));
    assert.deepEqual(REPO_TYPES.filter((t) => !types.has(t)), [], 'registry types without a fixture');
    const registriesDoc = fs.readFileSync(path.join(repoRoot, 'docs', 'registries.md'), 'utf8');
    assert.deepEqual(REPO_TYPES.filter((t) => !registriesDoc.includes(`\`${t}\``)), [], 'registry types docs/registries.md does not name');
  });

  const acr = (over: { tag?: unknown; name?: string; full?: string; digest?: unknown; region?: unknown }) => ({
    push_data: { digest: over.digest ?? `sha256:${'a'.repeat(64)}`, pushed_at: '2024-05-20 10:41:07', tag: over.tag ?? 'v1' },
    repository: { name: over.name ?? 'app', namespace: 'ns', region: over.region ?? 'cn-hangzhou', repo_full_name: over.full ?? 'ns/app' },
  });
  const compose = (payload: unknown, env: Record<string, string> = { REPO_TYPE: 'regionalregistry' }) => composeImageRef(payload, readPushReading(env));
  const errorOf = (payload: unknown, env?: Record<string, string>) => {
    const r = compose(payload, env);
    assert.equal(r.kind, 'error', JSON.stringify(r));
    return r.kind === 'error' ? r.message : '';
  };

  test('invalid tags name push_data.tag', () => {
    assert.match(errorOf(acr({ tag: 'v 1' })), /^push_data\.tag "v 1" is not a valid tag/);
    assert.match(errorOf(acr({ tag: '$(id)' })), /^push_data\.tag "\$\(id\)" is not a valid tag/);
    assert.match(errorOf(acr({ tag: '-rc1' })), /^push_data\.tag "-rc1" is not a valid tag/);
    const long = errorOf(acr({ tag: 'a'.repeat(200) }));
    assert.match(long, /^push_data\.tag "a{80}"… is 200 characters long \(a tag has at most 128\)$/);
    assert.equal(compose(acr({ tag: 'a'.repeat(128) })).kind, 'ref');
    assert.match(errorOf(acr({ tag: 7 })), /^push_data\.tag must be a string, got a number$/);
  });
  test('an upper-case repository is refused, not lower-cased', () => {
    const message = errorOf(acr({ full: 'ns/repoTest' }));
    assert.match(message, /repository\.repo_full_name "ns\/repoTest" is not a valid repository name: OCI repository names are lower-case/);
    assert.match(errorOf(acr({ full: 'ns/$(id)' })), /repository\.repo_full_name "ns\/\$\(id\)" is not a valid repository name/);
  });
  test('missing and malformed fields are named', () => {
    const p = acr({});
    delete (p.repository as Record<string, unknown>).repo_full_name;
    assert.match(errorOf(p), /^repository\.repo_full_name is missing/);
    assert.match(errorOf(acr({ region: 'cn hangzhou' })), /^repository\.region "cn hangzhou" is not a valid region/);
    assert.match(errorOf({ push_data: 'x', repository: {} }), /^push_data must be an object, got a string$/);
    assert.match(errorOf({ push_data: { tag: 'v1' }, repository: { name: 'a', namespace: 'b' } }, { REPO_TYPE: 'publicregistry' }), /^repository\.repo_name is missing/);
    assert.match(errorOf({ push_data: { tag: 'v1' }, repository: { name: 'a', namespace: 'b' } }, { REPO_TYPE: 'custom' }), /^repository\.repo_url is missing/);
    assert.match(errorOf({ push_data: { tag: 'v1' }, repository: { name: 'a', namespace: 'b', repo_url: 'https://bad host/' } }, { REPO_TYPE: 'custom' }), /^repository\.repo_url "https:\/\/bad host\/" does not start with a valid registry host/);
    assert.throws(() => readPushReading({ REPO_TYPE: 'regionalregistry', REGISTRY_HOST: 'not a host' }), /^Error: REGISTRY_HOST "not a host" is not a valid registry host/);
    assert.match(errorOf([1]), /^payload is not a JSON object \(got an array\)$/);
  });
  test('test pings are no-ops, whatever the registry', () => {
    assert.deepEqual(compose({}, { REPO_TYPE: 'custom' }), { kind: 'noop', reason: 'test ping: the payload has no push_data.tag, repository.name, repository.namespace, so there is no pushed image' });
    assert.equal(compose(acr({ tag: '' })).kind, 'noop');
    assert.equal(compose(acr({ name: '' })).kind, 'noop');
  });
  test('digest pinning', () => {
    assert.match(errorOf(acr({ digest: 'sha256:123' }), { REPO_TYPE: 'regionalregistry', PIN_DIGEST: 'true' }), /^push_data\.digest "sha256:123" is not a valid digest/);
    assert.match(errorOf(acr({}), { REPO_TYPE: 'regionalregistry', PIN_DIGEST: 'maybe' }), /^PIN_DIGEST "maybe" is not a boolean/);
    const pinned = compose(acr({}), { REPO_TYPE: 'regionalregistry', PIN_DIGEST: '1' });
    assert.equal(pinned.kind === 'ref' && pinned.ref, `registry.cn-hangzhou.aliyuncs.com/ns/app:v1@sha256:${'a'.repeat(64)}`);
    // An unpinned composition ignores a malformed digest it does not use.
    assert.equal(compose(acr({ digest: 'junk' })).kind, 'ref');
  });
  test('custom repo_url: scheme, trailing slashes and a path prefix', () => {
    for (const url of ['reg.example.com', 'reg.example.com/', 'http://reg.example.com', 'HTTPS://reg.example.com//']) {
      const r = compose({ push_data: { tag: 'v1' }, repository: { repo_url: url, namespace: 'ns', name: 'app' } }, { REPO_TYPE: 'custom' });
      assert.equal(r.kind === 'ref' && r.ref, 'reg.example.com/ns/app:v1', url);
    }
    const prefixed = compose({ push_data: { tag: 'v1' }, repository: { repo_url: 'https://reg.example.com/harbor-project/', namespace: 'ns', name: 'app' } }, { REPO_TYPE: 'custom' });
    assert.equal(prefixed.kind === 'ref' && prefixed.ref, 'reg.example.com/harbor-project/ns/app:v1');
  });
  test('the name length limit', () => {
    const r = errorOf({ push_data: { tag: 'v1' }, repository: { repo_url: 'reg.example.com', namespace: 'n'.repeat(200), name: 'a'.repeat(60) } }, { REPO_TYPE: 'custom' });
    assert.match(r, /^image name "reg\.example\.com\/n+"… is 277 characters long \(at most 255\)$/);
  });
  test('parsePushPayload', () => {
    assert.match((parsePushPayload('') as { message: string }).message, /^payload is empty: argument 1 must be the request body/);
    assert.match((parsePushPayload(undefined) as { message: string }).message, /^payload is empty/);
    assert.match((parsePushPayload('{"push_data":') as { message: string }).message, /^payload is not JSON: /);
    assert.match((parsePushPayload('tag=v1') as { message: string }).message, /^payload is not JSON: /);
    assert.deepEqual(parsePushPayload('"x"'), { kind: 'error', message: 'payload is not a JSON object (got a string)' });
  });
});

describe('the in-process payload: its JSON value, as the text a process is given reads back', () => {
  const values: unknown[] = [
    parseJsonKeepingNumbers('{"b": 1.50, "a": [1e400, -0, 12345678901234567890], "__proto__": {"x": "\\ud800"}}'),
    parseJsonKeepingNumbers('{"push_data": {"tag": "v1", "pushed_at": "2024-05-20 10:41:07"}, "repository": {}}'),
    { z: ['<&>', '\u2028'], 10: true, 2: false, a: undefined }, null, undefined, {}, [], 'text', Buffer.from('ab'),
  ];
  test('the same value, keys in the same order, and the same answer to every check of argument 1', () => {
    for (const value of values) {
      const text = goJsonMarshal(value);
      const read = asMarshalled(value);
      assert.deepEqual(read, JSON.parse(text), text);
      assert.equal(JSON.stringify(read), JSON.stringify(JSON.parse(text)), text);
      assert.deepEqual(pushPayload(read), parsePushPayload(text), text);
      const headers = { 'webhook-request-origin': 'eventgrid.azure.net' };
      assert.equal(webhookValidation(headers, { value: read }), webhookValidation(headers, { text }), text);
    }
  });
});

describe('the image pin', () => {
  const pin = (current: string, pushed: string, settings: Record<string, string> = {}) =>
    checkImagePin('app', current, pushed, readImagePin(settings.REGISTRY_HOST, settings.ALLOW_IMAGES));
  const allowed = (current: string, pushed: string, settings?: Record<string, string>) => {
    const d = pin(current, pushed, settings);
    assert.equal(d.allowed, true, `${current} → ${pushed}: ${JSON.stringify(d)}`);
    return d.allowed ? d.note : undefined;
  };
  const refused = (current: string, pushed: string, settings?: Record<string, string>) => {
    const d = pin(current, pushed, settings);
    assert.equal(d.allowed, false, `${current} → ${pushed} must be refused`);
    return d.allowed ? '' : d.message;
  };
  const digest = `sha256:${'d'.repeat(64)}`;

  test('the same repository: any tag and digest', () => {
    assert.equal(allowed('registry.cn-hangzhou.aliyuncs.com/shop/web-api:v1', 'registry.cn-hangzhou.aliyuncs.com/shop/web-api:v2'), undefined);
    allowed('registry.cn-hangzhou.aliyuncs.com/shop/web-api:v1', `registry.cn-hangzhou.aliyuncs.com/shop/web-api:v2@${digest}`);
    allowed(`harbor.example.com:8443/shop/web-api@${digest}`, 'harbor.example.com:8443/shop/web-api:1.4.2');
    allowed('Harbor.Example.com:8443/shop/web-api:1', 'harbor.example.com:8443/shop/web-api:2');
  });

  test('endpoints of one registry count as the same', () => {
    const same: [string, string][] = [
      ['registry.cn-hangzhou.aliyuncs.com/shop/web', 'registry-vpc.cn-hangzhou.aliyuncs.com/shop/web:v2'],
      ['registry-vpc.cn-hangzhou.aliyuncs.com/shop/web', 'registry-internal.cn-hangzhou.aliyuncs.com/shop/web:v2'],
      ['registry-internal.cn-hangzhou.aliyuncs.com/shop/web', 'registry.cn-hangzhou.aliyuncs.com/shop/web:v2'],
      ['acme-registry.cn-shanghai.cr.aliyuncs.com/shop/web', 'acme-registry-vpc.cn-shanghai.cr.aliyuncs.com/shop/web:v2'],
      ['crpi-k8f2a9.cn-beijing.personal.cr.aliyuncs.com/shop/web', 'crpi-k8f2a9-vpc.cn-beijing.personal.cr.aliyuncs.com/shop/web:v2'],
      ['nginx:1', 'docker.io/library/nginx:2'],
      ['nginx:1', 'index.docker.io/library/nginx:2'],
      ['registry-1.docker.io/library/nginx:1', 'nginx:2'],
      ['shopteam/web-api:v1', 'docker.io/shopteam/web-api:v2.3.1'],
    ];
    for (const [current, pushed] of same) allowed(current, pushed);
    assert.equal(registryOf('REGISTRY-VPC.cn-hangzhou.aliyuncs.com'), 'registry.cn-hangzhou.aliyuncs.com');
    assert.equal(registryOf('shop-registry-registry-vpc.cn-hangzhou.cr.aliyuncs.com'), 'shop-registry-registry.cn-hangzhou.cr.aliyuncs.com');
    assert.equal(registryOf(undefined), 'docker.io');
  });

  test('another repository, registry, region, instance or port is refused', () => {
    const current = 'registry.cn-hangzhou.aliyuncs.com/shop/web-api:v1';
    for (const pushed of [
      'evil.example:5000/x/backdoor:pwn',
      'registry.cn-hangzhou.aliyuncs.com/attacker/web-api:v2', // any namespace on the shared ACR endpoint
      'registry.cn-hangzhou.aliyuncs.com/shop/web-api2:v2',
      'registry.cn-hangzhou.aliyuncs.com/shop/web-api/x:v2',
      'registry.cn-shanghai.aliyuncs.com/shop/web-api:v2',
      'acme-registry.cn-hangzhou.cr.aliyuncs.com/shop/web-api:v2',
      'registry.cn-hangzhou.aliyuncs.com:443/shop/web-api:v2',
      'shop/web-api:v2',
    ]) refused(current, pushed);
    refused('acme-registry.cn-hangzhou.cr.aliyuncs.com/shop/web', 'other-registry.cn-hangzhou.cr.aliyuncs.com/shop/web:v2');
    refused('crpi-aaa.cn-beijing.personal.cr.aliyuncs.com/shop/web', 'crpi-bbb.cn-beijing.personal.cr.aliyuncs.com/shop/web:v2');
    refused('nginx:1', 'evil/nginx:1');
    refused('nginx:1', 'mirror.example.com/library/nginx:1');
  });

  test('the refusal names both repositories and the setting that allows it', () => {
    assert.equal(
      refused('registry.cn-hangzhou.aliyuncs.com/shop/web-api:v1', 'evil.example:5000/x/backdoor:pwn'),
      'image pin: container "app" runs repository "registry.cn-hangzhou.aliyuncs.com/shop/web-api", and the push names ' +
        'repository "evil.example:5000/x/backdoor"; a push may change only the tag and digest, unless the hook setting ' +
        'ALLOW_IMAGES lists the repository',
    );
    assert.match(refused('nginx:1', 'shopteam/nginx:1'), /runs repository "docker\.io\/library\/nginx", and the push names repository "docker\.io\/shopteam\/nginx"/);
    assert.match(refused('', 'shopteam/nginx:1'), /^image pin: container "app" runs "", which is not a valid image reference, and the push names repository "docker\.io\/shopteam\/nginx"; .*ALLOW_IMAGES/);
  });

  test("the hook's REGISTRY_HOST counts as the container's registry, for the same repository only", () => {
    const host = { REGISTRY_HOST: 'https://acme-registry-vpc.cn-hangzhou.cr.aliyuncs.com/' };
    const note = allowed('registry.cn-hangzhou.aliyuncs.com/shop/web:v1', 'acme-registry.cn-hangzhou.cr.aliyuncs.com/shop/web:v2', host);
    assert.equal(note, "image pin: the registry changes to the hook's REGISTRY_HOST (acme-registry.cn-hangzhou.cr.aliyuncs.com)");
    refused('registry.cn-hangzhou.aliyuncs.com/shop/web:v1', 'acme-registry.cn-hangzhou.cr.aliyuncs.com/evil/web:v2', host);
    refused('registry.cn-hangzhou.aliyuncs.com/shop/web:v1', 'evil.example:5000/shop/web:v2', host);
  });

  test('REGISTRY_HOST applies to every repo_type: a Docker Hub push cannot leave the hook\'s registry', () => {
    const hub = JSON.parse(fixture('dockerhub-push.json'));
    const env = { REPO_TYPE: 'publicregistry', REGISTRY_HOST: 'registry.cn-hangzhou.aliyuncs.com' };
    const composed = composeImageRef(hub, readPushReading(env));
    assert.equal(composed.kind === 'ref' && composed.ref, 'registry.cn-hangzhou.aliyuncs.com/shopteam/web-api:v2.3.1');
    refused('registry.cn-hangzhou.aliyuncs.com/shop/web-api:v1', composed.kind === 'ref' ? composed.ref : '', env);
    const custom = { push_data: { tag: 'pwn' }, repository: { repo_url: 'evil.example:5000', namespace: 'shop', name: 'web-api' } };
    const viaCustom = composeImageRef(custom, readPushReading({ REPO_TYPE: 'custom', REGISTRY_HOST: 'registry.cn-hangzhou.aliyuncs.com' }));
    assert.equal(viaCustom.kind === 'ref' && viaCustom.ref, 'registry.cn-hangzhou.aliyuncs.com/shop/web-api:pwn');
  });

  test('ALLOW_IMAGES: exact repositories and prefixes, compared as registries and normalised names', () => {
    const current = 'registry.cn-hangzhou.aliyuncs.com/shop/web-api:v1';
    const settings = { ALLOW_IMAGES: ' registry.cn-hangzhou.aliyuncs.com/tools/*\tEVIL.example:5000/x/backdoor\n nginx  shopteam/* mirror.example.com/* ' };
    assert.equal(
      allowed(current, 'evil.example:5000/x/backdoor:pwn', settings),
      'image pin: "evil.example:5000/x/backdoor" allowed by ALLOW_IMAGES pattern "EVIL.example:5000/x/backdoor"',
    );
    for (const pushed of ['registry-vpc.cn-hangzhou.aliyuncs.com/tools/web:1', 'registry.cn-hangzhou.aliyuncs.com/tools/a/b:1',
      'docker.io/library/nginx:1.27', 'nginx:1', 'shopteam/web-api:v2', 'docker.io/shopteam/x/y:1', 'mirror.example.com/any/thing:1'])
      assert.match(allowed(current, pushed, settings) ?? '', /allowed by ALLOW_IMAGES pattern/, pushed);
    for (const pushed of ['evil.example:5000/x/backdoor2:pwn', 'evil.example:5000/x/backdoor/y:1', 'evil.example/x/backdoor:1',
      'registry.cn-hangzhou.aliyuncs.com/tools:1', 'registry.cn-hangzhou.aliyuncs.com/toolsx/web:1', 'registry.cn-shanghai.aliyuncs.com/tools/web:1',
      'shopteam:1', 'library/nginx2:1', 'other.example/shopteam/web-api:1'])
      refused(current, pushed, settings);
  });

  test('ALLOW_IMAGES patterns are validated, naming the pattern', () => {
    const problem = (value: string) => {
      assert.throws(() => readImagePin(undefined, value), Error);
      return IMAGE_PIN_SETTINGS.ALLOW_IMAGES(value);
    };
    assert.match(problem('*') ?? '', /^ALLOW_IMAGES pattern "\*" has a "\*" that is not a trailing "\/\*"/);
    assert.match(problem('/*') ?? '', /^ALLOW_IMAGES pattern "\/\*" names no registry/);
    assert.match(problem('good.example/a shop/web-*') ?? '', /^ALLOW_IMAGES pattern "shop\/web-\*" has a "\*" that is not a trailing/);
    assert.match(problem('reg.example.com/*/app') ?? '', /has a "\*" that is not a trailing/);
    assert.match(problem('nginx:1') ?? '', /^ALLOW_IMAGES pattern "nginx:1" names a tag or digest/);
    assert.match(problem(`reg.example.com/app@${digest}`) ?? '', /names a tag or digest/);
    assert.match(problem('localhost:5000') ?? '', /names only a registry host/);
    assert.match(problem('evil.example:5000') ?? '', /^ALLOW_IMAGES pattern "evil\.example:5000" names only a registry host \(write "evil\.example:5000\/\*"/);
    assert.match(problem('reg.example.com/Shop/app') ?? '', /^ALLOW_IMAGES pattern "reg\.example\.com\/Shop\/app" names an invalid repository: its path is not a valid repository name: OCI repository names are lower-case/);
    assert.match(problem('bad_host.example/app') ?? '', /^ALLOW_IMAGES pattern "bad_host\.example\/app" names an invalid registry host "bad_host\.example" \(host\[:port\]\)$/);
    for (const ok of ['', '  ', 'nginx', 'reg.example.com/*', 'localhost:5000/a/b', '[::1]:5000/app', 'Reg.Example.COM/shop/*'])
      assert.equal(IMAGE_PIN_SETTINGS.ALLOW_IMAGES(ok), undefined, ok);
    assert.match(IMAGE_PIN_SETTINGS.REGISTRY_HOST('not a host') ?? '', /^REGISTRY_HOST "not a host" is not a valid registry host/);
    assert.equal(IMAGE_PIN_SETTINGS.REGISTRY_HOST('https://crpi-abc.cn-hangzhou.personal.cr.aliyuncs.com/'), undefined);
  });

  test('the pin settings are checked when a hooks file loads: fixed strings, valid, errors naming file, line and field', () => {
    const hook = (env: unknown[]) => JSON.stringify([{ id: 'web', 'execute-command': '/webhooks.sh', 'pass-environment-to-command': [
      { envname: 'REPO_TYPE', source: 'url', name: 'repo_type' }, ...env] }], null, 1);
    const load = (env: unknown[]) => compileHooksFile('hooks/web.json', hook(env), { commandTimeoutMs: 0, settingChecks: IMAGE_PIN_SETTINGS });
    const loadError = (env: unknown[]) => {
      try {
        load(env);
      } catch (e) {
        return (e as Error).message;
      }
      assert.fail(`loaded: ${JSON.stringify(env)}`);
    };
    assert.equal(
      loadError([{ envname: 'ALLOW_IMAGES', source: 'string', name: 'registry.cn-hangzhou.aliyuncs.com/shop/web-*' }]),
      'hooks/web.json:14: hook "web": pass-environment-to-command[1].name: ALLOW_IMAGES pattern ' +
        '"registry.cn-hangzhou.aliyuncs.com/shop/web-*" has a "*" that is not a trailing "/*" (host/path/* allows every ' +
        'repository under host/path)',
    );
    assert.match(loadError([{ envname: 'ALLOW_IMAGES', source: 'url', name: 'allow' }]),
      /^hooks\/web\.json:\d+: hook "web": pass-environment-to-command\[1\]\.source: ALLOW_IMAGES must be fixed in the hook file \("source": "string"\)/);
    assert.match(loadError([{ envname: 'REGISTRY_HOST', source: 'header', name: 'X-Registry' }]),
      /pass-environment-to-command\[1\]\.source: REGISTRY_HOST must be fixed in the hook file/);
    assert.match(loadError([{ envname: 'REGISTRY_HOST', source: 'string', name: 'evil host' }]),
      /pass-environment-to-command\[1\]\.name: REGISTRY_HOST "evil host" is not a valid registry host/);
    const ok = load([{ envname: 'ALLOW_IMAGES', source: 'string', name: 'registry.cn-hangzhou.aliyuncs.com/shop/* nginx' },
      { envname: 'REGISTRY_HOST', source: 'string', name: 'acme-registry.cn-hangzhou.cr.aliyuncs.com' }]);
    assert.equal(ok.hooks[0].env.length, 3);
    // Another variable that happens to hold such text is not a pin setting.
    assert.equal(load([{ envname: 'ALLOW', source: 'url', name: 'x' }]).hooks.length, 1);
  });

  test('a malformed pin setting refuses the push before any API call', async () => {
    const client = new KubeClient({ server: 'https://127.0.0.1:1', source: 'test' }, { retryBudgetMs: 0 });
    const env = { APP_NS: 'prod', APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry' };
    const r = await runUpgrade([acrPayload('v2')], { ...env, ALLOW_IMAGES: 'shop/*/web' }, { client });
    assert.equal(r.exitCode, 1);
    assert.match(r.output, /^result: +failed: ALLOW_IMAGES pattern "shop\/\*\/web" has a "\*" that is not a trailing "\/\*"/m);
    const host = await runUpgrade([acrPayload('v2')], { ...env, REGISTRY_HOST: 'a b' }, { client });
    assert.match(host.output, /^result: +failed: REGISTRY_HOST "a b" is not a valid registry host/m);
    client.close();
  });
});

describe('validateImageRef', () => {
  const valid = ['nginx', 'nginx:1', 'library/nginx:1.25-alpine', 'docker.io/library/nginx:latest', 'localhost:5000/a/b:c',
    'localhost/app', '[::1]:5000/app:v1', 'Registry.Example.COM/ns/app:V1_x', 'a.b/c--d/e__f/g.h:tag', `app@sha256:${'b'.repeat(64)}`,
    `reg.io/app:v1@sha256:${'c'.repeat(64)}`, '192.168.0.1:5000/ns/app:v1'];
  for (const ref of valid) test(`accepts ${ref}`, () => assert.equal(validateImageRef(ref).ok, true, JSON.stringify(validateImageRef(ref))));
  const invalid: Array<[string, RegExp]> = [
    ['reg.io/ns/app:v 1', /tag "v 1" is not a valid tag/],
    ['reg.io/ns/app:$(id)', /tag "\$\(id\)" is not a valid tag/],
    ['reg.io/ns/repoTest:v1', /repository "ns\/repoTest" is not a valid repository name: OCI repository names are lower-case/],
    ['Namespace/app:v1', /repository "Namespace\/app" is not a valid repository name: OCI repository names are lower-case/],
    [`app:${'x'.repeat(200)}`, /is 200 characters long \(a tag has at most 128\)/],
    ['app@sha256:abc', /digest "sha256:abc" is not valid/],
    [`app@md5:${'a'.repeat(32)}`, /digest "md5:a+" is not valid/],
    ['reg.io//app', /empty path component/],
    ['-bad.io:x/app', /registry host "-bad\.io:x" is not a valid registry host/],
    ['', /is empty/],
    [`reg.io/${'a'.repeat(250)}`, /the name is 257 characters long \(at most 255\)/],
    ['app_/x', /"app_" must be lower-case letters and digits/],
  ];
  for (const [ref, message] of invalid) test(`refuses ${JSON.stringify(ref.slice(0, 40))}`, () => {
    const r = validateImageRef(ref);
    assert.equal(r.ok, false);
    assert.match(r.ok ? '' : r.message, message);
  });
});

describe('normalizeImageRef', () => {
  const same: Array<[string, string]> = [
    ['nginx:1', 'docker.io/library/nginx:1'],
    ['nginx', 'nginx:latest'],
    ['nginx', 'docker.io/library/nginx:latest'],
    ['index.docker.io/library/nginx:1', 'nginx:1'],
    ['shopteam/web-api:v2', 'docker.io/shopteam/web-api:v2'],
    ['REGISTRY.cn-hangzhou.aliyuncs.com/shop/app:v1', 'registry.cn-hangzhou.aliyuncs.com/shop/app:v1'],
  ];
  for (const [a, b] of same) test(`${a} ≡ ${b}`, () => assert.equal(normalizeImageRef(a), normalizeImageRef(b)));
  const different: Array<[string, string]> = [
    ['nginx:1', 'nginx:1.0'],
    ['registry.cn-hangzhou.aliyuncs.com/shop/app:v1', 'registry-vpc.cn-hangzhou.aliyuncs.com/shop/app:v1'],
    ['app:v1', `app:v1@sha256:${'a'.repeat(64)}`],
    ['localhost/app:v1', 'app:v1'],
  ];
  for (const [a, b] of different) test(`${a} ≢ ${b}`, () => assert.notEqual(normalizeImageRef(a), normalizeImageRef(b)));
  test('canonical form', () => {
    assert.equal(normalizeImageRef('nginx'), 'docker.io/library/nginx:latest');
    assert.equal(normalizeImageRef(`nginx@sha256:${'a'.repeat(64)}`), `docker.io/library/nginx@sha256:${'a'.repeat(64)}`);
    assert.equal(normalizeImageRef('Not A Ref'), 'Not A Ref');
  });
});

describe('workloads', () => {
  test('kinds, plurals, short names, groups, any case', () => {
    for (const [text, kind] of [['deployment/web', 'deployment'], ['Deployments/web', 'deployment'], ['DEPLOY/web', 'deployment'],
      ['deployments.apps/web', 'deployment'], ['ds/agent', 'daemonset'], ['DaemonSet/agent', 'daemonset'], ['sts/db', 'statefulset'],
      ['statefulsets/db', 'statefulset'], ['cj/nightly', 'cronjob'], ['CronJobs.batch/nightly', 'cronjob']] as const) {
      assert.deepEqual(parseWorkload(text), { kind, name: text.split('/')[1] }, text);
    }
  });
  test('errors', () => {
    assert.throws(() => parseWorkload('pod/web'), /APP_WORKLOAD "pod\/web": unknown kind "pod" \(use deployment, daemonset, statefulset or cronjob/);
    assert.throws(() => parseWorkload('web'), /APP_WORKLOAD "web" must be <kind>\/<name>/);
    assert.throws(() => parseWorkload('deployment/Web'), /"Web" is not a valid deployment name/);
    assert.throws(() => parseWorkload('deployments.batch/web'), /unknown kind "deployments\.batch"/);
    assert.throws(() => parseWorkload(undefined), /APP_WORKLOAD is not set/);
  });
  test('planPatch tests name and image, touches one container, creates absent maps safely', () => {
    const obj = { metadata: { name: 'w' }, spec: { template: { metadata: { labels: { a: 'b' } }, spec: { containers: [{ name: 'app-sidecar', image: 's:1' }, { name: 'app', image: 'a:1' }] } } } };
    const located = locateContainer(obj.spec.template.spec, 'app')!;
    assert.deepEqual(located, { list: 'containers', index: 1, image: 'a:1', pullPolicy: undefined });
    assert.deepEqual(planPatch(obj, 'deployment', 'app', located, { image: 'a:2', changeCause: 'why' }), [
      { op: 'test', path: '/spec/template/spec/containers/1/name', value: 'app' },
      { op: 'test', path: '/spec/template/spec/containers/1/image', value: 'a:1' },
      { op: 'replace', path: '/spec/template/spec/containers/1/image', value: 'a:2' },
      { op: 'test', path: '/metadata/annotations', value: null },
      { op: 'add', path: '/metadata/annotations', value: { 'kubernetes.io/change-cause': 'why' } },
    ]);
    const withAnnotations = { ...obj, metadata: { name: 'w', annotations: { x: 'y' } } };
    assert.deepEqual(planPatch(withAnnotations, 'deployment', 'app', located, { pullAlways: true, restartedAt: 'T', changeCause: 'why' }).slice(2), [
      { op: 'add', path: '/spec/template/spec/containers/1/imagePullPolicy', value: 'Always' },
      { op: 'test', path: '/spec/template/metadata/annotations', value: null },
      { op: 'add', path: '/spec/template/metadata/annotations', value: { 'kubectl.kubernetes.io/restartedAt': 'T' } },
      { op: 'add', path: '/metadata/annotations/kubernetes.io~1change-cause', value: 'why' },
    ]);
    const cron = { spec: { jobTemplate: { spec: { template: { spec: { initContainers: [{ name: 'app', image: 'a:1', imagePullPolicy: 'Always' }], containers: [] } } } } } };
    const l = locateContainer(cron.spec.jobTemplate.spec.template.spec, 'app')!;
    assert.deepEqual(planPatch(cron, 'cronjob', 'app', l, { pullAlways: true, changeCause: 'c' }).map((o) => o.path), [
      '/spec/jobTemplate/spec/template/spec/initContainers/0/name', '/spec/jobTemplate/spec/template/spec/initContainers/0/image',
      '/metadata', '/metadata',
    ]);
  });
  test('labelSelector', () => {
    assert.equal(labelSelector({ matchLabels: { app: 'web', tier: 'fe' }, matchExpressions: [
      { key: 'env', operator: 'In', values: ['a', 'b'] }, { key: 'x', operator: 'NotIn', values: ['c'] },
      { key: 'y', operator: 'Exists' }, { key: 'z', operator: 'DoesNotExist' }] }), 'app=web,tier=fe,env in (a,b),x notin (c),y,!z');
  });
});

describe('rollout status by kubectl rules', () => {
  const dep = (status: Record<string, unknown>, generation = 2, replicas = 2) => ({ metadata: { generation }, spec: { replicas }, status: { observedGeneration: 2, ...status } });
  test('deployment', () => {
    assert.deepEqual(rolloutStatus('deployment', dep({}, 3)), { state: 'waiting', message: 'waiting for the deployment controller to observe the change' });
    assert.deepEqual(rolloutStatus('deployment', dep({ updatedReplicas: 1, replicas: 3, availableReplicas: 1 })), { state: 'waiting', message: '1 of 2 pods updated' });
    assert.deepEqual(rolloutStatus('deployment', dep({ updatedReplicas: 2, replicas: 3, availableReplicas: 2 })), { state: 'waiting', message: '1 old pod pending termination' });
    assert.deepEqual(rolloutStatus('deployment', dep({ updatedReplicas: 2, replicas: 2, availableReplicas: 1 })), { state: 'waiting', message: '1 of 2 updated pods available' });
    assert.deepEqual(rolloutStatus('deployment', dep({ updatedReplicas: 2, replicas: 2, availableReplicas: 2 })), { state: 'done', message: '2/2 pods updated and available' });
    const stuck = dep({ conditions: [{ type: 'Progressing', status: 'False', reason: 'ProgressDeadlineExceeded', message: 'ReplicaSet "w-1" has timed out progressing.' }] });
    assert.deepEqual(rolloutStatus('deployment', stuck), { state: 'failed', message: 'ProgressDeadlineExceeded: ReplicaSet "w-1" has timed out progressing.' });
  });
  test('daemonset', () => {
    const ds = (s: Record<string, unknown>, strategy = 'RollingUpdate') => ({ metadata: { generation: 1 }, spec: { updateStrategy: { type: strategy } }, status: { observedGeneration: 1, ...s } });
    assert.equal(rolloutStatus('daemonset', ds({ desiredNumberScheduled: 2, updatedNumberScheduled: 1, numberAvailable: 2 })).message, '1 of 2 pods updated');
    assert.equal(rolloutStatus('daemonset', ds({ desiredNumberScheduled: 2, updatedNumberScheduled: 2, numberAvailable: 1 })).message, '1 of 2 updated pods available');
    assert.equal(rolloutStatus('daemonset', ds({ desiredNumberScheduled: 2, updatedNumberScheduled: 2, numberAvailable: 2 })).state, 'done');
    assert.equal(rolloutStatus('daemonset', ds({}, 'OnDelete')).state, 'untracked');
  });
  test('statefulset', () => {
    const sts = (s: Record<string, unknown>, partition?: number) => ({ metadata: { generation: 1 }, spec: { replicas: 3, updateStrategy: { type: 'RollingUpdate', rollingUpdate: partition === undefined ? undefined : { partition } } }, status: { observedGeneration: 1, ...s } });
    assert.equal(rolloutStatus('statefulset', { ...sts({}), status: { observedGeneration: 0 } }).state, 'waiting');
    assert.equal(rolloutStatus('statefulset', sts({ readyReplicas: 2 })).message, '2 of 3 pods ready');
    assert.equal(rolloutStatus('statefulset', sts({ readyReplicas: 3, updatedReplicas: 1, currentRevision: 'a', updateRevision: 'b' })).state, 'waiting');
    assert.equal(rolloutStatus('statefulset', sts({ readyReplicas: 3, updatedReplicas: 3, currentRevision: 'b', updateRevision: 'b' })).state, 'done');
    assert.deepEqual(rolloutStatus('statefulset', sts({ readyReplicas: 3, updatedReplicas: 1 }, 2)), { state: 'done', message: '1/1 pods updated (partition 2)' });
    assert.equal(rolloutStatus('statefulset', sts({ readyReplicas: 3, updatedReplicas: 0 }, 2)).state, 'waiting');
  });
  test('cronjob is not tracked', () => assert.equal(rolloutStatus('cronjob', {}).state, 'untracked'));
  test('pod summary shows no env, command or message', () => {
    const pod = {
      metadata: { name: 'web-1' },
      spec: { containers: [{ name: 'app', image: 'a:2', env: [{ name: 'PASSWORD', value: 'hunter2-secret' }], command: ['--token=abc'] }] },
      status: { phase: 'Running', conditions: [{ type: 'Ready', status: 'False' }], containerStatuses: [
        { name: 'app', image: 'a:2', ready: false, restartCount: 3, state: { waiting: { reason: 'CrashLoopBackOff', message: 'back-off; PASSWORD=hunter2-secret' } } }] },
    };
    const s = summarizePod(pod, 'app');
    assert.deepEqual(s, { name: 'web-1', phase: 'Running', ready: false, image: 'a:2', restarts: 3, reason: 'CrashLoopBackOff' });
    assert.doesNotMatch(JSON.stringify(s), /hunter2|token/);
    const pending = { metadata: { name: 'web-2', deletionTimestamp: undefined }, spec: { containers: [{ name: 'app', image: 'a:2' }] },
      status: { phase: 'Pending', conditions: [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable' }] } };
    assert.deepEqual(summarizePod(pending, 'app'), { name: 'web-2', phase: 'Pending', ready: false, image: 'a:2', restarts: 0, reason: 'Unschedulable' });
    assert.equal(summarizePod({ ...pod, metadata: { name: 'web-1', deletionTimestamp: '2030-01-01T00:00:00Z' } }, 'app').phase, 'Terminating');
  });
  test("pod summary: a failing container's last exit (a crash loop's previous run) and pull error", () => {
    const pod = (statuses: object[], ready = 'False') => ({ metadata: { name: 'web-1' }, spec: { containers: [{ name: 'app', image: 'a:2' }] },
      status: { phase: 'Running', conditions: [{ type: 'Ready', status: ready }], containerStatuses: statuses } });
    const crashing = { name: 'app', image: 'a:2', ready: false, restartCount: 4,
      state: { waiting: { reason: 'CrashLoopBackOff', message: 'back-off 40s restarting failed container' } },
      lastState: { terminated: { exitCode: 137, reason: 'OOMKilled', message: '  killed at 512Mi\n' } } };
    assert.deepEqual(summarizePod(pod([crashing]), 'app').failure,
      { container: 'app', lastExit: { code: 137, reason: 'OOMKilled', message: 'killed at 512Mi' }, restarted: true });
    // A sidecar that fails is the one told, though the summary's image and restarts stay the named container's.
    const sidecar = { name: 'proxy', image: 'p:1', ready: false, restartCount: 0,
      state: { waiting: { reason: 'ImagePullBackOff', message: 'Back-off pulling image "p:1": not found' } } };
    const both = summarizePod(pod([{ name: 'app', image: 'a:2', ready: true, restartCount: 0, state: { running: {} } }, sidecar]), 'app');
    assert.deepEqual(both.failure, { container: 'proxy', pullError: 'Back-off pulling image "p:1": not found' });
    assert.equal(both.reason, 'ImagePullBackOff');
    // A container that has ended now (a Job's, an init container's): its own exit, not a previous run.
    const ended = { name: 'app', image: 'a:2', ready: false, restartCount: 0, state: { terminated: { exitCode: 2, reason: 'Error' } } };
    assert.deepEqual(summarizePod(pod([ended]), 'app').failure, { container: 'app', lastExit: { code: 2, reason: 'Error' } });
    // A ready pod, or one waiting with nothing to say of why (ContainerCreating), has no failure.
    assert.equal('failure' in summarizePod(pod([crashing], 'True'), 'app'), false);
    const creating = { name: 'app', image: 'a:2', ready: false, restartCount: 0, state: { waiting: { reason: 'ContainerCreating' } } };
    assert.equal('failure' in summarizePod(pod([creating]), 'app'), false);
    // The message is kept whole up to the kubelet's own 4 KiB: the report's scrubber sees a secret before any cut.
    const long = { ...crashing, lastState: { terminated: { exitCode: 1, message: 'x'.repeat(10_000) } } };
    assert.equal(summarizePod(pod([long]), 'app').failure?.lastExit?.message?.length, 4096);
  });
  test('a log tail: the line the byte limit cut left out, terminal escapes and control characters taken out', () => {
    assert.deepEqual(logTail('one\ntwo\n'), ['one', 'two']);
    assert.deepEqual(logTail('\x1b[31mred\x1b[0m\tdone\r\n'), ['red\tdone']);
    // A body of limitBytes ends inside a line: that line is not shown (a secret in it could be cut in two).
    const full = `${'a'.repeat(100)}\n${'b'.repeat(4096 - 101)}`;
    assert.deepEqual(logTail(full), ['a'.repeat(100)]);
    assert.equal(logTail(Array.from({ length: 30 }, (_, i) => `line ${i}`).join('\n') + '\n').length, 20);
  });
  test('the report tells why for the first three failing pods: last exit, pull error, log lines or why not read', () => {
    const failing = (n: number, failure: PodSummary['failure']): PodSummary =>
      ({ name: `web-${n}`, phase: 'Running', ready: false, image: 'r.io/ns/app:v2', restarts: 2, reason: 'CrashLoopBackOff', failure });
    const crash = { container: 'app', lastExit: { code: 1, reason: 'Error', message: 'boom\nat main.go:12' }, restarted: true };
    const report: Delivery = {
      ...newReport(), decision: 'applied', action: 'image updated', changed: true, result: 'failed', error: 'the rollout failed (see rollout)', notes: [],
      rollout: { state: 'failed', detail: 'pods not ready', pods: [
        { name: 'web-0', phase: 'Running', ready: true, image: 'r.io/ns/app:v1', restarts: 0 },
        failing(1, { ...crash, log: { lines: ['starting', 'panic: boom'] } }),
        failing(2, { ...crash, log: { unreadable: 'not granted get on pods/log' } }),
        { ...failing(3, { container: 'proxy', pullError: 'not found' }), reason: 'ImagePullBackOff' },
        failing(4, { ...crash, log: { lines: ['never shown'] } }),
      ] },
    };
    assert.equal(formatReport(report).split('\n').slice(3, -1).join('\n'), [
      'pod web-0: Running, ready, image r.io/ns/app:v1, restarts 0',
      'pod web-1: Running, not ready, image r.io/ns/app:v2, restarts 2, CrashLoopBackOff; last exit 1 (Error): boom ⏎ at main.go:12',
      '  log (container app, previous run), last 2 lines:',
      '  | starting',
      '  | panic: boom',
      'pod web-2: Running, not ready, image r.io/ns/app:v2, restarts 2, CrashLoopBackOff; last exit 1 (Error): boom ⏎ at main.go:12',
      '  log (container app, previous run): not readable: not granted get on pods/log',
      'pod web-3: Running, not ready, image r.io/ns/app:v2, restarts 2, ImagePullBackOff; pull error: not found',
      'pod web-4: Running, not ready, image r.io/ns/app:v2, restarts 2, CrashLoopBackOff',
    ].join('\n'));
    // The pods of the image rolled out are told first: an old pod failing since before the push comes after them.
    const old = { ...failing(0, crash), image: 'r.io/ns/app:v1' };
    const rolled: Delivery = { ...report, imageAfter: 'r.io/ns/app:v2', rollout: { ...report.rollout!, pods: [old, ...report.rollout!.pods.slice(1)] } };
    assert.match(formatReport(rolled), /^pod web-0: Running, not ready, image r\.io\/ns\/app:v1, restarts 2, CrashLoopBackOff$/m);
  });
  test('pod summary: the digest the kubelet pulled, from a repository imageID only', () => {
    const digest = `sha256:${'ab'.repeat(32)}`;
    const pod = (imageID: string) => ({ metadata: { name: 'web-1' }, spec: { containers: [{ name: 'app', image: 'r.example/a:2' }] },
      status: { phase: 'Running', containerStatuses: [{ name: 'app', image: 'r.example/a:2', imageID, ready: true, restartCount: 0 }] } });
    assert.equal(summarizePod(pod(`r.example/a@${digest}`), 'app').digest, digest);
    assert.equal(summarizePod(pod(`docker-pullable://r.example/a@${digest}`), 'app').digest, digest);
    // containerd and CRI-O may report the image's config id: not a digest a registry serves by that name.
    assert.equal('digest' in summarizePod(pod(digest), 'app'), false);
    assert.equal('digest' in summarizePod(pod(''), 'app'), false);
  });
  test("a workload is kept without managedFields and kubectl apply's last-applied-configuration; the rest as it is", () => {
    const applied = JSON.stringify({ kind: 'Deployment', metadata: { name: 'web' }, spec: { replicas: 3 } });
    const read = {
      metadata: {
        name: 'web', generation: 4,
        annotations: { 'kubectl.kubernetes.io/last-applied-configuration': applied, 'webhook/last-push': '{"tag":"v2"}' },
        managedFields: [{ manager: 'kubectl', operation: 'Update' }],
      },
      spec: { replicas: 3 },
    };
    const before = JSON.stringify(read);
    const lean = leanWorkload(read);
    assert.deepEqual(lean, { metadata: { name: 'web', generation: 4, annotations: { 'webhook/last-push': '{"tag":"v2"}' } }, spec: { replicas: 3 } });
    assert.equal(JSON.stringify(read), before, 'the object read is left as it was');
    assert.equal(lean.spec, read.spec, 'what is kept is shared, not copied');
    const already = { metadata: { name: 'api', annotations: { a: 'b' } } };
    assert.equal(leanWorkload(already), already);
  });
});

describe('retry policy', () => {
  test('transient failures back off exponentially within the budget', () => {
    assert.equal(retryDelay({ verb: 'get', code: 'ECONNREFUSED' }, 0, 20_000), 200);
    assert.equal(retryDelay({ verb: 'get', code: 'ECONNRESET' }, 3, 20_000), 1_600);
    assert.equal(retryDelay({ verb: 'get', status: 503 }, 10, 20_000), 5_000);
    assert.equal(retryDelay({ verb: 'get', status: 503 }, 10, 4_000), undefined);
    assert.equal(retryDelay({ verb: 'patch', status: 409 }, 0, 20_000), 200);
    assert.equal(retryDelay({ verb: 'get', status: 429, retryAfterSeconds: 3 }, 0, 20_000, () => 0), 3_000);
    assert.equal(retryDelay({ verb: 'get', status: 429, retryAfterSeconds: 30 }, 0, 20_000, () => 0), undefined);
  });
  test('permanent failures are not retried', () => {
    for (const status of [400, 401, 403, 404, 422]) assert.equal(retryDelay({ verb: 'patch', status }, 0, 20_000), undefined, String(status));
    assert.equal(retryDelay({ verb: 'create', status: 409 }, 0, 20_000), undefined);
    assert.equal(retryDelay({ verb: 'get', code: 'CERT_HAS_EXPIRED' }, 0, 20_000), undefined);
  });
});

describe('kubeconfig and in-cluster credentials', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kubeconfig-'));
  after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const secret = 'sEcReT-token-' + randomBytes(8).toString('hex');
  const write = (name: string, config: unknown) => {
    const file = path.join(dir, name);
    fs.writeFileSync(file, typeof config === 'string' ? config : JSON.stringify(config));
    return file;
  };
  const base = (user: Record<string, unknown>) => ({
    'current-context': 'c',
    contexts: [{ name: 'c', context: { cluster: 'k', user: 'u', namespace: 'prod' } }],
    clusters: [{ name: 'k', cluster: { server: 'https://10.0.0.1:6443/k8s/clusters/c-abc/', 'certificate-authority': 'ca.pem' } }],
    users: [{ name: 'u', user }],
  });
  fs.writeFileSync(path.join(dir, 'ca.pem'), 'CA');
  test('token, CA file relative to the kubeconfig, path prefix kept', () => {
    const c = loadKubeconfig(write('token.json', base({ token: secret })));
    assert.equal(c.server, 'https://10.0.0.1:6443/k8s/clusters/c-abc');
    assert.equal(c.ca?.toString(), 'CA');
    assert.equal(c.namespace, 'prod');
    assert.equal(c.token, secret);
    assert.doesNotMatch(c.source, new RegExp(secret));
  });
  test('tokenFile and client certificate files', () => {
    fs.writeFileSync(path.join(dir, 'tok'), secret);
    assert.equal(loadKubeconfig(write('tf.json', base({ tokenFile: 'tok' }))).tokenFile, path.join(dir, 'tok'));
    fs.writeFileSync(path.join(dir, 'c.pem'), 'C');
    fs.writeFileSync(path.join(dir, 'k.pem'), 'K');
    const c = loadKubeconfig(write('cert.json', base({ 'client-certificate': 'c.pem', 'client-key': 'k.pem' })));
    assert.equal(c.cert?.toString(), 'C');
    assert.equal(c.key?.toString(), 'K');
  });
  test('errors name the place and never the content', () => {
    const yaml = write('yaml', `apiVersion: v1\nusers:\n- name: u\n  user:\n    token: [${secret}\n`);
    assert.throws(() => loadKubeconfig(yaml), (e: Error) => e instanceof KubeConfigError && /not a YAML or JSON kubeconfig/.test(e.message) && !e.message.includes(secret));
    assert.throws(() => loadKubeconfig(write('exec.json', base({ exec: { command: 'aws' } }))), /users\["u"\]\.user\.exec\.apiVersion "": not client\.authentication\.k8s\.io\/v1/);
    assert.throws(() => loadKubeconfig(write('nouser.json', base({}))), /users\["u"\]\.user: no credentials/);
    assert.throws(() => loadKubeconfig(write('noctx.json', { ...base({ token: secret }), 'current-context': 'x' })), /contexts: no entry named "x"/);
    assert.throws(() => loadKubeconfig(path.join(dir, 'missing.json')), /cannot read it \(ENOENT\)/);
    assert.throws(() => loadKubeconfig(write('half.json', base({ 'client-certificate-data': 'QQ==' }))), /client-certificate and client-key must be given together/);
  });
  test('precedence: flag, KUBECONFIG, service account', () => {
    const a = write('a.json', base({ token: 'a' }));
    const b = write('b.json', base({ token: 'b' }));
    assert.equal(credentialsFromEnvironment({ KUBECONFIG: b }, a).token, 'a');
    assert.equal(credentialsFromEnvironment({ KUBECONFIG: b }).token, 'b');
    assert.throws(() => credentialsFromEnvironment({}), /not running in a pod \(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set\)/);
    assert.equal(credentialsFromEnvironment({ KUBECONFIG: `${b}:${a}` }).token, 'b', 'a list: the first file wins');
  });
  test('in-cluster', () => {
    const sa = path.join(dir, 'sa');
    fs.mkdirSync(sa);
    assert.throws(() => inClusterCredentials({ KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' }, sa), /cannot read .*token \(ENOENT\): is automountServiceAccountToken disabled/);
    fs.writeFileSync(path.join(sa, 'token'), secret);
    fs.writeFileSync(path.join(sa, 'ca.crt'), 'CA');
    fs.writeFileSync(path.join(sa, 'namespace'), 'cattle-system\n');
    const c = inClusterCredentials({ KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '443' }, sa);
    assert.equal(c.server, 'https://[fd00::1]:443');
    assert.equal(c.namespace, 'cattle-system');
    assert.equal(c.token, undefined, 'the token is read per request, not kept');
  });
});

describe('output and ordering', () => {
  test('the report format is stable', () => {
    const report: Delivery = {
      ...newReport(), decision: 'applied', namespace: 'prod', workload: 'deployment/web', container: 'app', imageBefore: 'r.io/ns/app:v1', imageAfter: 'r.io/ns/app:v2',
      action: 'image updated', changed: true, result: 'failed', error: 'the rollout failed (see rollout)', notes: ['event not recorded: x'],
      rollout: { state: 'failed', detail: 'pods not ready: web-1 CrashLoopBackOff', pods: [
        { name: 'web-1', phase: 'Running', ready: false, image: 'r.io/ns/app:v2', restarts: 1, reason: 'CrashLoopBackOff' },
        { name: 'web-0', phase: 'Running', ready: true, image: 'r.io/ns/app:v1', restarts: 0 }] },
    };
    assert.equal(formatReport(report), [
      'workload:     deployment/web in namespace prod',
      'container:    app',
      'image before: r.io/ns/app:v1',
      'image after:  r.io/ns/app:v2',
      'action:       image updated',
      'result:       failed: the rollout failed (see rollout)',
      'rollout:      failed: pods not ready: web-1 CrashLoopBackOff',
      'pod web-1: Running, not ready, image r.io/ns/app:v2, restarts 1, CrashLoopBackOff',
      'pod web-0: Running, ready, image r.io/ns/app:v1, restarts 0',
      'note:         event not recorded: x',
      '',
    ].join('\n'));
  });
  test('WorkloadQueue runs one key in arrival order, other keys in parallel', async () => {
    const q = new WorkloadQueue();
    const log: string[] = [];
    const task = (name: string, ms: number, fail = false) => async () => {
      log.push(`start ${name}`);
      await new Promise((r) => setTimeout(r, ms));
      log.push(`end ${name}`);
      if (fail) throw new Error(name);
      return name;
    };
    const results = await Promise.allSettled([q.run('a', task('a1', 30, true)), q.run('a', task('a2', 1)), q.run('b', task('b1', 5)), q.run('a', task('a3', 1))]);
    assert.deepEqual(results.map((r) => r.status), ['rejected', 'fulfilled', 'fulfilled', 'fulfilled']);
    assert.deepEqual(log.filter((l) => /a\d/.test(l)), ['start a1', 'end a1', 'start a2', 'end a2', 'start a3', 'end a3']);
    assert.ok(log.indexOf('end b1') < log.indexOf('end a1'), 'b does not wait for a');
  });
  test('a push without digest or time is a repeat for the window only (the record on the workload decides)', () => {
    const record = { pushedAt: new Date(1_000).toISOString(), timeFrom: 'received' as const, image: 'a:1', push: '|', previous: 'a:0', appliedAt: new Date(1_000).toISOString() };
    const push = { pushedAtMs: 60_000, timeFrom: 'received' as const, image: 'a:1', push: '|' };
    assert.equal(decidePush(record, push, 60_000).kind, 'repeat');
    assert.equal(decidePush(record, { ...push, pushedAtMs: 62_000 }, 62_000).kind, 'apply');
  });
  test('invalid input fails before any API call', async () => {
    // A client that cannot connect: any request would fail with a connection error instead.
    const client = new KubeClient({ server: 'https://127.0.0.1:1', source: 'test' }, { retryBudgetMs: 0 });
    const env = { APP_NS: 'prod', APP_WORKLOAD: 'deployment/web', APP_CONTAINER: 'app', REPO_TYPE: 'regionalregistry' };
    const r = await runUpgrade([fixture('acr-push.json')], env, { client });
    assert.equal(r.exitCode, 1);
    assert.match(r.output, /^result: +failed: repository\.repo_full_name "namespace\/repoTest" is not a valid repository name/m);
    const ping = await runUpgrade([fixture('dockerhub-test-ping.json')], { ...env, REPO_TYPE: 'publicregistry' }, { client });
    assert.equal(ping.exitCode, 0);
    assert.match(ping.output, /^action: +none \(test ping: /m);
    assert.match(ping.output, /^result: +ok$/m);
    const bad = await runUpgrade(['{}'], { ...env, APP_WORKLOAD: 'pod/web' }, { client });
    assert.match(bad.output, /^action: +none \(nothing was changed\)\nresult: +failed: APP_WORKLOAD "pod\/web": unknown kind "pod"/m);
    assert.equal((await runUpgrade(['{}'], { ...env, APP_NS: '' }, { client })).report.error, 'APP_NS is not set (the hook passes it from the URL parameter ns)');
    assert.match((await runUpgrade(['{}'], { ...env, ROLLOUT_TIMEOUT: '5 minutes' }, { client })).report.error!, /^ROLLOUT_TIMEOUT "5 minutes" is not a duration/);
    client.close();
  });
});

// ------------------------------------------------------------------------------------------------
// On a real cluster

const cluster = await clusterOrSkip();

describe('upgrade on a real cluster', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('upgrade');
  let client: KubeClient;
  const kubectl = kubectlFor(cluster!);
  const getJson = async (what: string): Promise<any> => JSON.parse(await kubectl(['-n', ns, 'get', what, '-o', 'json', '--show-managed-fields']));
  const apply = (obj: unknown) => kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify(obj));
  const env = (workload: string, container = 'app', more: Record<string, string> = {}) => ({ APP_NS: ns, APP_WORKLOAD: workload, APP_CONTAINER: container, REPO_TYPE: 'regionalregistry', ...more });
  const image = (tag: string) => acrImage(tag);
  const events = async (name: string) => (await getJson('events')).items.filter((e: any) => e.involvedObject.name === name);

  before(async () => {
    await kubectl(['create', 'namespace', ns]);
    client = new KubeClient(loadKubeconfig(cluster!.kubeconfigPath));
    await apply({ apiVersion: 'v1', kind: 'List', items: [
      deployment('web', [{ name: 'app-sidecar', image: 'busybox:1.36' }, { name: 'app', image: image('v1') }]),
      daemonSet('agent', [{ name: 'app', image: 'shopteam/web-api:v1' }]),
      statefulSet('db', 2, [{ name: 'app', image: 'harbor.example.com:8443/shop/web-api:1.4.1' }]),
      cronJob('nightly', [{ name: 'app', image: image('v1') }], [{ name: 'migrate', image: image('v1') }]),
      deployment('broken', [{ name: 'app', image: image('v1') }], { progressDeadlineSeconds: 3, replicas: 1 }, { 'webhook-test/unready': 'true' }),
      daemonSet('crashing', [{ name: 'app', image: image('v1') }], { 'webhook-test/unready': 'true' }),
      deployment('busy', [{ name: 'app', image: image('v0') }], { replicas: 1 }),
      // No pods, so nothing but a spec change moves its resourceVersion once it has settled.
      deployment('still', [{ name: 'app-sidecar', image: 'busybox:1.36' }, { name: 'app', image: image('v1') }], { replicas: 0 }),
    ] });
    for (const w of ['deployment/web', 'daemonset/agent', 'statefulset/db', 'deployment/busy', 'deployment/still']) await kubectl(['-n', ns, 'rollout', 'status', w, '--timeout=90s']);
  });
  after(async () => {
    client?.close();
    await removeNamespace(kubectl, ns);
  });

  test('deployment: only the named container changes; change-cause, event, field manager; rollout completes', async () => {
    const r = await runUpgrade([acrPayload('v2')], env('deployment/web', 'app', { ROLLOUT_TIMEOUT: '60s' }), { client, hookId: 'redeploy', requestId: 'req-42' });
    assert.equal(r.exitCode, 0, r.output);
    const lines = r.output.split('\n');
    assert.deepEqual(lines.slice(0, 7), [
      `workload:     deployment/web in namespace ${ns}`,
      'container:    app',
      `image before: ${image('v1')}`,
      `image after:  ${image('v2')}`,
      'action:       image updated',
      'result:       ok',
      'rollout:      complete (2/2 pods updated and available)',
    ]);
    assert.equal(lines.filter((l) => /^pod web-\S+: Running, ready, image registry\.cn-hangzhou\.aliyuncs\.com\/shop\/web-api:v2, restarts 0$/.test(l)).length, 2, r.output);
    const d = await getJson('deployment/web');
    assert.equal(containerImage(d, 'app'), image('v2'));
    assert.equal(containerImage(d, 'app-sidecar'), 'busybox:1.36');
    assert.equal(d.metadata.annotations['kubernetes.io/change-cause'], `webhook: set app image to ${image('v2')} (hook "redeploy", request req-42)`);
    assert.ok(d.metadata.managedFields.some((f: any) => f.manager === 'webhook' && f.operation === 'Update'));
    const ev = (await events('web')).find((e: any) => e.reason === 'ImageUpdated');
    assert.equal(ev?.message, `container app: image ${image('v1')} → ${image('v2')}; asked by hook "redeploy", request req-42`);
    assert.equal(ev?.involvedObject.uid, d.metadata.uid);
    assert.ok((await events('web')).some((e: any) => e.reason === 'RolloutComplete'));
    assert.equal(r.report.target?.uid, d.metadata.uid);
  });

  test('same image: rollout restarted, Always, restartedAt; not waited for by default', async () => {
    const before = await getJson('deployment/web');
    const now = new Date('2030-01-02T03:04:05.678Z');
    const r = await runUpgrade([acrPayload('v2')], env('deployment/web'), { client, now: () => now });
    assert.equal(r.exitCode, 0, r.output);
    assert.match(r.output, /^action: +rollout restarted \(same image re-pulled\)$/m);
    assert.match(r.output, /^rollout: +progressing \(not waited for: ROLLOUT_TIMEOUT is 0\)$/m);
    const d = await getJson('deployment/web');
    assert.equal(d.spec.template.metadata.annotations['kubectl.kubernetes.io/restartedAt'], '2030-01-02T03:04:05Z');
    const app = d.spec.template.spec.containers.find((c: any) => c.name === 'app');
    const sidecar = d.spec.template.spec.containers.find((c: any) => c.name === 'app-sidecar');
    assert.equal(app.imagePullPolicy, 'Always');
    assert.equal(sidecar.imagePullPolicy, before.spec.template.spec.containers.find((c: any) => c.name === 'app-sidecar').imagePullPolicy);
    assert.equal(d.metadata.generation, before.metadata.generation + 1);
    assert.ok((await events('web')).some((e: any) => e.reason === 'RolloutRestarted'));
    await kubectl(['-n', ns, 'rollout', 'status', 'deployment/web', '--timeout=60s']);
  });

  test('image comparison is normalised: docker.io/library/nginx:1 equals nginx:1', async () => {
    await apply(deployment('plain', [{ name: 'app', image: 'nginx:1' }], { replicas: 1 }));
    const payload = JSON.stringify({ push_data: { tag: '1' }, repository: { repo_url: 'https://docker.io/', namespace: 'library', name: 'nginx' } });
    const r = await runUpgrade([payload], env('deploy/plain', 'app', { REPO_TYPE: 'custom' }), { client });
    assert.match(r.output, /^action: +rollout restarted \(same image re-pulled\)$/m, r.output);
    assert.equal(containerImage(await getJson('deployment/plain'), 'app'), 'nginx:1');
  });

  test('daemonset from a Docker Hub push', async () => {
    const r = await runUpgrade([fixture('dockerhub-push.json')], env('DS/agent', 'app', { REPO_TYPE: 'publicregistry', ROLLOUT_TIMEOUT: '60s' }), { client });
    assert.equal(r.exitCode, 0, r.output);
    assert.match(r.output, /^image after: +shopteam\/web-api:v2\.3\.1$/m);
    assert.match(r.output, /^rollout: +complete \(2\/2 pods updated and available\)$/m);
    assert.equal(containerImage(await getJson('daemonset/agent'), 'app'), 'shopteam/web-api:v2.3.1');
    assert.doesNotMatch(r.output, /Lorem|rm -rf/);
  });

  test('statefulset from a build job (custom)', async () => {
    const r = await runUpgrade([fixture('custom-push.json')], env('statefulsets/db', 'app', { REPO_TYPE: 'custom', ROLLOUT_TIMEOUT: '90s' }), { client });
    assert.equal(r.exitCode, 0, r.output);
    assert.match(r.output, /^rollout: +complete \(2\/2 pods updated and ready\)$/m);
    assert.equal(containerImage(await getJson('statefulset/db'), 'app'), 'harbor.example.com:8443/shop/web-api:1.4.2');
  });

  test('cronjob: the job template changes; nothing to follow', async () => {
    const r = await runUpgrade([acrPayload('v2')], env('cj/nightly', 'app', { NET_TYPE: 'vpc', ROLLOUT_TIMEOUT: '30s' }), { client });
    assert.equal(r.exitCode, 0, r.output);
    assert.match(r.output, /^rollout: +not tracked \(cronjob: the next run uses the new image\)$/m);
    const cj = await getJson('cronjob/nightly');
    const tpl = cj.spec.jobTemplate.spec.template;
    assert.equal(containerImage(cj, 'app', tpl), 'registry-vpc.cn-hangzhou.aliyuncs.com/shop/web-api:v2');
    assert.equal(tpl.spec.initContainers[0].image, image('v1'));
    // An init container is found when no regular container has the name.
    const init = await runUpgrade([acrPayload('v3')], env('cj/nightly', 'migrate'), { client });
    assert.equal(init.exitCode, 0, init.output);
    assert.equal((await getJson('cronjob/nightly')).spec.jobTemplate.spec.template.spec.initContainers[0].image, image('v3'));
    const same = await runUpgrade([acrPayload('v3')], env('cj/nightly', 'migrate'), { client });
    assert.match(same.output, /^action: +next run re-pulls the image \(same image; imagePullPolicy: Always\)$/m);
    assert.equal((await getJson('cronjob/nightly')).spec.jobTemplate.spec.template.spec.initContainers[0].imagePullPolicy, 'Always');
  });

  test('digest pinning, and the same digest again changes nothing', async () => {
    const payload = acrPayload('v5');
    const digest = JSON.parse(payload).push_data.digest;
    const r = await runUpgrade([payload], env('deployment/busy', 'app', { PIN_DIGEST: 'true' }), { client });
    assert.equal(r.exitCode, 0, r.output);
    assert.equal(containerImage(await getJson('deployment/busy'), 'app'), `${image('v5')}@${digest}`);
    // The generation counts spec changes (the resourceVersion also moves with rollout status).
    const generation = (await getJson('deployment/busy')).metadata.generation;
    const again = await runUpgrade([payload], env('deployment/busy', 'app', { PIN_DIGEST: 'true' }), { client });
    assert.equal(again.exitCode, 0);
    assert.match(again.output, /^action: +none \(already running this digest\)$/m);
    assert.equal((await getJson('deployment/busy')).metadata.generation, generation);
  });

  test('refusals leave the cluster unchanged', async () => {
    const rv = async () => (await getJson('deployment/still')).metadata.resourceVersion;
    const beforeRv = await rv();
    const cases: Array<[string[], Record<string, string>, RegExp]> = [
      [[acrPayload('v 1')], env('deployment/still'), /push_data\.tag "v 1" is not a valid tag/],
      [[acrPayload('$(id)')], env('deployment/still'), /push_data\.tag "\$\(id\)" is not a valid tag/],
      [[fixture('acr-push.json')], env('deployment/still'), /OCI repository names are lower-case, and "repoTest" is not/],
      [[acrPayload('x'.repeat(200))], env('deployment/still'), /is 200 characters long \(a tag has at most 128\)/],
      [[acrPayload('v9')], env('deployment/still', 'app', { REPO_TYPE: 'artifactory' }), /REPO_TYPE "artifactory" is not supported/],
      [['{"push_data": {"tag": "v9"'], env('deployment/still'), /payload is not JSON/],
      [[acrPayload('v9')], env('deployment/nope'), new RegExp(`deployment "nope" not found in namespace "${ns}"$`, 'm')],
      [[acrPayload('v9')], env('deployment/still', 'ap'), /container "ap" not found in deployment\/still \(containers: app-sidecar, app\)/],
      [[acrPayload('v9')], env('statefulset/still'), new RegExp(`statefulset "still" not found in namespace "${ns}"$`, 'm')],
    ];
    for (const [args, e, message] of cases) {
      const r = await runUpgrade(args, e, { client });
      assert.equal(r.exitCode, 1, r.output);
      assert.match(r.output, /^action: +none \(nothing was changed\)$/m, r.output);
      assert.match(r.output, message);
    }
    assert.equal(await rv(), beforeRv);
    const missing = await runUpgrade([acrPayload('v9')], { ...env('deployment/still'), APP_NS: `${ns}-absent` }, { client });
    assert.match(missing.output, /deployment "still" not found in namespace "[^"]+-absent"$/m);
    assert.ok((await events('still')).some((e: any) => e.reason === 'UpgradeFailed' && e.type === 'Warning' && /container "ap" not found/.test(e.message)));
  });

  test('the image pin: another repository is refused before any write and recorded as a Warning Event; ALLOW_IMAGES allows it', async () => {
    await apply(deployment('pinned', [{ name: 'app', image: image('v1') }], { replicas: 1 }));
    const before = await getJson('deployment/pinned');
    const evil = JSON.stringify({ push_data: { tag: 'pwn' }, repository: { repo_url: 'evil.example:5000', namespace: 'x', name: 'backdoor' } });
    const cases: Array<[string, Record<string, string>, string]> = [
      [evil, env('deployment/pinned', 'app', { REPO_TYPE: 'custom' }), 'evil.example:5000/x/backdoor'],
      // Any namespace of the shared ACR endpoint is another repository.
      [acrPayload('v2', 'attacker/web-api'), env('deployment/pinned'), 'registry.cn-hangzhou.aliyuncs.com/attacker/web-api'],
      // REGISTRY_HOST holds for a Docker Hub push too.
      [fixture('dockerhub-push.json'), env('deployment/pinned', 'app', { REPO_TYPE: 'publicregistry', REGISTRY_HOST: 'registry.cn-hangzhou.aliyuncs.com' }),
        'registry.cn-hangzhou.aliyuncs.com/shopteam/web-api'],
    ];
    for (const [payload, e, pushed] of cases) {
      const r = await runUpgrade([payload], e, { client, hookId: 'web', requestId: 'req-pin' });
      assert.equal(r.exitCode, 1, r.output);
      assert.equal(r.report.refused, true);
      assert.equal(r.report.changed, false);
      assert.match(r.output, /^action: +none \(nothing was changed\)$/m);
      assert.ok(r.output.includes(`result:       failed: image pin: container "app" runs repository "registry.cn-hangzhou.aliyuncs.com/shop/web-api", and the push names repository "${pushed}"; a push may change only the tag and digest, unless the hook setting ALLOW_IMAGES lists the repository\n`), r.output);
    }
    const after = await getJson('deployment/pinned');
    assert.equal(after.metadata.generation, before.metadata.generation);
    assert.deepEqual(after.spec.template, before.spec.template);
    assert.equal(after.metadata.annotations?.['kubernetes.io/change-cause'], undefined);
    const refusals = (await events('pinned')).filter((ev: any) => ev.reason === 'UpgradeRefused');
    assert.equal(refusals.length, cases.length);
    assert.ok(refusals.every((ev: any) => ev.type === 'Warning' && ev.message.endsWith('; asked by hook "web", request req-pin')));
    assert.ok(refusals.some((ev: any) => ev.message.includes('the push names repository "evil.example:5000/x/backdoor"')));

    const widened = await runUpgrade([evil], env('deployment/pinned', 'app', { REPO_TYPE: 'custom', ALLOW_IMAGES: 'evil.example:5000/x/*' }), { client });
    assert.equal(widened.exitCode, 0, widened.output);
    assert.match(widened.output, /^action: +image updated$/m);
    assert.match(widened.output, /^note: +image pin: "evil\.example:5000\/x\/backdoor" allowed by ALLOW_IMAGES pattern "evil\.example:5000\/x\/\*"$/m);
    assert.equal(containerImage(await getJson('deployment/pinned'), 'app'), 'evil.example:5000/x/backdoor:pwn');
  });

  test('a rollout that fails: ProgressDeadlineExceeded, pods with their reasons', async () => {
    const r = await runUpgrade([acrPayload('v2')], env('deployment/broken', 'app', { ROLLOUT_TIMEOUT: '60s' }), { client });
    assert.equal(r.exitCode, 1, r.output);
    assert.match(r.output, /^action: +image updated$/m);
    assert.match(r.output, /^result: +failed: the rollout failed \(see rollout\)$/m);
    assert.match(r.output, /^rollout: +failed: ProgressDeadlineExceeded: /m);
    assert.match(r.output, /^pod broken-\S+: Running, not ready, image registry\.cn-hangzhou\.aliyuncs\.com\/shop\/web-api:v2, restarts 1, CrashLoopBackOff; last exit 1 \(Error\)$/m);
    assert.ok((await events('broken')).some((e: any) => e.reason === 'RolloutFailed' && e.type === 'Warning'));
  });

  test('a rollout whose pods never become ready: failed at the deadline with the waiting reason', async () => {
    const r = await runUpgrade([acrPayload('v2')], env('daemonset/crashing', 'app', { ROLLOUT_TIMEOUT: '4s' }), { client });
    assert.equal(r.exitCode, 1, r.output);
    assert.match(r.output, /^rollout: +failed: pods not ready: crashing-\S+ CrashLoopBackOff/m);
  });

  test('a rollout still going at the deadline: timed out', async () => {
    const r = await runUpgrade([acrPayload('v6')], env('deployment/busy', 'app', { ROLLOUT_TIMEOUT: '1ms' }), { client });
    assert.equal(r.exitCode, 1, r.output);
    assert.match(r.output, /^result: +failed: the rollout did not complete within 0\.001s \(see rollout\)$/m);
    assert.match(r.output, /^rollout: +timed out: after 0\.001s: (waiting for the deployment controller to observe the change|\d+ of 1 pods updated|.*available)$/m);
    await kubectl(['-n', ns, 'rollout', 'status', 'deployment/busy', '--timeout=60s']);
  });

  test('20 concurrent pushes end on the last received; a repeated notification is not applied twice', async () => {
    const queue = new WorkloadQueue();
    const tags = Array.from({ length: 20 }, (_, i) => `c${i}`);
    const results = await Promise.all(tags.map((t) => runUpgrade([acrPayload(t)], env('deployment/busy'), { client, queue })));
    assert.ok(results.every((r) => r.exitCode === 0), results.map((r) => r.output).join('\n'));
    assert.deepEqual(results.map((r) => r.report.imageBefore), [image('v6'), ...tags.slice(0, -1).map(image)], 'applied in arrival order');
    assert.equal(containerImage(await getJson('deployment/busy'), 'app'), image('c19'));
    const payload = acrPayload('c19');
    const first = await runUpgrade([payload], env('deployment/busy'), { client, queue });
    assert.match(first.output, /^action: +rollout restarted/m);
    const generation = (await getJson('deployment/busy')).metadata.generation;
    const repeat = await runUpgrade([payload], env('deployment/busy'), { client, queue });
    assert.equal(repeat.exitCode, 0);
    assert.match(repeat.output, /^action: +none \(the same push was applied \d+s ago: a repeated notification\)$/m);
    assert.equal((await getJson('deployment/busy')).metadata.generation, generation);
  });

  describe('as the ServiceAccount of deploy/, with the cluster-wide option rbac-cluster.yaml', () => {
    let token = '';
    let kubeconfig = '';
    let admin: any;
    let sa: Awaited<ReturnType<typeof shippedServiceAccount>>;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rbac-'));

    before(async () => {
      sa = await shippedServiceAccount(kubectl, cluster!, ns, [path.join(repoRoot, 'deploy/serviceaccount.yaml'), path.join(repoRoot, 'deploy/rbac-cluster.yaml')], dir);
      assert.deepEqual(sa.kinds, ['ServiceAccount', 'ClusterRole', 'ClusterRoleBinding']);
      ({ token, kubeconfig, admin } = sa);
    });
    after(async () => {
      await sa?.remove();
      fs.rmSync(dir, { recursive: true, force: true });
    });

    test('the shipped ClusterRole is enough for an upgrade with rollout tracking and events; a missing workload is named alone', async () => {
      const r = await runUpgrade([acrPayload('sa1')], env('deployment/web', 'app', { KUBECONFIG: kubeconfig, ROLLOUT_TIMEOUT: '60s' }), {});
      assert.equal(r.exitCode, 0, r.output);
      assert.match(r.output, /^rollout: +complete/m);
      assert.match(r.output, /^pod web-/m);
      assert.doesNotMatch(r.output, /^note:/m, 'events recorded, pods listed');
      const missing = await runUpgrade([acrPayload('sa1')], env('deployment/nope', 'app', { KUBECONFIG: kubeconfig }), {});
      assert.match(missing.output, new RegExp(`^result: +failed: deployment "nope" not found in namespace "${ns}"$`, 'm'));
      assert.doesNotMatch(missing.output, /\b(busy|still|broken)\b/, 'the namespace\'s other workloads are not listed');
      assert.ok(!r.output.includes(token) && !missing.output.includes(token));
    });

    test('a rotated token file is read again on every request', async () => {
      const sa = path.join(dir, 'serviceaccount');
      fs.mkdirSync(sa, { recursive: true });
      fs.writeFileSync(path.join(sa, 'ca.crt'), Buffer.from(admin.clusters[0].cluster['certificate-authority-data'], 'base64'));
      fs.writeFileSync(path.join(sa, 'token'), token);
      const server = new URL(admin.clusters[0].cluster.server);
      const c = new KubeClient(inClusterCredentials({ KUBERNETES_SERVICE_HOST: server.hostname, KUBERNETES_SERVICE_PORT: server.port }, sa));
      const ref = { group: 'apps', version: 'v1', resource: 'deployments', namespace: ns, name: 'web' };
      assert.equal((await c.get<any>(ref)).metadata.name, 'web');
      fs.writeFileSync(path.join(sa, 'token'), (await kubectl(['create', 'token', 'webhook', '-n', ns, '--duration=10m'])).trim());
      assert.equal((await c.get<any>(ref)).metadata.name, 'web');
      fs.writeFileSync(path.join(sa, 'token'), `${token}x`);
      await assert.rejects(c.get(ref), (e: Error) => e instanceof KubeError && e.status === 401 &&
        /^unauthorized: the API server rejected the credentials from the service account token .*\/token \(to get deployments\.apps "web" in namespace/.test(e.message) && !e.message.includes(token));
      c.close();
    });

    test('throttled by the API server (429 with Retry-After): waited out within the budget, then applied; past it, a clear error', async () => {
      const throttle = await apfThrottle(kubectl, ns, 'webhook', loadKubeconfig(kubeconfig));
      let release: (() => void) | undefined;
      try {
        release = await throttle.hold();
        const before = await throttle.rejected();
        const upgrade = runUpgrade([acrPayload('throttled')], env('deployment/web', 'app', { KUBECONFIG: kubeconfig }), {});
        // Released once the upgrade has been answered 429, however long its first request took.
        await throttle.rejectedBeyond(before);
        release();
        const r = await upgrade;
        assert.equal(r.exitCode, 0, r.output);
        assert.match(r.output, /^result: +ok$/m);
        assert.ok(await throttle.rejected() > before, 'the upgrade\'s own requests were answered 429 and retried');
        assert.equal(containerImage(await getJson('deployment/web'), 'app'), image('throttled'));

        release = await throttle.hold();
        const c = new KubeClient(loadKubeconfig(kubeconfig), { retryBudgetMs: 2_500 });
        await assert.rejects(c.get({ group: 'apps', version: 'v1', resource: 'deployments', namespace: ns, name: 'web' }), (e: Error) =>
          new RegExp(`^throttled: the API server answered 429 Too Many Requests to get deployments\\.apps "web" in namespace "${ns}" \\(Too many requests, please try again later\\.\\) \\(after \\d attempts in [\\d.]+s\\)$`).test(e.message) && !e.message.includes(token));
        c.close();
      } finally {
        release?.();
        await throttle.remove();
      }
    });

    test('without its binding: a clear 403 naming verb, resource and namespace; no token in output', async () => {
      await sa.unbind();
      let r: Awaited<ReturnType<typeof runUpgrade>> | undefined;
      // The authorizer's cache follows the deletion within moments.
      for (let i = 0; i < 50; i++) {
        r = await runUpgrade([acrPayload('sa2')], env('deployment/web', 'app', { KUBECONFIG: kubeconfig }), {});
        if (r.exitCode !== 0) break;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      assert.equal(r!.exitCode, 1, r!.output);
      assert.match(r!.output, new RegExp(`^result: +failed: forbidden: the service account "webhook" of namespace "${ns}" cannot "get" deployments\\.apps "web" in namespace "${ns}" — grant it with the RBAC that \`webhook -print-rbac\` prints for the hooks$`, 'm'));
      assert.ok(!r!.output.includes(token));
      assert.ok(!JSON.stringify(r!.report).includes(token));
    });
  });

  describe('transient failures', () => {
    const server = cluster ? new URL(JSON.parse(fs.readFileSync(cluster.kubeconfigPath, 'utf8')).clusters[0].cluster.server) : undefined;
    const ref = () => ({ group: 'apps', version: 'v1', resource: 'deployments', namespace: ns, name: 'web' });
    const credentialsVia = (port: number) => ({ ...loadKubeconfig(cluster!.kubeconfigPath), server: `https://127.0.0.1:${port}` });
    const freePort = () => new Promise<number>((resolve) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => { const p = (s.address() as net.AddressInfo).port; s.close(() => resolve(p)); });
    });
    /** A TCP relay to the real API server; the first `resets` connections are reset instead. */
    const relay = (port: number, resets = 0) => {
      let seen = 0;
      const s = net.createServer((socket) => {
        if (seen++ < resets) { socket.resetAndDestroy(); return; }
        const upstream = net.connect(Number(server!.port), server!.hostname);
        socket.pipe(upstream).pipe(socket);
        socket.on('error', () => upstream.destroy());
        upstream.on('error', () => socket.destroy());
      });
      return new Promise<net.Server>((resolve) => s.listen(port, '127.0.0.1', () => resolve(s)));
    };

    test('connection refused until the API server comes back: retried', async () => {
      const port = await freePort();
      const c = new KubeClient(credentialsVia(port));
      let s: net.Server | undefined;
      setTimeout(async () => { s = await relay(port); }, 700);
      assert.equal((await c.get<any>(ref())).metadata.name, 'web');
      c.close();
      s?.close();
    });
    test('connection reset: retried', async () => {
      const port = await freePort();
      const s = await relay(port, 2);
      const c = new KubeClient(credentialsVia(port));
      assert.equal((await c.get<any>(ref())).metadata.name, 'web');
      c.close();
      s.close();
    });
    test('an API server that stays away: a bounded wait, then a clear error', async () => {
      const port = await freePort();
      const c = new KubeClient(credentialsVia(port), { retryBudgetMs: 1_000 });
      const started = Date.now();
      await assert.rejects(c.get(ref()), (e: Error) =>
        new RegExp(`^cannot get deployments\\.apps "web" in namespace "${ns}": the API server https://127\\.0\\.0\\.1:${port} did not answer \\(ECONNREFUSED\\) \\(after \\d attempts in [\\d.]+s\\)$`).test(e.message));
      // The 1 s budget given, not the default 20 s.
      assert.ok(Date.now() - started < 5_000);
      c.close();
    });
    test('a request that gets no answer hits its deadline', async () => {
      const port = await freePort();
      const silent = net.createServer(() => { /* accept and say nothing */ });
      await new Promise<void>((resolve) => silent.listen(port, '127.0.0.1', resolve));
      const c = new KubeClient(credentialsVia(port), { requestTimeoutMs: 300, retryBudgetMs: 0 });
      await assert.rejects(c.get(ref()), /did not answer \(ETIMEDOUT\)$/);
      c.close();
      silent.close();
    });
  });
});
