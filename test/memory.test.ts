// How the executable sizes V8, set in it and not by the operator (scripts/build.ts): the heap
// limit follows the container's memory limit, and no thread the service does not use is started.
// The container is a memory cgroup the test creates (root, cgroup v1 or v2, as in CI); without one
// the container case skips locally with a loud message and fails in CI.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import * as http from 'node:http';
import { defaultBinary, httpRequest, IS_ADNANH, makeTempDir, startWebhook, waitForOutput } from './harness.ts';
import { largePushBody, signature, SIGNED_PATH, signedHook } from './signed-load.ts';

const HOOKS = [{ id: 'echo', 'execute-command': '/bin/echo', 'include-command-output-in-response': true }];
const HEAP_LINE = /V8 heap limit (\d+) MB \(([^)]*)\)/;
const MiB = 1024 * 1024;

/** A memory cgroup limited to `bytes`, and a launcher that runs the binary inside it; undefined without one. */
function memoryCgroup(bytes: number): { launcher: string; remove(): void } | { error: string } {
  const name = `webhook-test-memory-${process.pid}`;
  const v2 = fs.existsSync('/sys/fs/cgroup/cgroup.controllers');
  const dir = v2 ? path.join('/sys/fs/cgroup', name) : path.join('/sys/fs/cgroup/memory', name);
  try {
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, v2 ? 'memory.max' : 'memory.limit_in_bytes'), String(bytes));
  } catch (e) {
    return { error: `cannot create a memory cgroup at ${dir}: ${(e as Error).message}` };
  }
  const launcher = path.join(makeTempDir('webhook-cgroup-'), 'in-cgroup.sh');
  // The shell moves itself into the cgroup and exec()s the binary there.
  fs.writeFileSync(launcher, `#!/bin/sh\necho $$ > ${dir}/cgroup.procs && exec ${defaultBinary()} "$@"\n`, { mode: 0o755 });
  return { launcher, remove: () => fs.rmdirSync(dir) };
}

function threadNames(pid: number): string[] {
  const tasks = fs.readdirSync(`/proc/${pid}/task`);
  return tasks.map((t) => fs.readFileSync(`/proc/${pid}/task/${t}/comm`, 'utf8').trim());
}

describe('V8 sizing in the executable', { skip: IS_ADNANH && 'our executable only' }, () => {
  it('caps the heap at half the memory Node sees when there is no container limit', async () => {
    const w = await startWebhook({ hooks: HOOKS });
    try {
      const [, mb, container] = HEAP_LINE.exec(await waitForOutput(w, HEAP_LINE))!;
      assert.equal(container, 'no memory limit');
      const half = os.totalmem() / 2 / MiB;
      assert.ok(Number(mb) > half * 0.8 && Number(mb) < half * 1.2, `heap limit ${mb} MB, half the machine ${half} MB`);
    } finally {
      await w.stop();
    }
  });

  it('caps the heap at half the container memory limit', async (t) => {
    const cgroup = memoryCgroup(256 * MiB);
    if ('error' in cgroup) {
      if (process.env.CI) assert.fail(cgroup.error);
      console.error(`\n*** SKIPPED: ${cgroup.error} ***\n`);
      return t.skip(cgroup.error);
    }
    const w = await startWebhook({ hooks: HOOKS, bin: cgroup.launcher });
    try {
      const [, mb, container] = HEAP_LINE.exec(await waitForOutput(w, HEAP_LINE))!;
      assert.equal(container, 'memory limit 256 MB');
      // Half of 256 MB for the old generation, plus the young generation's few MB.
      assert.ok(Number(mb) >= 128 && Number(mb) <= 140, `heap limit ${mb} MB in a 256 MB container`);
      assert.equal((await w.request('/hooks/echo', { method: 'POST' })).status, 200, 'serves and starts commands');
    } finally {
      await w.stop();
      cgroup.remove();
    }
  });

  it('starts one V8 platform thread, and SIGUSR1 reloads hooks without opening an inspector', async () => {
    const dir = makeTempDir('webhook-threads-');
    const file = path.join(dir, 'hooks.json');
    fs.writeFileSync(file, JSON.stringify(HOOKS));
    const w = await startWebhook({ hooks: file });
    try {
      assert.equal((await httpRequest(w.port, '/hooks/echo', { method: 'POST' })).status, 200);
      const names = threadNames(w.proc.pid!);
      assert.equal(names.filter((n) => n.startsWith('node-V8Worker')).length, 1, `threads: ${names.join(', ')}`);
      fs.writeFileSync(file, JSON.stringify([...HOOKS, { id: 'second', 'execute-command': '/bin/true' }]));
      w.proc.kill('SIGUSR1');
      await waitForOutput(w, /caught SIGUSR1/);
      await waitForOutput(w, /loaded 2 hook\(s\)|second/);
      assert.equal((await httpRequest(w.port, '/hooks/second', { method: 'POST' })).status, 200);
      assert.equal(w.proc.exitCode, null, 'still running after SIGUSR1');
      const inspector = await new Promise<boolean>((resolve) => {
        const socket = net.connect(9229, '127.0.0.1', () => resolve(true)).on('error', () => resolve(false));
        socket.unref();
      });
      assert.equal(inspector, false, 'SIGUSR1 opened an inspector on 127.0.0.1:9229');
    } finally {
      await w.stop();
    }
  });
});


