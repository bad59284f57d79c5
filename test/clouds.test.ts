/*
 * The clouds' own registries (AWS ECR, Google Artifact Registry, Tencent Cloud TCR Enterprise), Event Grid's short
 * type names and CloudEvents
 * batches, GitHub's earlier package shape, and REPO_TYPE=auto telling every fixture apart. The readers are pure and
 * tested on the fixtures (fixtures/upgrade, sources in its README); then each format goes through the built
 * executable on the real test cluster, as test/registry-e2e.test.ts sends the other registries' documented payloads:
 * the image applied, no-ops answered 200 with their reason, malformed variants refused with the field named and the
 * workload unchanged. VERIFY_IMAGE against ECR without a pull secret is refused with what ECR's login needs.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { cloudLoginNeeds, composeImageRef, readPushReading, recognisedRepoType, REPO_TYPES } from '../webhook.ts';
import { makeTempDir, startWebhook, type Webhook } from './harness.ts';
import {
  clusterOrSkip, containerImage, deployment, freshNamespaceName, kubectlFor, namespacedGetter, pushedState,
  removeNamespace,
} from './cluster/kube.ts';

const FIXTURES = path.join(import.meta.dirname, 'fixtures', 'upgrade');
const text = (name: string) => fs.readFileSync(path.join(FIXTURES, name), 'utf8');
const fixture = (name: string) => JSON.parse(text(name));
const base64 = (value: unknown) => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64');
/** A Pub/Sub push envelope around an Artifact Registry notification (or any data text). */
const pubSub = (data: unknown) => ({ ...fixture('gar-pubsub-insert.json'), message: { ...fixture('gar-pubsub-insert.json').message, data: base64(data) } });
const ECR_REF = '123456789012.dkr.ecr.us-west-2.amazonaws.com/my-repository-name';
const GAR_REF = 'us-east1-docker.pkg.dev/my-project/my-repo/hello-world';
const compose = (payload: unknown, type: string) => composeImageRef(payload, readPushReading({ REPO_TYPE: type }));

// Which REPO_TYPE each fixture is the sender's own payload of, by its file name.
const OWN_TYPE: [RegExp, string][] = [
  [/^acr-/, 'regionalregistry'], [/^dockerhub-/, 'publicregistry'], [/^custom-/, 'custom'], [/^harbor-/, 'harbor'],
  [/^quay-/, 'quay'], [/^ghcr-/, 'ghcr'], [/^azure-/, 'azure'], [/^distribution-/, 'distribution'], [/^jfrog-/, 'jfrog'],
  [/^nexus-/, 'nexus'], [/^gitea-/, 'gitea'], [/^ecr-/, 'ecr'], [/^gar-/, 'gar'], [/^tcr-/, 'tcr'],
];

describe('REPO_TYPE=auto on every fixture', () => {
  test('each fixture is recognised as its own sender\'s type, with no headers to help', () => {
    const files = fs.readdirSync(FIXTURES).filter((f) => f.endsWith('.json') && f !== 'expected.json');
    const wrong: string[] = [];
    for (const file of files) {
      const own = OWN_TYPE.find(([prefix]) => prefix.test(file))?.[1];
      assert.ok(own, `${file}: no sender type for this file name in OWN_TYPE`);
      let got: string;
      try { got = recognisedRepoType(fixture(file), {}); } catch (e) { got = `error: ${(e as Error).message.slice(0, 60)}`; }
      if (got !== own) wrong.push(`${file}: ${got}, not ${own}`);
    }
    assert.deepEqual(wrong, []);
    for (const type of ['ecr', 'gar', 'tcr']) assert.ok(REPO_TYPES.includes(type), type);
  });
  test('an ECR CloudEvent is ECR\'s, a CloudEvents batch of other types is not taken for Event Grid', () => {
    const ecr = fixture('ecr-cloudevents-push.json');
    assert.equal(recognisedRepoType([ecr, ecr], {}), 'ecr');
    const harbor = fixture('harbor-cloudevents-push.json');
    assert.equal(recognisedRepoType([harbor], {}), 'cloudevents');
    assert.equal(recognisedRepoType(fixture('azure-eventgrid-image-pushed.json'), {}), 'azure');
  });
});

