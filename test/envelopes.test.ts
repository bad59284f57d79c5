/*
 * A batch of events (a CNCF Distribution envelope, an Event Grid or CloudEvents batch) through the built executable
 * over real HTTP: a 1 MiB body of events that are no push is answered, logged and kept on the deliveries page in a
 * few hundred bytes that still say what happened (how many events, why each kind was ignored), not amplified into
 * megabytes; a batch is read up to its first 5,000 events, the rest counted. No cluster is needed: nothing in these
 * batches is a push, so the upgrade answers before it reads a workload.
 */
import assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, describe, test } from 'node:test';
import { adminPort, httpRequest, waitFor, webhookPool } from './harness.ts';

const { start, stopAll } = webhookPool();
const ONE_MIB = 1024 * 1024;
// What an answer, its log lines and its delivery may take for a summary of a batch: a few KiB, where a reason
// listing every event took 8.8 MB.
const SMALL = 4 * 1024;

const hook = {
  id: 'upgrade',
  'execute-command': path.join(import.meta.dirname, '..', 'webhooks.sh'),
  'include-command-output-in-response': true,
  'include-command-output-in-response-on-error': true,
  'pass-arguments-to-command': [{ source: 'entire-payload' }, { source: 'entire-headers' }],
  'pass-environment-to-command': [
    { envname: 'APP_NS', source: 'url', name: 'ns' },
    { envname: 'APP_WORKLOAD', source: 'url', name: 'workload' },
    { envname: 'APP_CONTAINER', source: 'url', name: 'container' },
    { envname: 'REPO_TYPE', source: 'url', name: 'repo_type' },
  ],
};

/** As many copies of `event` as fill a 1 MiB body (less room for an envelope), as a JSON array's text. */
const filled = (event: object) => JSON.stringify(Array(Math.floor((ONE_MIB - 64) / (JSON.stringify(event).length + 1))).fill(event));
const countOf = (batch: string) => JSON.parse(batch).length as number;

/**
 * POSTs `body` as `repoType`; asserts the answer, the request's log lines and its delivery (page and JSON) are each
 * under SMALL and say the same reason, `reason` when given; returns the reason and the delivery's page.
 */
async function summarised(repoType: string, body: string, reason?: string, contentType = 'application/json') {
  const w = await start({ hooks: [hook], metrics: true });
  const admin = await adminPort(w);
  const query = new URLSearchParams({ ns: 'prod', workload: 'deployment/web', container: 'app', repo_type: repoType });
  const logBefore = w.output().length;
  const res = await w.request(`/hooks/upgrade?${query}`, { method: 'POST', headers: { 'Content-Type': contentType }, body });
  assert.ok(Buffer.byteLength(body) > ONE_MIB - 1024, 'a body of about 1 MiB');
  assert.equal(res.status, 200, res.body.slice(0, 2000));
  assert.ok(res.body.length < SMALL, `the answer is ${res.body.length} characters`);
  const said = /^action: {7}none \((.*)\)$/m.exec(res.body)?.[1];
  assert.ok(said !== undefined, res.body);
  if (reason !== undefined) assert.equal(said, reason);
  const doc = await waitFor(async () => {
    const d = JSON.parse((await httpRequest(admin, '/deliveries.json')).body);
    return d.deliveries[0]?.state === 'done' ? d : undefined;
  });
  const log = w.output().slice(logBefore);
  assert.ok(log.length < SMALL, `the log grew by ${log.length} characters`);
  assert.ok(log.includes(said), log);
  const json = JSON.stringify(doc);
  assert.ok(json.length < SMALL, `deliveries.json is ${json.length} characters`);
  assert.equal(doc.deliveries[0].detail, said);
  const page = await httpRequest(admin, `/deliveries/${doc.deliveries[0].seq}`);
  assert.equal(page.status, 200);
  assert.ok(page.body.length < 2 * SMALL, `the delivery's page is ${page.body.length} characters`);
  return { reason: said, page: page.body };
}

describe('a batch of events through the executable: summarised with counts, never echoed', () => {
  after(stopAll);

  test('a Distribution envelope of 340,000 empty events (1 MiB): one line that counts them', async () => {
    const events = filled({});
    const n = countOf(events);
    assert.ok(n > 340_000);
    const { page } = await summarised(
      'distribution',
      `{"events":${events}}`,
      `no push of a tagged manifest in the envelope (${n} events ignored: 5000 unknown action of a blob, ` +
        `${n - 5000} past the first 5000 not read)`,
    );
    assert.ok(page.includes(`${n} events ignored`), page);
  });

  test('distinct reasons past a KiB are counted as `… and N more`', async () => {
    const events = Array.from({ length: 15_000 }, (_, i) => ({ action: `a${i}`.padEnd(40, 'x') }));
    const body = JSON.stringify({ events, pad: ' '.repeat(ONE_MIB - JSON.stringify(events).length - 200) });
    const { reason } = await summarised('distribution', body);
    assert.match(reason, /^no push of a tagged manifest in the envelope \(15000 events ignored: 1 a0x+ of a blob, 1 a1x+ of a blob, .* of a blob … and \d+ more\)$/);
    assert.ok(reason.length < 1200, reason);
  });

  test('an Event Grid batch of events that are no push: counted by type', async () => {
    const events = filled({ eventType: 'Microsoft.ContainerRegistry.ImageDeleted' });
    const n = countOf(events);
    await summarised(
      'azure',
      events,
      `no image push among the events (${n} events ignored: 5000 Microsoft.ContainerRegistry.ImageDeleted, ` +
        `${n - 5000} past the first 5000 not read)`,
    );
  });

  test('a CloudEvents batch of events that are no push: counted by reason', async () => {
    const events = filled({ specversion: '1.0', type: 'ImageDeleted' });
    const n = countOf(events);
    await summarised(
      'cloudevents',
      events,
      `no image push in the CloudEvents batch (${n} events ignored: 5000 CloudEvents type "ImageDeleted" is not a push, ` +
        `${n - 5000} past the first 5000 not read)`,
      'application/cloudevents-batch+json',
    );
  });
});
