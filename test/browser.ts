/*
 * A real headless browser for the page tests: Debian's chromium, installed with apt-get when it is
 * missing (as test/mta.ts installs exim), started on loopback with a private profile and driven
 * over the DevTools protocol (a WebSocket, Node's own client). In CI (CI=true) a browser that
 * cannot be installed or started fails the run; locally the tests that need it are skipped with a
 * loud message.
 *
 *   const browser = await browserOrSkip();
 *   const page = await browser!.open('http://127.0.0.1:1234/deliveries');
 *   await page.evaluate('document.title');
 *   fs.writeFileSync('shot.png', await page.screenshot());
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { aptInstall, makeTempDir, peerOrSkip, waitFor } from './harness.ts';

/** How long one DevTools call, or one navigation, may take. */
const CALL_TIMEOUT_MS = 30_000;

export interface Page {
  /** Navigates and waits for the load event. */
  goto(url: string): Promise<void>;
  /** Evaluates an expression in the page and returns its (JSON) value. */
  evaluate<T = unknown>(expression: string): Promise<T>;
  /** Sets the viewport: a phone is 390 × 844 at 3×. */
  viewport(width: number, height: number, scale?: number, mobile?: boolean): Promise<void>;
  /** A PNG of the whole page (beyond the viewport). */
  screenshot(): Promise<Buffer>;
  /** Load events seen so far (a page reloading itself adds one each time). */
  loads(): number;
  close(): Promise<void>;
}

export interface Browser {
  version: string;
  open(url: string): Promise<Page>;
  close(): Promise<void>;
}

function findChromium(): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(':').concat(['/usr/bin'])) {
    if (dir && fs.existsSync(path.join(dir, 'chromium'))) return path.join(dir, 'chromium');
  }
  return undefined;
}

function ensureChromium(): string {
  aptInstall(['chromium'], () => findChromium() !== undefined, 'chromium');
  return findChromium()!;
}

export async function startBrowser(): Promise<Browser> {
  const bin = ensureChromium();
  const profile = makeTempDir('chromium-profile-');
  // --no-sandbox: the tests run as root in a container, where chromium's sandbox cannot start.
  const child: ChildProcess = spawn(bin, [
    '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-extensions',
    '--remote-debugging-address=127.0.0.1', '--remote-debugging-port=0', `--user-data-dir=${profile}`, 'about:blank',
  ], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (s: string) => (stderr += s));
  let exited = false;
  child.on('exit', () => (exited = true));
  // The browser must not keep the test process alive when no test closes it (a name filter that
  // leaves out the tests whose after() would): it goes when the process does.
  child.unref();
  (child.stderr as unknown as { unref(): void }).unref();
  process.on('exit', () => {
    if (!exited) child.kill('SIGKILL');
  });
  const portFile = path.join(profile, 'DevToolsActivePort');
  try {
    await waitFor(() => exited || (fs.existsSync(portFile) && fs.readFileSync(portFile, 'utf8').includes('\n')), { timeoutMs: 30_000, what: 'chromium\'s DevTools port' });
  } catch (e) {
    child.kill('SIGKILL');
    throw new Error(`chromium did not start: ${(e as Error).message}\n${stderr.slice(-2000)}`);
  }
  if (exited) throw new Error(`chromium exited at start:\n${stderr.slice(-2000)}`);
  const port = Number(fs.readFileSync(portFile, 'utf8').split('\n')[0]);
  const version = ((await (await fetch(`http://127.0.0.1:${port}/json/version`)).json()) as { Browser: string }).Browser;
  return {
    version,
    open: (url) => openPage(port, url),
    close: async () => {
      if (exited) return;
      // Referenced again, so that the process waits for the exit it is told of.
      child.ref();
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const kill = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await gone;
      clearTimeout(kill);
    },
  };
}

/** The browser, or undefined locally when it cannot start (with a loud message); in CI, a failure. */
export function browserOrSkip(): Promise<Browser | undefined> {
  return peerOrSkip(startBrowser, 'chromium', 'browser tests');
}

