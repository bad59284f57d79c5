/*
 * A GHCR push as large as -max-body-size allows, and the hook that takes it as the README's GHCR
 * recipe does (payload-hmac-sha256 over the raw body, /webhooks.sh with the payload and the
 * headers): what the signed-load tests (exposure, memory) and bench/signed-load.ts send.
 */
import { createHmac } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';

export const SIGNED_SECRET = 'ghcr-signing-secret-7c2e51';
const REPO = path.join(import.meta.dirname, '..');

/**
 * GitHub's package event padded with user objects (numbers, strings, booleans, as GitHub's own
 * payloads hold) to just under `limit` bytes: every number costs the reader its literal text.
 */
export function largePushBody(limit = 1024 * 1024): string {
  const base = JSON.parse(fs.readFileSync(path.join(REPO, 'test', 'fixtures', 'upgrade', 'ghcr-package-published.json'), 'utf8'));
  const users: object[] = [];
  const user = (i: number) => ({ id: 1_000_000 + i, node_id: `MDQ6VXNlcjE${i}`, url: `https://api.github.com/users/u${i}`, site_admin: false, score: 1.5 });
  let body = JSON.stringify(base);
  for (let i = 0; ; i++) {
    users.push(user(i));
    if (i % 20 !== 0) continue;
    const next = JSON.stringify({ ...base, padding: users });
    if (Buffer.byteLength(next) > limit - 4096) return body;
    body = next;
  }
}

export function signature(body: string, secret = SIGNED_SECRET): string {
  return `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`;
}

/** The GHCR recipe's hook, for deployment/web's container app in `ns` (none: the upgrade fails at its first call). */
export function signedHook(id = 'ghcr'): object {
  return {
    id,
    'execute-command': path.join(REPO, 'webhooks.sh'),
    'include-command-output-in-response': true,
    'include-command-output-in-response-on-error': true,
    'trigger-rule-mismatch-http-response-code': 401,
    'pass-arguments-to-command': [{ source: 'entire-payload' }, { source: 'entire-headers' }],
    'pass-environment-to-command': [
      { envname: 'APP_NS', source: 'url', name: 'ns' },
      { envname: 'APP_WORKLOAD', source: 'url', name: 'workload' },
      { envname: 'APP_CONTAINER', source: 'url', name: 'container' },
      { envname: 'REPO_TYPE', source: 'string', name: 'ghcr' },
    ],
    'trigger-rule': { match: { type: 'payload-hmac-sha256', secret: SIGNED_SECRET, parameter: { source: 'header', name: 'X-Hub-Signature-256' } } },
  };
}

export const SIGNED_PATH = '/hooks/ghcr?ns=prod&workload=deployment/web&container=app';
