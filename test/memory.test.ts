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
import { defaultBinary, httpRequest, IS_ADNANH, makeTempDir, startWebhook, waitForOutput } from './harness.ts';

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