async function openPage(port: number, url: string): Promise<Page> {
  // The target opens on about:blank and is navigated once the protocol listens, so that the wait
  // below is for the load of this navigation (its loaderId), never for the blank document a new
  // target starts with (which is already "complete" and would pass a readyState check).
  const target = (await (await fetch(`http://127.0.0.1:${port}/json/new?about:blank`, { method: 'PUT' })).json()) as {
    id: string;
    webSocketDebuggerUrl: string;
  };
  const ws = new WebSocket(target.webSocketDebuggerUrl);
  await new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve, { once: true });
    ws.addEventListener('error', () => reject(new Error('DevTools WebSocket failed')), { once: true });
  });
  let nextId = 0;
  let loads = 0;
  const waiting = new Map<number, { resolve: (v: any) => void; reject: (e: Error) => void }>();
  // The loaders whose document fired its load event, and who waits for one: the event may arrive
  // before Page.navigate's answer names the loader.
  const loaded = new Set<string>();
  const loadWaiters: (() => void)[] = [];
  ws.addEventListener('message', (m) => {
    const msg = JSON.parse(String(m.data));
    if (msg.method === 'Page.loadEventFired') loads++;
    if (msg.method === 'Page.lifecycleEvent' && msg.params.name === 'load') {
      loaded.add(msg.params.loaderId);
      for (const w of loadWaiters.splice(0)) w();
    }
    const w = msg.id !== undefined ? waiting.get(msg.id) : undefined;
    if (!w) return;
    waiting.delete(msg.id);
    if (msg.error) w.reject(new Error(`${msg.error.message} ${msg.error.data ?? ''}`));
    else w.resolve(msg.result);
  });
  const send = (method: string, params: object = {}): Promise<any> => new Promise((resolve, reject) => {
    const id = ++nextId;
    const timer = setTimeout(() => {
      waiting.delete(id);
      reject(new Error(`DevTools ${method}: no answer within ${CALL_TIMEOUT_MS} ms`));
    }, CALL_TIMEOUT_MS);
    const done = (f: (v: any) => void) => (v: any) => {
      clearTimeout(timer);
      f(v);
    };
    waiting.set(id, { resolve: done(resolve), reject: done(reject) });
    ws.send(JSON.stringify({ id, method, params }));
  });
  const loadOf = (loaderId: string, to: string): Promise<void> => {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${to} did not load within ${CALL_TIMEOUT_MS} ms`)), CALL_TIMEOUT_MS);
    });
    const seen = new Promise<void>((resolve) => {
      const check = (): void => void (loaded.has(loaderId) ? resolve() : loadWaiters.push(check));
      check();
    });
    return Promise.race([seen, late]).finally(() => clearTimeout(timer));
  };
  await send('Page.enable');
  await send('Page.setLifecycleEventsEnabled', { enabled: true });
  const page: Page = {
    async goto(to) {
      const r = await send('Page.navigate', { url: to });
      if (r.errorText) throw new Error(`${to} did not load: ${r.errorText}`);
      await loadOf(r.loaderId, to);
    },
    async evaluate(expression) {
      const r = await send('Runtime.evaluate', { expression, returnByValue: true });
      if (r.exceptionDetails) throw new Error(`evaluate ${expression}: ${JSON.stringify(r.exceptionDetails)}`);
      return r.result.value;
    },
    async viewport(width, height, scale = 1, mobile = false) {
      await send('Emulation.setDeviceMetricsOverride', { width, height, deviceScaleFactor: scale, mobile });
    },
    async screenshot() {
      const r = await send('Page.captureScreenshot', { format: 'png', captureBeyondViewport: true });
      return Buffer.from(r.data, 'base64');
    },
    loads: () => loads,
    async close() {
      ws.close();
      await fetch(`http://127.0.0.1:${port}/json/close/${target.id}`, { signal: AbortSignal.timeout(5_000) }).catch(() => undefined);
    },
  };
  await page.goto(url);
  return page;
}