/** VmHWM (peak resident memory) of a process, in MB. */
function peakRssMB(pid: number): number {
  return Number(/^VmHWM:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;
}

/** One POST on a connection of its own: status, Retry-After and body, or the error that ended it. */
function postOnce(port: number, body: string, headers: Record<string, string>): Promise<{ status: number; retryAfter?: string; body: string } | Error> {
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, path: SIGNED_PATH, method: 'POST', agent: false, headers: { ...headers, 'Content-Length': String(Buffer.byteLength(body)) } }, (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, retryAfter: res.headers['retry-after'], body: text }));
      res.on('error', resolve);
    });
    req.on('error', resolve);
    req.end(body);
  });
}

describe('memory under signed load', { skip: IS_ADNANH && 'our executable only' }, () => {
  it('32 concurrent correctly signed 1 MiB pushes in a 256 MiB container: each answered, peak RSS under 256 MB', { timeout: 180_000 }, async (t) => {
    const cgroup = memoryCgroup(256 * MiB);
    if ('error' in cgroup) {
      if (process.env.CI) assert.fail(cgroup.error);
      console.error(`\n*** SKIPPED: ${cgroup.error} ***\n`);
      return t.skip(cgroup.error);
    }
    // No cluster: each upgrade reads its payload and fails at its first Kubernetes call.
    const w = await startWebhook({ hooks: [signedHook()], bin: cgroup.launcher, env: { KUBECONFIG: '' } });
    try {
      const body = largePushBody();
      const headers = { 'Content-Type': 'application/json', 'X-Hub-Signature-256': signature(body) };
      const answers = await Promise.all(Array.from({ length: 32 }, () => postOnce(w.port, body, headers)));
      const peak = peakRssMB(w.proc.pid!);
      t.diagnostic(`peak RSS ${peak.toFixed(0)} MB; answers ${answers.map((a) => (a instanceof Error ? a.message : a.status)).join(' ')}`);
      for (const a of answers) {
        assert.ok(!(a instanceof Error), `a push got no answer: ${a instanceof Error ? a.message : ''}`);
        // The upgrade's own report (it failed: no cluster), or the memory limit's 503 with Retry-After.
        if (a.status === 503) assert.deepEqual([a.body, a.retryAfter], ['Too many request bodies in memory; retry later.', '5']);
        else assert.match(a.body, /^result: +failed: /m);
      }
      assert.equal(w.proc.exitCode, null, 'the process is still running');
      assert.ok(peak < 256, `peak RSS ${peak.toFixed(0)} MB`);
    } finally {
      await w.stop();
      cgroup.remove();
    }
  });
});
