/*
 * A GHCR push as large as -max-body-size allows, and the hook that takes it as the README's GHCR
 * recipe does (payload-hmac-sha256 over the raw body, /webhooks.sh with the payload and the
 * headers): what the signed-load tests (exposure, memory) and bench/signed-load.ts send.
 */
import { createHmac } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { registryHook } from './upgrade-hooks.ts';

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
  const rule = { match: { type: 'payload-hmac-sha256', secret: SIGNED_SECRET, parameter: { source: 'header', name: 'X-Hub-Signature-256' } } };
  return registryHook(id, rule, 'ghcr');
}

export const SIGNED_PATH = '/hooks/ghcr?ns=prod&workload=deployment/web&container=app';
