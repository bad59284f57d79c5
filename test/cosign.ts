/*
 * cosign for the signed-image tests, built from the Go module proxy like the cluster's binaries and
 * cached beside them, keyed by version (`${XDG_CACHE_HOME:-~/.cache}/webhook-test/bin/cosign-<version>`).
 * github.com/sigstore/cosign/v2's go.mod has no replace directives, so `go install pkg@version` builds it.
 *
 *   node test/cosign.ts     # builds it (about 3 minutes the first time) and prints its path
 */
import { binPath, buildInto, GO_ENV, goBuildWithProgress } from './cluster/cluster.ts';
import { peerOrSkip } from './harness.ts';

/** The cosign release the tests sign with (the last 2.x); bump here, the cache follows. */
export const COSIGN_VERSION = 'v2.6.5';

let built: Promise<string> | undefined;

/** The path of the cosign binary, built on first use. */
export function ensureCosign(): Promise<string> {
  built ??= buildInto(['cosign'], COSIGN_VERSION, (outDir) =>
    goBuildWithProgress(`cosign ${COSIGN_VERSION}`, '3 minutes', {
      args: [
        'install', '-v', '-trimpath',
        // Stamped as cosign's Makefile does a release, so `cosign version` names it.
        '-ldflags', `-X sigs.k8s.io/release-utils/version.gitVersion=${COSIGN_VERSION}`,
        `github.com/sigstore/cosign/v2/cmd/cosign@${COSIGN_VERSION}`,
      ],
      cwd: outDir,
      env: { ...GO_ENV, GOBIN: outDir },
    }),
  ).then(() => binPath('cosign', COSIGN_VERSION));
  built.catch(() => (built = undefined));
  return built;
}

/**
 * cosign, or undefined locally (with a loud message) when it cannot be built; in CI the failure
 * fails the tests that need it.
 */
export function cosignOrSkip(): Promise<string | undefined> {
  return peerOrSkip(ensureCosign, 'cosign', 'signed-image tests');
}

if (import.meta.main) process.stdout.write(`${await ensureCosign()}\n`);