describe('ECR, Artifact Registry, Event Grid and GHCR readers', () => {
  const ecr = (detail: Record<string, unknown>) => ({ ...fixture('ecr-image-push.json'), detail: { ...fixture('ecr-image-push.json').detail, ...detail } });
  const gar = (data: Record<string, unknown>) => pubSub({ action: 'INSERT', digest: `${GAR_REF}@sha256:${'c'.repeat(64)}`, tag: `${GAR_REF}:1.2`, ...data });
  test('ECR: a delete, a failed push and a push by digest are no-ops with their reason', () => {
    assert.deepEqual(compose(ecr({ 'action-type': 'DELETE' }), 'ecr'), { kind: 'noop', reason: 'ECR image action "DELETE" is not a push' });
    assert.deepEqual(compose(ecr({ result: 'FAILURE' }), 'ecr'), { kind: 'noop', reason: 'ECR image push "FAILURE": nothing was pushed' });
    assert.deepEqual(compose(ecr({ 'image-tag': undefined }), 'ecr'), { kind: 'noop', reason: 'pushed by digest, without a tag (detail.image-tag is empty): nothing to deploy' });
    assert.deepEqual(compose({ ...fixture('ecr-image-push.json'), 'detail-type': 'ECR Image Scan' }, 'ecr'), { kind: 'noop', reason: 'ECR event "ECR Image Scan" is not an image action' });
  });
  test('ECR: malformed events name the field', () => {
    const { detail: _, ...noDetail } = fixture('ecr-image-push.json');
    assert.deepEqual(compose(noDetail, 'ecr'), { kind: 'error', message: 'detail is missing (the image action: action-type, result, repository-name, image-tag)' });
    assert.deepEqual(compose(ecr({ 'action-type': 'PUSHED' }), 'ecr'), { kind: 'error', message: 'detail.action-type "PUSHED" is not one ECR sends (PUSH, DELETE)' });
    assert.deepEqual(compose({ ...fixture('ecr-image-push.json'), account: 'acme' }, 'ecr'), { kind: 'error', message: 'account "acme" is not an AWS account id (12 digits)' });
    const ce = fixture('ecr-cloudevents-push.json');
    assert.match((compose({ ...ce, source: 'urn:aws:s3:::bucket' }, 'ecr') as { message: string }).message, /^source "urn:aws:s3:::bucket" is not an ECR repository URN/);
  });
  test('ECR in a China region is served under amazonaws.com.cn', () => {
    const r = compose({ ...fixture('ecr-image-push.json'), region: 'cn-north-1' }, 'ecr');
    assert.equal(r.kind === 'ref' && r.ref, '123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/my-repository-name:latest');
  });
  test('Artifact Registry: a delete and an untagged insert are no-ops; bad base64, bad JSON and a wrong action are named', () => {
    assert.deepEqual(compose(gar({ action: 'DELETE' }), 'gar'), { kind: 'noop', reason: 'Artifact Registry action "DELETE" is not an image push' });
    assert.deepEqual(compose(gar({ tag: undefined }), 'gar'), { kind: 'noop', reason: 'an image inserted by digest, without a tag (message.data.tag is absent): nothing to deploy' });
    const bad = { ...fixture('gar-pubsub-insert.json'), message: { data: 'not base64!' } };
    assert.deepEqual(compose(bad, 'gar'), { kind: 'error', message: 'message.data is not base64 (Pub/Sub sends the notification base64-encoded)' });
    assert.match((compose(pubSub('{"action":'), 'gar') as { message: string }).message, /^message\.data is not the base64 of JSON: /);
    assert.deepEqual(compose(gar({ action: 'UPSERT' }), 'gar'), { kind: 'error', message: 'message.data.action "UPSERT" is not one Artifact Registry sends (INSERT, DELETE)' });
    assert.deepEqual(compose(gar({ tag: 'docker.io/library/nginx:1' }), 'gar'), { kind: 'error', message: 'message.data.tag "docker.io/library/nginx:1" does not name an Artifact Registry host (<location>-docker.pkg.dev, gcr.io)' });
  });
  test('Event Grid: the short type name and a CloudEvents batch; the newest push of a repository wins in a batch', () => {
    const batch = fixture('azure-cloudevents-batch-short-type.json');
    for (const order of [batch, [...batch].reverse()]) {
      const r = compose(order, 'cloudevents');
      assert.equal(r.kind === 'ref' && r.ref, 'demo.azurecr.io/aci-helloworld:v2', JSON.stringify(r));
    }
    const deleted = batch.map((e: { type: string }) => ({ ...e, type: 'ImageDeleted' }));
    assert.match((compose(deleted, 'cloudevents') as { reason: string }).reason, /^no image push in the CloudEvents batch \(\d+ events ignored: \d+ CloudEvents type "ImageDeleted" is not a push\)$/);
  });
  test('TCR: another trigger action is a no-op; a delivery without event_data, a type that is not a string and a hostless resource_url are named', () => {
    const tcr = fixture('tcr-push-image.json');
    assert.deepEqual(compose({ ...tcr, type: 'deleteImage' }, 'tcr'), { kind: 'noop', reason: 'TCR trigger action "deleteImage" is not an image push (pushImage)' });
    const { event_data: _, ...noData } = tcr;
    assert.deepEqual(compose(noData, 'tcr'), { kind: 'error', message: 'event_data is missing (the pushed resources and their repository)' });
    assert.deepEqual(compose({ ...tcr, type: 7 }, 'tcr'), { kind: 'error', message: 'type must be a string, got a number' });
    const hostless = { ...tcr, event_data: { ...tcr.event_data, resources: [{ ...tcr.event_data.resources[0], resource_url: 'nginx/nginx:v1' }] } };
    assert.deepEqual(compose(hostless, 'tcr'), { kind: 'error', message: 'event_data.resources.0.resource_url "nginx/nginx:v1" names no registry host: set REGISTRY_HOST in the hook to the host[:port] TCR serves images on' });
  });
  test('TCR on a custom domain: auto reads it as Harbor\'s format, to the same image', () => {
    const tcr = fixture('tcr-push-image.json');
    const custom = { ...tcr, event_data: { ...tcr.event_data, resources: [{ ...tcr.event_data.resources[0], resource_url: 'tcr.example.com/nginx/nginx:v1' }] } };
    assert.equal(recognisedRepoType(custom, {}), 'harbor');
    for (const type of ['auto', 'tcr']) assert.deepEqual(compose(custom, type), compose(custom, 'harbor'), type);
    assert.equal(recognisedRepoType(fixture('harbor-push-image-legacy.json'), {}), 'harbor');
    assert.throws(() => recognisedRepoType({ type: 'pushImage', event_data: 'wcctest.tencentcloudcr.com' }, {}), /^Error: REPO_TYPE auto: the payload is not one this receiver recognises/);
  });
  test('VERIFY_IMAGE: what a cloud registry\'s login needs', () => {
    assert.match(cloudLoginNeeds('123456789012.dkr.ecr.us-west-2.amazonaws.com')!.needs, /GetAuthorizationToken/);
    assert.equal(cloudLoginNeeds('123456789012.dkr.ecr.us-west-2.amazonaws.com')!.anonymous, false);
    assert.match(cloudLoginNeeds('europe-west1-docker.pkg.dev')!.needs, /_json_key/);
    assert.equal(cloudLoginNeeds('registry.example.com'), undefined);
  });
});

