/*
 * Unit tests of the registry readers beyond the fixtures (fixtures/upgrade/expected.json, run by
 * test/upgrade.test.ts): quirks, refusals and the choice among several announced images. Pure.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import { chooseCandidate, composeImageRef, parsePushHeaders, readImagePin, readPushReading, REPO_TYPES } from '../webhook.ts';

const FIXTURES = path.join(import.meta.dirname, 'fixtures', 'upgrade');
const fixture = (name: string) => JSON.parse(fs.readFileSync(path.join(FIXTURES, name), 'utf8'));
const compose = (payload: unknown, env: Record<string, string>, headers: Record<string, string> = {}) =>
  composeImageRef(payload, readPushReading(env), headers);
const errorOf = (payload: unknown, env: Record<string, string>, headers?: Record<string, string>) => {
  const r = compose(payload, env, headers);
  assert.equal(r.kind, 'error', JSON.stringify(r));
  return r.kind === 'error' ? r.message : '';
};
const noopOf = (payload: unknown, env: Record<string, string>, headers?: Record<string, string>) => {
  const r = compose(payload, env, headers);
  assert.equal(r.kind, 'noop', JSON.stringify(r));
  return r.kind === 'noop' ? r.reason : '';
};

describe('REPO_TYPE=auto', () => {
  test('an unrecognised payload is refused with what was looked for, per registry', () => {
    const message = errorOf({ hello: 'world' }, { REPO_TYPE: 'auto' });
    assert.match(message, /^REPO_TYPE auto: the payload is not one this receiver recognises; looked for /);
    for (const type of REPO_TYPES.filter((t) => t !== 'auto')) assert.ok(message.includes(`${type}: `), `${type} missing in ${message}`);
    assert.match(message, /harbor: event_data\.resources/);
    assert.match(message, /ghcr: the X-GitHub-Event header/);
  });
  test('Gitea, which also sends X-GitHub-Event, is told apart by its own header', () => {
    const payload = fixture('gitea-package-created.json');
    const r = compose(payload, { REPO_TYPE: 'auto' }, { 'x-github-event': 'package', 'x-gitea-event': 'package' });
    assert.equal(r.kind === 'ref' && r.ref, 'localhost:3000/user1/giteacontainer:latest', JSON.stringify(r));
  });
  test('an Event Grid batch as the hook passes it ({"root": [...]}) is recognised as Azure', () => {
    const r = compose({ root: fixture('azure-eventgrid-image-pushed.json') }, { REPO_TYPE: 'auto' });
    assert.equal(r.kind === 'ref' && r.ref, 'demo.azurecr.io/aci-helloworld:v1');
  });
});

describe('registry quirks', () => {
  test('a cosign signature, attestation or SBOM tag is acknowledged, not deployed', () => {
    const payload = fixture('distribution-push-manifest.json');
    payload.events[0].target.tag = `sha256-${'a'.repeat(64)}.sig`;
    assert.match(noopOf(payload, { REPO_TYPE: 'distribution' }), /is a signature, attestation or SBOM, not an image$/);
  });
  test('a signature\'s push, or a referrers index\'s, names the digest it is of; an attestation\'s does not', () => {
    const payload = fixture('distribution-push-manifest.json');
    const signatureOf = (tag: string) => {
      payload.events[0].target.tag = tag;
      const r = compose(payload, { REPO_TYPE: 'distribution' });
      assert.equal(r.kind, 'noop', JSON.stringify(r));
      return r.kind === 'noop' ? r.signatureOf : 'not a no-op';
    };
    assert.equal(signatureOf(`sha256-${'a'.repeat(64)}.sig`), `sha256:${'a'.repeat(64)}`);
    assert.equal(signatureOf(`sha256-${'b'.repeat(64)}`), `sha256:${'b'.repeat(64)}`);
    assert.equal(signatureOf(`sha256-${'c'.repeat(64)}.att`), undefined);
    assert.match(noopOf(payload, { REPO_TYPE: 'distribution' }), /is a signature, attestation or SBOM, not an image$/);
    payload.events[0].target.tag = `sha256-${'b'.repeat(64)}`;
    assert.match(noopOf(payload, { REPO_TYPE: 'distribution' }), /is a referrers index \(signatures and attestations of a digest\), not an image$/);
  });
  test('Harbor events other than a push are no-ops; a push without resources is an error', () => {
    const pull = { ...fixture('harbor-push-artifact.json'), type: 'PULL_ARTIFACT' };
    assert.equal(noopOf(pull, { REPO_TYPE: 'harbor' }), 'Harbor event "PULL_ARTIFACT" is not a push (PUSH_ARTIFACT, or pushImage before Harbor 2.0)');
    const empty = fixture('harbor-push-artifact.json');
    empty.event_data.resources = [];
    assert.equal(errorOf(empty, { REPO_TYPE: 'harbor' }), 'event_data.resources is missing or empty (the pushed artifacts)');
  });
  test('Harbor: an upper-case project is refused, not lower-cased', () => {
    const p = fixture('harbor-push-artifact.json');
    p.event_data.repository.repo_full_name = 'Test-Webhook/debian';
    assert.match(errorOf(p, { REPO_TYPE: 'harbor' }), /^event_data\.repository\.repo_full_name "Test-Webhook\/debian" is not a valid repository name: OCI repository names are lower-case/);
  });
  test('Event Grid: a validation code that is not a code is not echoed back', () => {
    const p = fixture('azure-eventgrid-validation.json');
    p[0].data.validationCode = '<script>';
    assert.equal(errorOf(p, { REPO_TYPE: 'azure' }), '0.data.validationCode "<script>" is not a code');
  });
  test('Event Grid: events other than ImagePushed are no-ops', () => {
    const p = fixture('azure-eventgrid-image-pushed.json');
    p[0].type = 'Microsoft.ContainerRegistry.ImageDeleted';
    assert.equal(noopOf(p, { REPO_TYPE: 'azure' }), 'no image push among the events (Microsoft.ContainerRegistry.ImageDeleted)');
  });
  test('ACR: a delete and a push by digest are no-ops', () => {
    const del = { ...fixture('azure-acr-push.json'), action: 'delete' };
    assert.equal(noopOf(del, { REPO_TYPE: 'azure' }), 'Azure Container Registry action "delete" is not an image push');
    const byDigest = fixture('azure-acr-push.json');
    delete byDigest.target.tag;
    assert.equal(noopOf(byDigest, { REPO_TYPE: 'azure' }), 'pushed by digest, without a tag (target.tag is empty)');
  });
  test('Nexus: other formats and actions are no-ops', () => {
    const p = fixture('nexus-component-created.json');
    assert.equal(noopOf({ ...p, component: { ...p.component, format: 'maven2' } }, { REPO_TYPE: 'nexus', REGISTRY_HOST: 'n.example.com' }), 'Nexus component format "maven2" is not docker');
    assert.equal(noopOf({ ...p, action: 'DELETED' }, { REPO_TYPE: 'nexus', REGISTRY_HOST: 'n.example.com' }), 'Nexus component action "DELETED" is not a push');
  });
  test('CloudEvents: an unknown type is an error naming the known ones; another Harbor type is a no-op', () => {
    const ce = fixture('harbor-cloudevents-push.json');
    assert.equal(
      errorOf({ ...ce, type: 'com.example.thing' }, { REPO_TYPE: 'cloudevents' }),
      'CloudEvents type "com.example.thing" is not one this receiver reads (harbor.artifact.pushed, Microsoft.ContainerRegistry.ImagePushed, ImagePushed, com.amazon.ecr.image.push)',
    );
    assert.equal(noopOf({ ...ce, type: 'harbor.artifact.pulled' }, { REPO_TYPE: 'cloudevents' }), 'CloudEvents type "harbor.artifact.pulled" is not a push');
    assert.equal(errorOf({ ...ce, specversion: '0.3' }, { REPO_TYPE: 'cloudevents' }), 'CloudEvents specversion "0.3" is not supported (1.0)');
  });
  test('Distribution: an envelope without events is an error', () => {
    assert.equal(errorOf({ events: [] }, { REPO_TYPE: 'distribution' }), 'events is missing or empty (the registry sends an envelope of events)');
  });
});

describe('several images in one delivery', () => {
  const pin = readImagePin();
  const candidates = ['quay.io/shop/web:latest', 'quay.io/shop/web:v1.0', 'quay.io/shop/api:v1.0'];
  test('the container\'s own repository and tag first, then its repository, then what the pin allows', () => {
    assert.equal(chooseCandidate('app', 'quay.io/shop/web:latest', candidates, pin), 'quay.io/shop/web:latest');
    assert.equal(chooseCandidate('app', 'quay.io/shop/web:v0.9', candidates, pin), 'quay.io/shop/web:v1.0');
    assert.equal(chooseCandidate('app', 'quay.io/shop/api:v0.9', candidates, pin), 'quay.io/shop/api:v1.0');
    // Nothing fits: the last, which the pin then refuses with its own message.
    assert.equal(chooseCandidate('app', 'quay.io/other/x:1', candidates, pin), 'quay.io/shop/api:v1.0');
    const widened = readImagePin(undefined, 'quay.io/shop/web');
    assert.equal(chooseCandidate('app', 'quay.io/other/x:1', candidates, widened), 'quay.io/shop/web:latest');
  });
});

describe('the headers argument', () => {
  test('names are lower-cased; absent or empty is no headers; anything but a JSON object is an error', () => {
    assert.deepEqual(parsePushHeaders('{"X-Github-Event":"package","Content-Length":"12"}'), { 'x-github-event': 'package', 'content-length': '12' });
    assert.deepEqual(parsePushHeaders(undefined), {});
    assert.deepEqual(parsePushHeaders(''), {});
    assert.throws(() => parsePushHeaders('[1]'), /^Error: argument 2 is not the headers' JSON object \(got an array\)$/);
    assert.throws(() => parsePushHeaders('{'), /^Error: argument 2 is not JSON/);
  });
});

describe('batches are read up to their first 5,000 events', () => {
  test('a Quay push of 20,000 tags and a Harbor event of 20,000 resources: 5,000 candidates each', () => {
    const tags = Array.from({ length: 20_000 }, (_, i) => `t${i}`);
    const quay = compose({ repository: 'org/app', docker_url: 'quay.io/org/app', updated_tags: tags }, { REPO_TYPE: 'quay' });
    assert.equal(quay.kind === 'ref' && quay.candidates?.length, 5000, JSON.stringify(quay).slice(0, 300));
    const harbor = fixture('harbor-push-artifact.json');
    const resource = harbor.event_data.resources[0];
    const many = { ...harbor, event_data: { ...harbor.event_data, resources: tags.map((tag) => ({ ...resource, tag, resource_url: resource.resource_url.replace(/:[^:]+$/, `:${tag}`) })) } };
    const read = compose(many, { REPO_TYPE: 'harbor' });
    assert.equal(read.kind === 'ref' && read.candidates?.length, 5000, JSON.stringify(read).slice(0, 300));
  });
  test('a Distribution envelope of pulls: counted by reason in one line', () => {
    const pulls = Array.from({ length: 3 }, () => ({ action: 'pull', target: { mediaType: 'application/vnd.oci.image.manifest.v1+json', tag: 'v1' } }));
    assert.equal(noopOf({ events: [...pulls, { action: 'push', target: { mediaType: 'application/octet-stream' } }] }, { REPO_TYPE: 'distribution' }),
      'no push of a tagged manifest in the envelope (4 events ignored: 3 pull of a manifest, 1 push of a blob)');
  });
});
