/*
 * The floor under a hook that starts a process: the CPU a Node process spends to start one
 * `/bin/echo` and collect its output, measured where a launcher could do it.
 *
 *   npm run bench:fork-floor [-- count]   (default 500 processes, 8 at a time, per place)
 *
 * Places: the main thread of a bare Node process (what a pool of launcher processes would be), a
 * worker thread of that process (forks taken off the event loop), and the main thread after the
 * heap has grown to the size a serving webhook has (fork copies the page tables of every private
 * page). Printed: this process's user+sys CPU per started process. libuv starts processes with
 * fork() + exec(), whose cost grows with the parent's private memory; Go's os/exec uses
 * clone(CLONE_VFORK|CLONE_VM), which copies nothing. `npm run bench`'s command scenarios give
 * adnanh's whole-request CPU beside ours.
 */

import { spawn } from 'node:child_process';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';

const COUNT = Number(process.argv[2] ?? workerData?.count ?? 500);
const PARALLEL = 8;

/** Starts COUNT processes, PARALLEL at a time; resolves with this process's CPU µs per process. */
async function startProcesses(count: number): Promise<number> {
  const before = process.cpuUsage();
  let started = 0;
  const one = (): Promise<void> =>
    new Promise((resolve) => {
      const child = spawn('/bin/echo', ['x'], { stdio: ['ignore', 'pipe', 'pipe'] });
      child.stdout.resume();
      child.stderr.resume();
      child.on('close', () => resolve());
    });
  const lane = async () => {
    while (started < count) {
      started++;
      await one();
    }
  };
  await Promise.all(Array.from({ length: PARALLEL }, lane));
  const used = process.cpuUsage(before);
  return (used.user + used.system) / count;
}

if (!isMainThread) {
  parentPort!.postMessage(await startProcesses(COUNT));
} else {
  const rows: [string, number][] = [];
  rows.push(['main thread, bare Node process', await startProcesses(COUNT)]);
  const worker = new Worker(new URL(import.meta.url), { workerData: { count: COUNT } });
  const inWorker = await new Promise<number>((resolve) => worker.once('message', resolve));
  await worker.terminate();
  // cpuUsage() is per process: the worker's figure includes the main thread's idle share (~0).
  rows.push(['worker thread of a bare Node process', inWorker]);
  const ballast = Array.from({ length: 200_000 }, (_, i) => ({ i, s: `entry ${i}` }));
  rows.push([`main thread, heap grown to ${(process.memoryUsage().heapUsed / 1048576).toFixed(0)} MB`, await startProcesses(COUNT)]);
  if (ballast.length === 0) throw new Error('unreachable');
  for (const [place, us] of rows) console.log(`${place.padEnd(44)} ${us.toFixed(0).padStart(6)} µs CPU per process`);
}
