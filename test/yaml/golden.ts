/*
 * The ground truth for the YAML reader: what ghodss/yaml over gopkg.in/yaml.v2, exactly as vendored
 * in adnanh/webhook 2.8.0, makes of every case (probe.go, built from adnanh's own source tree).
 *
 * Regenerate test/yaml/golden.json (needs Go and adnanh's source, see adnanhSource() in ../peer.ts):
 *   node_modules/.bin/node test/yaml/golden.ts
 *
 * golden.json keeps the text of our cases, so that a changed case is caught, but only a SHA-256 of
 * adnanh's files: they are his to publish, and the hash still tells when the golden is stale.
 */

import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { adnanhSource, peerCacheRoot, type SourceTree } from '../peer.ts';
import { corpusCases, type DocCase, ownCases, scalarCases } from './cases.ts';

export const GOLDEN = path.join(import.meta.dirname, 'golden.json');
const PROBE_SOURCE = path.join(import.meta.dirname, 'probe.go');

export interface GoDoc {
  json?: string;
  err?: string;
}
export interface GoScalar {
  str?: string;
  err?: string;
}
/** One document case: our cases keep their text (`yaml`), adnanh's files only its hash (`sha256`). */
export type GoldenDoc = { yaml?: string; sha256?: string } & GoDoc;
export interface Golden {
  /** adnanh's version whose vendored YAML libraries and hook files made this golden. */
  adnanh: string;
  docs: Record<string, GoldenDoc>;
  scalars: Record<string, GoScalar>;
}

export const sha256 = (text: string): string => createHash('sha256').update(text).digest('hex');

export function readGolden(): Golden {
  return JSON.parse(fs.readFileSync(GOLDEN, 'utf8')) as Golden;
}

/** The Go toolchain (`go` on PATH or in the usual install places), or undefined. */
export function findGo(): string | undefined {
  const dirs = (process.env.PATH ?? '').split(':').concat(['/usr/local/go/bin', '/usr/lib/go/bin']);
  for (const dir of dirs) {
    const go = path.join(dir || '.', 'go');
    if (spawnSync(go, ['version'], { stdio: 'ignore' }).status === 0) return go;
  }
  return undefined;
}

/**
 * Builds probe.go inside adnanh's module (so that its vendor/ supplies ghodss/yaml and yaml.v2) into
 * the test cache, outside the clone, once per probe text. An -overlay adds the file to the module
 * without writing into the source tree, which other tests share read-only. Offline: vendor only.
 */
export function buildProbe(go: string, source: SourceTree): string {
  const text = fs.readFileSync(PROBE_SOURCE);
  const dir = path.join(peerCacheRoot(), `adnanh-${source.version}`);
  const bin = path.join(dir, `yamlprobe-${sha256(text.toString('utf8')).slice(0, 12)}`);
  if (fs.existsSync(bin)) return bin;
  fs.mkdirSync(dir, { recursive: true });
  const overlay = path.join(dir, `yamlprobe-overlay-${process.pid}.json`);
  const virtual = path.join(source.dir, 'cmd', 'yamlprobe', 'main.go');
  fs.writeFileSync(overlay, JSON.stringify({ Replace: { [virtual]: PROBE_SOURCE } }));
  // Built beside its final name and renamed, so concurrent runs never start half a binary.
  const tmp = `${bin}.tmp-${process.pid}`;
  try {
    execFileSync(go, ['build', '-trimpath', `-overlay=${overlay}`, '-o', tmp, './cmd/yamlprobe'], {
      cwd: source.dir,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: {
        ...process.env,
        GOTOOLCHAIN: 'local', GOFLAGS: '-mod=vendor -buildvcs=false', GOPROXY: 'off', CGO_ENABLED: '0',
        // Shared with test/adnanh-suite.test.ts: the same vendored packages, compiled once.
        GOCACHE: path.join(dir, 'suite-gocache'),
      },
    });
    fs.renameSync(tmp, bin);
  } finally {
    fs.rmSync(overlay, { force: true });
    fs.rmSync(tmp, { force: true });
  }
  return bin;
}

/** Runs the probe on every case: adnanh's files (by hash) and ours (with their text). */
export function runProbe(probe: string, source: SourceTree): Golden {
  const corpus = corpusCases(source.dir);
  const docs: DocCase[] = [...corpus, ...ownCases()];
  const scalars = scalarCases();
  const input = JSON.stringify({ docs: docs.map((d) => d.yaml), scalars });
  const out = JSON.parse(execFileSync(probe, [], { input, maxBuffer: 64 << 20 }).toString('utf8')) as {
    docs: GoDoc[];
    scalars: GoScalar[];
  };
  const golden: Golden = { adnanh: source.version, docs: {}, scalars: {} };
  docs.forEach((d, i) => {
    if (Object.hasOwn(golden.docs, d.name)) throw new Error(`two cases are named ${d.name}`);
    const text = corpus.includes(d) ? { sha256: sha256(d.yaml) } : { yaml: d.yaml };
    golden.docs[d.name] = { ...text, ...out.docs[i] };
  });
  scalars.forEach((s, i) => {
    golden.scalars[s] = out.scalars[i];
  });
  return golden;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const go = findGo();
  if (!go) throw new Error('no Go toolchain (go on PATH or /usr/local/go/bin)');
  const source = await adnanhSource();
  fs.writeFileSync(GOLDEN, JSON.stringify(runProbe(buildProbe(go, source), source), null, 1) + '\n');
  console.log(`wrote ${GOLDEN} from adnanh/webhook ${source.version} (${source.dir})`);
}
