/*
 * cosign for the signed-image tests, built from the Go module proxy like the cluster's binaries and
 * cached beside them, keyed by version (`${XDG_CACHE_HOME:-~/.cache}/webhook-test/bin/cosign-<version>`):
 * the last 2.x, which signs in the simple-signing format, and a 3.x, which signs in the Sigstore bundle
 * format by default. Neither github.com/sigstore/cosign/v2's nor /v3's go.mod has replace directives,
 * so `go install pkg@version` builds each.
 *
 *   node test/cosign.ts     # builds both (about 3 minutes each the first time) and prints their paths
 */
import { binPath, buildInto, GO_ENV, goBuildWithProgress } from './cluster/cluster.ts';
import { peerOrSkip } from './harness.ts';

/** The cosign releases the tests sign with: the last 2.x, and a 3.x; bump here, the cache follows. */
export const COSIGN_VERSION = 'v2.6.5';
export const COSIGN3_VERSION = 'v3.1.3';

const built = new Map<string, Promise<string>>();

/** The path of the cosign binary of `version`, built on first use. */
export function ensureCosign(version = COSIGN_VERSION): Promise<string> {
  const major = version.split('.')[0];
  let building = built.get(version);
  if (!building) {
    building = buildInto(['cosign'], version, (outDir) =>
      goBuildWithProgress(`cosign ${version}`, '3 minutes', {
        args: [
          'install', '-v', '-trimpath',
          // Stamped as cosign's Makefile does a release, so `cosign version` names it.
          '-ldflags', `-X sigs.k8s.io/release-utils/version.gitVersion=${version}`,
          `github.com/sigstore/cosign/${major}/cmd/cosign@${version}`,
        ],
        cwd: outDir,
        env: { ...GO_ENV, GOBIN: outDir },
      }),
    ).then(() => binPath('cosign', version));
    building.catch(() => built.delete(version));
    built.set(version, building);
  }
  return building;
}

/**
 * cosign of `version`, or undefined locally (with a loud message) when it cannot be built; in CI the
 * failure fails the tests that need it.
 */
export function cosignOrSkip(version = COSIGN_VERSION): Promise<string | undefined> {
  return peerOrSkip(() => ensureCosign(version), `cosign ${version}`, 'signed-image tests');
}

if (import.meta.main) for (const v of [COSIGN_VERSION, COSIGN3_VERSION]) process.stdout.write(`${await ensureCosign(v)}\n`);
