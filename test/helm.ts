/*
 * Helm for the chart tests, built from the Go module proxy like the cluster's binaries and cached
 * beside them, keyed by version (`${XDG_CACHE_HOME:-~/.cache}/webhook-test/bin/helm-<version>`).
 * helm.sh/helm/v3's go.mod has no replace directives, so `go install pkg@version` builds it as it is.
 *
 *   node test/helm.ts     # builds it (about 3 minutes the first time) and prints its path
 */
import { binPath, buildInto, GO_ENV, goBuildWithProgress } from './cluster/cluster.ts';

/** The Helm release Rancher's own charts are tested with (3.x); bump here, the cache follows. */
export const HELM_VERSION = 'v3.22.0';

let built: Promise<string> | undefined;

/** The path of the helm binary, built on first use. */
export function ensureHelm(): Promise<string> {
  built ??= buildInto(['helm'], HELM_VERSION, (outDir) =>
    goBuildWithProgress(`Helm ${HELM_VERSION}`, '3 minutes', {
      args: [
        'install', '-v', '-trimpath',
        // Stamped like a release, so `helm version` and the chart's kubeVersion checks see it.
        '-ldflags', `-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}`,
        `helm.sh/helm/v3/cmd/helm@${HELM_VERSION}`,
      ],
      cwd: outDir,
      env: { ...GO_ENV, GOBIN: outDir },
    }),
  ).then(() => binPath('helm', HELM_VERSION));
  built.catch(() => (built = undefined));
  return built;
}

/**
 * Helm, or undefined locally (with a loud message) when it cannot be built; in CI the failure
 * fails the tests that need it.
 */
export async function helmOrSkip(): Promise<string | undefined> {
  try {
    return await ensureHelm();
  } catch (e) {
    if (process.env.CI) throw e;
    process.stderr.write(`\n#### helm unavailable, SKIPPING chart tests: ${(e as Error).message}\n\n`);
    return undefined;
  }
}

if (import.meta.main) process.stdout.write(`${await ensureHelm()}\n`);
