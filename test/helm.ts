/*
 * Helm for the chart tests, built from the Go module proxy like the cluster's binaries and cached
 * beside them, keyed by version (`${XDG_CACHE_HOME:-~/.cache}/webhook-test/bin/helm-<version>`).
 * helm.sh/helm/v3's go.mod has no replace directives, so `go install pkg@version` builds it as it is.
 *
 *   node test/helm.ts     # builds it (about 3 minutes the first time) and prints its path
 */
import { execFile } from 'node:child_process';
import { binPath, buildInto, GO_ENV, goBuildWithProgress } from './cluster/cluster.ts';
import { peerOrSkip } from './harness.ts';

/** The Helm release Rancher's own charts are tested with (3.x); bump here, the cache follows. */
export const HELM_VERSION = 'v3.22.0';
/** The minor version of k8s.io/client-go in that release's go.mod (v0.37.0). */
const HELM_KUBE_MINOR = '37';

let built: Promise<string> | undefined;

/** The path of the helm binary, built on first use. */
export function ensureHelm(): Promise<string> {
  built ??= buildInto(['helm'], HELM_VERSION, (outDir) =>
    goBuildWithProgress(`Helm ${HELM_VERSION}`, '3 minutes', {
      args: [
        'install', '-v', '-trimpath',
        // Stamped as helm's Makefile does a release: its version, and the Kubernetes version of its
        // client-go (v0.37.0 → 1.37), which `helm template` and `helm lint` take for the cluster's
        // (unstamped it is 1.20, and the chart's kubeVersion check fails).
        '-ldflags', [
          `-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}`,
          ...['pkg/lint/rules', 'pkg/chartutil'].flatMap((p) => [
            `-X helm.sh/helm/v3/${p}.k8sVersionMajor=1`,
            `-X helm.sh/helm/v3/${p}.k8sVersionMinor=${HELM_KUBE_MINOR}`,
          ]),
        ].join(' '),
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
export function helmOrSkip(): Promise<string | undefined> {
  return peerOrSkip(ensureHelm, 'helm', 'chart tests');
}

/**
 * Runs `helm` with its cache, configuration and data under `home` (none of the user's), against the cluster of
 * `kubeconfig` when given: its output, or an Error carrying helm's own message.
 */
export function helmRunner(helm: string, home: string, kubeconfig?: string): (args: string[]) => Promise<string> {
  const env = { ...process.env, HELM_CACHE_HOME: home, HELM_CONFIG_HOME: home, HELM_DATA_HOME: home };
  const cluster = kubeconfig ? ['--kubeconfig', kubeconfig] : [];
  return (args) =>
    new Promise((resolve, reject) => {
      execFile(helm, [...args, ...cluster], { env, maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
        if (error) reject(new Error(`helm ${args.join(' ')}: ${stderr || error.message}`));
        else resolve(stdout);
      });
    });
}

if (import.meta.main) process.stdout.write(`${await ensureHelm()}\n`);
