/*
 * Hook definitions for tests that push through the built executable: the seed hook's shape
 * (/webhooks.sh, here this repository's shim, with the payload as argument 1 and the target from
 * the URL), guarded by a token only, plus fixed settings such as ROLLBACK_ON_FAILURE or MAIL_TO.
 */
import * as path from 'node:path';

const REPO = path.join(import.meta.dirname, '..');

/** The target of the upgrade from the URL, as the seed hook takes it: ns, workload, container, repo_type. */
export const TARGET_FROM_URL: readonly object[] = [
  { envname: 'APP_NS', source: 'url', name: 'ns' },
  { envname: 'APP_WORKLOAD', source: 'url', name: 'workload' },
  { envname: 'APP_CONTAINER', source: 'url', name: 'container' },
  { envname: 'REPO_TYPE', source: 'url', name: 'repo_type' },
];

/** Settings fixed in the hook (APP_*, MAIL_TO, ROLLBACK_ON_FAILURE, …): pass-environment-to-command entries. */
export function fixedSettings(settings: Record<string, string>): object[] {
  return Object.entries(settings).map(([envname, name]) => ({ envname, source: 'string', name }));
}

/** The seed hook's shape under another trigger rule. */
export function upgradeHookGuardedBy(id: string, rule: object, settings: Record<string, string> = {}): object {
  return {
    id,
    'execute-command': path.join(REPO, 'webhooks.sh'),
    'include-command-output-in-response': true,
    'include-command-output-in-response-on-error': true,
    'trigger-rule-mismatch-http-response-code': 500,
    'pass-arguments-to-command': [{ source: 'entire-payload' }],
    'pass-environment-to-command': [...TARGET_FROM_URL, ...fixedSettings(settings)],
    'trigger-rule': rule,
  };
}

/**
 * The upgrade hook as docs/registries.md shows it for each registry: the payload, then the request's
 * headers (registries that identify themselves by headers); REPO_TYPE fixed, or from the URL.
 */
export function registryHook(id: string, rule: object, repoType?: string): object {
  const target = repoType ? [...TARGET_FROM_URL.slice(0, 3), ...fixedSettings({ REPO_TYPE: repoType })] : TARGET_FROM_URL;
  return {
    id,
    'execute-command': path.join(REPO, 'webhooks.sh'),
    'include-command-output-in-response': true,
    'include-command-output-in-response-on-error': true,
    'trigger-rule-mismatch-http-response-code': 401,
    'pass-arguments-to-command': [{ source: 'entire-payload' }, { source: 'entire-headers' }],
    'pass-environment-to-command': [...target],
    'trigger-rule': rule,
  };
}

export function upgradeHook(id: string, token: string, settings: Record<string, string> = {}): object {
  return upgradeHookGuardedBy(id, { match: { type: 'value', value: token, parameter: { source: 'url', name: 'token' } } }, settings);
}