const cluster = await clusterOrSkip();

describe('the clouds\' payloads through the executable', { skip: cluster ? false : 'no cluster' }, () => {
  const ns = freshNamespaceName('clouds');
  const kubectl = kubectlFor(cluster!);
  const getJson = namespacedGetter(kubectl, ns);
  const API_KEY = 'eventbridge-api-key-6b21c9';
  const TOKEN = 'pubsub-url-token-3e8a50';
  const TCR_SECRET = 'tcr-trigger-header-91f4d2';
  let wh: Webhook;

  const hook = (id: string, type: string, rule: object, env: Record<string, string> = {}) => ({
    id,
    'execute-command': path.join(import.meta.dirname, '..', 'webhooks.sh'),
    'include-command-output-in-response': true,
    'include-command-output-in-response-on-error': true,
    'trigger-rule-mismatch-http-response-code': 401,
    'pass-arguments-to-command': [{ source: 'entire-payload' }, { source: 'entire-headers' }],
    'pass-environment-to-command': [
      ...['ns', 'workload', 'container'].map((name) => ({ envname: `APP_${name.toUpperCase()}`, source: 'url', name })),
      { envname: 'REPO_TYPE', source: 'string', name: type },
      ...Object.entries(env).map(([envname, name]) => ({ envname, source: 'string', name })),
    ],
    'trigger-rule': rule,
  });
  const value = (source: string, name: string, secret: string) => ({ match: { type: 'value', value: `{{ getenv "${secret}" }}`, parameter: { source, name } } });

  before(async () => {
    const dir = makeTempDir('clouds-hooks-');
    fs.writeFileSync(path.join(dir, 'hooks.json'), JSON.stringify([
      // EventBridge's API destination sends the connection's API-key header; the rule checks it.
      hook('ecr', 'ecr', value('header', 'X-Api-Key', 'ECR_API_KEY')),
      hook('ecr-verified', 'ecr', value('header', 'X-Api-Key', 'ECR_API_KEY'), { VERIFY_IMAGE: 'true' }),
      // A Pub/Sub push subscription can carry a secret only in its URL.
      hook('gar', 'gar', value('url', 'token', 'GAR_TOKEN')),
      hook('cloudevents', 'cloudevents', value('url', 'token', 'GAR_TOKEN')),
      hook('ghcr', 'ghcr', value('url', 'token', 'GAR_TOKEN')),
      // A TCR trigger sends the custom header configured with it.
      hook('tcr', 'tcr', value('header', 'X-Webhook-Token', 'TCR_SECRET')),
    ]));
    wh = await startWebhook({ hooks: path.join(dir, 'hooks.json'), env: { WEBHOOK_CMD: '-template', KUBECONFIG: cluster!.kubeconfigPath, ECR_API_KEY: API_KEY, GAR_TOKEN: TOKEN, TCR_SECRET } });
    await kubectl(['create', 'namespace', ns]);
    await kubectl(['-n', ns, 'apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      deployment('ecr', [{ name: 'app', image: `${ECR_REF}:old` }], { replicas: 1 }),
      deployment('ecr-verified', [{ name: 'app', image: `${ECR_REF}:old` }], { replicas: 1 }),
      deployment('gar', [{ name: 'app', image: `${GAR_REF}:1.0` }], { replicas: 1 }),
      deployment('acr', [{ name: 'app', image: 'demo.azurecr.io/aci-helloworld:v0' }], { replicas: 1 }),
      deployment('ghcr', [{ name: 'app', image: 'ghcr.io/utaitebox/utaitebox-server:3.2.0' }], { replicas: 1 }),
      deployment('tcr', [{ name: 'app', image: 'wcctest.tencentcloudcr.com/nginx/nginx:v0' }], { replicas: 1 }),
    ] }));
  });
  after(async () => {
    await wh?.stop();
    await removeNamespace(kubectl, ns);
  });

  const imageOf = async (name: string) => containerImage(await getJson(`deployment/${name}`), 'app');
  const post = (hookId: string, workload: string, body: unknown, headers: Record<string, string> = {}) =>
    wh.request(`/hooks/${hookId}?${new URLSearchParams({ ns, workload: `deployment/${workload}`, container: 'app', token: TOKEN })}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body),
    });
  /**
   * Posts a refused variant: the answer (400 for a malformed push, the sender's to fix; 500 otherwise)
   * names `message`, and the workload is as it was.
   */
  const refused = async (hookId: string, workload: string, body: unknown, message: RegExp, headers: Record<string, string> = {}, status = 400) => {
    const before = pushedState(await getJson(`deployment/${workload}`));
    const res = await post(hookId, workload, body, headers);
    assert.equal(res.status, status, res.body);
    assert.match(res.body, message);
    assert.match(res.body, /^action: +none \(nothing was changed\)$/m);
    assert.equal(pushedState(await getJson(`deployment/${workload}`)), before);
  };
  const noop = async (hookId: string, workload: string, body: unknown, reason: string, headers: Record<string, string> = {}) => {
    const before = pushedState(await getJson(`deployment/${workload}`));
    const res = await post(hookId, workload, body, headers);
    assert.equal(res.status, 200, res.body);
    assert.ok(res.body.includes(`action:       none (${reason})`), res.body);
    assert.equal(pushedState(await getJson(`deployment/${workload}`)), before);
  };

  test('ECR through EventBridge: the API key is checked, malformed events are refused, a delete is a no-op, the push lands', async () => {
    const key = { 'X-Api-Key': API_KEY };
    const wrongKey = await post('ecr', 'ecr', text('ecr-image-push.json'), { 'X-Api-Key': 'not-the-key' });
    assert.equal(wrongKey.status, 401, wrongKey.body);
    const event = fixture('ecr-image-push.json');
    const { detail: _, ...noDetail } = event;
    await refused('ecr', 'ecr', noDetail, /detail is missing \(the image action/, key);
    await refused('ecr', 'ecr', { ...event, detail: { ...event.detail, 'action-type': 'PUSHED' } }, /detail\.action-type "PUSHED" is not one ECR sends/, key);
    await noop('ecr', 'ecr', { ...event, detail: { ...event.detail, 'action-type': 'DELETE' } }, 'ECR image action "DELETE" is not a push', key);
    const res = await post('ecr', 'ecr', text('ecr-image-push.json'), key);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('ecr'), `${ECR_REF}:latest`);
  });

  test('ECR\'s CloudEvents form lands through the cloudevents hook', async () => {
    const ce = { ...fixture('ecr-cloudevents-push.json'), source: 'urn:aws:ecr:us-west-2:123456789012:repository/my-repository-name', data: { ...fixture('ecr-cloudevents-push.json').data, repositoryName: 'my-repository-name', imageTag: 'v1.1' } };
    const res = await post('cloudevents', 'ecr', ce, { 'Content-Type': 'application/cloudevents+json' });
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('ecr'), `${ECR_REF}:v1.1`);
  });

  test('Artifact Registry through a Pub/Sub push: bad base64 and a wrong action are refused, a delete is a no-op, the insert lands', async () => {
    await refused('gar', 'gar', { ...fixture('gar-pubsub-insert.json'), message: { data: '%%%' } }, /message\.data is not base64/);
    await refused('gar', 'gar', pubSub({ action: 'UPSERT', tag: `${GAR_REF}:1.1` }), /message\.data\.action "UPSERT" is not one Artifact Registry sends/);
    await noop('gar', 'gar', pubSub({ action: 'DELETE', digest: `${GAR_REF}@sha256:${'d'.repeat(64)}` }), 'Artifact Registry action "DELETE" is not an image push');
    const res = await post('gar', 'gar', text('gar-pubsub-insert.json'));
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('gar'), `${GAR_REF}:1.1`);
  });

  test('a CloudEvents batch with Event Grid\'s short type: the newest push of the batch lands', async () => {
    const res = await post('cloudevents', 'acr', text('azure-cloudevents-batch-short-type.json'), { 'Content-Type': 'application/cloudevents-batch+json' });
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('acr'), 'demo.azurecr.io/aci-helloworld:v2');
  });

  test('GitHub\'s earlier create shape (package_v2) lands', async () => {
    const res = await post('ghcr', 'ghcr', text('ghcr-package-create-legacy.json'), { 'X-GitHub-Event': 'package_v2' });
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('ghcr'), 'ghcr.io/utaitebox/utaitebox-server:3.2.1');
  });

  test('TCR Enterprise\'s trigger: the custom header is checked, malformed deliveries are refused, a delete is a no-op, the push lands', async () => {
    const header = { 'X-Webhook-Token': TCR_SECRET };
    const wrong = await post('tcr', 'tcr', text('tcr-push-image.json'), { 'X-Webhook-Token': 'not-the-secret' });
    assert.equal(wrong.status, 401, wrong.body);
    const delivery = fixture('tcr-push-image.json');
    const { event_data: _, ...noData } = delivery;
    await refused('tcr', 'tcr', noData, /event_data is missing \(the pushed resources/, header);
    const hostless = { ...delivery, event_data: { ...delivery.event_data, resources: [{ ...delivery.event_data.resources[0], resource_url: 'nginx/nginx:v1' }] } };
    await refused('tcr', 'tcr', hostless, /event_data\.resources\.0\.resource_url "nginx\/nginx:v1" names no registry host/, header);
    await refused('tcr', 'tcr', { ...delivery, type: ['pushImage'] }, /type must be a string, got an array/, header);
    await noop('tcr', 'tcr', { ...delivery, type: 'deleteImage' }, 'TCR trigger action "deleteImage" is not an image push (pushImage)', header);
    const res = await post('tcr', 'tcr', text('tcr-push-image.json'), header);
    assert.equal(res.status, 200, res.body);
    assert.equal(await imageOf('tcr'), 'wcctest.tencentcloudcr.com/nginx/nginx:v1');
  });

  test('VERIFY_IMAGE against ECR without a pull secret: refused with what ECR\'s login needs, nothing changed', async () => {
    await refused('ecr-verified', 'ecr-verified', text('ecr-image-push.json'),
      /VERIFY_IMAGE: could not resolve 123456789012\.dkr\.ecr\.us-west-2\.amazonaws\.com\/my-repository-name:latest: the workload names no pull secret for 123456789012\.dkr\.ecr\.us-west-2\.amazonaws\.com \(an Amazon ECR login is a token from its GetAuthorizationToken call/,
      { 'X-Api-Key': API_KEY }, 500);
  });

  test('neither the API key, the URL token nor the TCR header appears in the output', () => {
    assert.ok(!wh.output().includes(API_KEY), wh.output());
    assert.ok(!wh.output().includes(TOKEN), wh.output());
    assert.ok(!wh.output().includes(TCR_SECRET), wh.output());
  });
});
