/**
 * The benchmark's child processes (simulator, gateway, nginx), each pinned with `taskset`, and what the kernel says
 * about them: CPU time and RSS from /proc/<pid>, per-core busy time from /proc/stat.
 *
 * Every child is registered for cleanup: SIGKILL on exit, on SIGINT/SIGTERM and on an uncaught error.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, openSync, closeSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { request } from 'undici';

export const CLK_TCK = readClockTicks();

function readClockTicks(): number {
  try {
    const value = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
    return Number.isInteger(value) && value > 0 ? value : 100;
  } catch {
    return 100;
  }
}

// --- cleanup ---------------------------------------------------------------------------------------------------

const children = new Set<ChildProcess>();
let cleanupInstalled = false;

export function killAll(): void {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) {
      try {
        child.kill('SIGKILL');
      } catch {
        // already gone
      }
    }
  }
  children.clear();
}

function installCleanup(): void {
  if (cleanupInstalled) return;
  cleanupInstalled = true;
  process.on('exit', killAll);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.on(signal, () => {
      console.error(`\n${signal}: stopping the benchmark's processes`);
      killAll();
      process.exit(130);
    });
  }
  process.on('uncaughtException', (error) => {
    console.error(error);
    killAll();
    process.exit(1);
  });
}

export interface Child {
  readonly name: string;
  readonly process: ChildProcess;
  readonly pid: number;
  /** Files where its stdout / stderr go (stderr may be the same file). */
  readonly logFile: string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves when it has exited. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Starts `command args` pinned to `core` (taskset execs the command, so the pid is the command's). stdout and stderr
 * go to `<dir>/<name>.log`, except that `watchStdout` gets stdout lines instead when given.
 */
export function spawnPinned(options: {
  name: string;
  core: number;
  command: string;
  args: string[];
  dir: string;
  watchStdout?: (line: string) => void;
  env?: NodeJS.ProcessEnv;
}): Child {
  installCleanup();
  const logFile = join(options.dir, `${options.name}.log`);
  const fd = openSync(logFile, 'a');
  const child = spawn('taskset', ['-c', String(options.core), options.command, ...options.args], {
    stdio: ['ignore', options.watchStdout !== undefined ? 'pipe' : fd, fd],
    env: options.env ?? process.env,
    // Whatever a child writes to its working directory (V8 logs with --perf-basic-prof) stays out of the repository.
    cwd: options.dir,
  });
  closeSync(fd);
  children.add(child);
  if (options.watchStdout !== undefined && child.stdout !== null) {
    const watch = options.watchStdout;
    let buffered = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (text: string) => {
      buffered += text;
      let nl = buffered.indexOf('\n');
      while (nl !== -1) {
        watch(buffered.slice(0, nl));
        buffered = buffered.slice(nl + 1);
        nl = buffered.indexOf('\n');
      }
    });
  }
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
  child.once('exit', () => children.delete(child));
  if (child.pid === undefined) throw new Error(`could not start ${options.name} (${options.command})`);
  return {
    name: options.name,
    process: child,
    pid: child.pid,
    logFile,
    async stop(graceMs = 3000) {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** A port that was free a moment ago (the child binds it right after). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Polls `url` until it answers 200, for at most `timeoutMs`. */
export async function waitFor200(url: string, timeoutMs: number, child?: Child): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    if (child !== undefined && (child.process.exitCode !== null || child.process.signalCode !== null)) {
      throw new Error(`${child.name} exited (${child.process.exitCode ?? child.process.signalCode}); see ${child.logFile}`);
    }
    try {
      const response = await request(url, { headersTimeout: 1000, bodyTimeout: 1000 });
      await response.body.dump();
      if (response.statusCode === 200) return;
      last = `HTTP ${response.statusCode}`;
    } catch (error) {
      last = error instanceof Error ? error.message : String(error);
    }
    await sleep(100);
  }
  throw new Error(`${url} not ready within ${timeoutMs} ms (${last})${child === undefined ? '' : `; see ${child.logFile}`}`);
}

// --- the processes ----------------------------------------------------------------------------------------------

export interface SimSettings {
  itlMs: number;
  ttftMs: number;
  outputTokens: number;
  seed: number;
}

/** `waybill sim` on a free port; resolves once it printed its URL. */
export async function startSim(bin: string, core: number, dir: string, settings: SimSettings): Promise<{ child: Child; origin: string }> {
  let resolveUrl: (url: string) => void = () => undefined;
  const url = new Promise<string>((resolve) => (resolveUrl = resolve));
  const child = spawnPinned({
    name: 'sim',
    core,
    dir,
    command: process.execPath,
    args: [
      bin,
      'sim',
      '--port',
      '0',
      // The bench's workload is a fixed pace: the timer, not the engine model.
      '--engine-model',
      'off',
      '--itl-ms',
      String(settings.itlMs),
      '--ttft-ms',
      String(settings.ttftMs),
      '--output-tokens',
      String(settings.outputTokens),
      '--jitter',
      '0',
      '--seed',
      String(settings.seed),
    ],
    watchStdout: (line) => {
      const match = /http:\/\/127\.0\.0\.1:\d+/.exec(line);
      if (match !== null) resolveUrl(match[0]);
    },
  });
  const timeout = sleep(10_000).then(() => undefined);
  const origin = await Promise.race([url, timeout]);
  if (origin === undefined) throw new Error(`the simulator did not print its URL; see ${child.logFile}`);
  await waitFor200(`${origin}/health`, 10_000, child);
  return { child, origin };
}

export interface GatewaySettings {
  name: string;
  upstream: string;
  /**
   * `default`: the configuration's defaults for everything that runs per request — `logging` unset, so level info
   * and one wide JSON line per request on stdout (which goes to the child's log file, as `serve > file` would).
   * `lean`: `logging: {level: warn, requests: false}`, the configuration of the figures before issue 15.
   */
  logging: 'default' | 'lean';
  /** Tracing on: OTEL_EXPORTER_OTLP_ENDPOINT for the child (e.g. a closed port: a collector that is down). */
  otlpEndpoint?: string;
  /** Extra node flags, e.g. --cpu-prof. */
  nodeFlags?: string[];
  /** `--workers` (default 1: one process, whatever the machine's cores). */
  workers?: number;
  /** `streaming.turn_budget` (default: the configuration's, 2ms); '0ms' turns the read turns off. */
  turnBudget?: string;
  /** Configuration keys merged over the bench's (a `--variant` row). */
  extra?: Record<string, unknown>;
}

/** `waybill serve --config FILE` on a free port; resolves once /readyz says 200. */
export async function startGateway(bin: string, core: number, dir: string, settings: GatewaySettings): Promise<{ child: Child; origin: string }> {
  const port = await freePort();
  // JSON is YAML. Only what the bench needs is set; the shutdown keys only shorten the stop after the last window.
  const config = {
    pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url: settings.upstream }] }],
    ...(settings.logging === 'lean' ? { logging: { level: 'warn', requests: false } } : {}),
    ...(settings.turnBudget !== undefined ? { streaming: { turn_budget: settings.turnBudget } } : {}),
    shutdown: { grace: 0, drain_timeout: 1 },
    ...settings.extra,
    // A variant's server keys (parseVariant refuses host, port, the admin listener's and workers) beside the bench's own.
    server: { ...(settings.extra?.server as Record<string, unknown> | undefined), host: '127.0.0.1', port },
  };
  const configFile = join(dir, `${settings.name}.yaml`);
  writeFileSync(configFile, JSON.stringify(config, null, 2));
  const child = spawnPinned({
    name: settings.name,
    core,
    dir,
    command: process.execPath,
    args: [...(settings.nodeFlags ?? []), bin, 'serve', '--config', configFile, '--workers', String(settings.workers ?? 1)],
    // No OTEL_* from the bench's own environment: tracing is on only where a setting asks for it.
    env: { ...withoutOtel(process.env), ...(settings.otlpEndpoint !== undefined ? { OTEL_EXPORTER_OTLP_ENDPOINT: settings.otlpEndpoint } : {}) },
  });
  const origin = `http://127.0.0.1:${port}`;
  await waitFor200(`${origin}/readyz`, 15_000, child);
  if (settings.otlpEndpoint !== undefined) {
    // `serve` logs where spans go in its start-up line; a row labelled +otel must not run with tracing off.
    const expected = `"tracing":"${settings.otlpEndpoint.replace(/\/+$/, '')}/v1/traces"`;
    if (settings.logging === 'default' && !readFileSync(child.logFile, 'utf8').includes(expected)) {
      throw new Error(`${settings.name}: tracing is not on (no ${expected} in ${child.logFile})`);
    }
  }
  return { child, origin };
}

function withoutOtel(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const copy: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(env)) if (!key.startsWith('OTEL_')) copy[key] = value;
  return copy;
}

/** nginx as a plain streaming reverse proxy: one process (no master), buffering off, keep-alive upstream. */
export async function startNginx(nginxBin: string, core: number, dir: string, upstream: string): Promise<{ child: Child; origin: string }> {
  const port = await freePort();
  const prefix = join(dir, 'nginx');
  mkdirSync(prefix, { recursive: true });
  const upstreamHost = upstream.replace(/^http:\/\//, '');
  const conf = `# generated by bench/proxy.ts
worker_processes 1;
master_process off;
daemon off;
pid ${prefix}/nginx.pid;
error_log ${prefix}/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path ${prefix}/client_body;
  proxy_temp_path ${prefix}/proxy;
  fastcgi_temp_path ${prefix}/fastcgi;
  uwsgi_temp_path ${prefix}/uwsgi;
  scgi_temp_path ${prefix}/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  upstream sim {
    server ${upstreamHost};
    keepalive 1024;
    keepalive_requests 1000000;
    keepalive_timeout 4s;
  }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 120s;
    }
  }
}
`;
  const confFile = join(prefix, 'nginx.conf');
  writeFileSync(confFile, conf);
  const child = spawnPinned({ name: 'nginx', core, dir, command: nginxBin, args: ['-p', prefix, '-c', confFile, '-e', join(prefix, 'error.log')] });
  const origin = `http://127.0.0.1:${port}`;
  await waitFor200(`${origin}/health`, 10_000, child);
  return { child, origin };
}

/**
 * The floor of a Node.js proxy (bench/proxy/floor.ts): Node's HTTP server and undici, one write per upstream chunk,
 * nothing else.
 */
export async function startFloor(script: string, core: number, dir: string, upstream: string): Promise<{ child: Child; origin: string }> {
  const port = await freePort();
  const child = spawnPinned({ name: 'node-floor', core, dir, command: process.execPath, args: [script, '--port', String(port), '--upstream', upstream] });
  const origin = `http://127.0.0.1:${port}`;
  await waitFor200(`${origin}/health`, 10_000, child);
  return { child, origin };
}

// --- /proc ------------------------------------------------------------------------------------------------------

/** A process and its descendants (a gateway with workers: the primary and its workers). */
export function processTree(pid: number): number[] {
  const pids = [pid];
  for (let i = 0; i < pids.length; i++) {
    let tasks: string[] = [];
    try {
      tasks = readdirSync(`/proc/${pids[i]}/task`);
    } catch {
      continue; // gone meanwhile
    }
    for (const tid of tasks) {
      try {
        for (const child of readFileSync(`/proc/${pids[i]}/task/${tid}/children`, 'utf8').trim().split(/\s+/)) if (child !== '') pids.push(Number(child));
      } catch {
        // the thread ended meanwhile
      }
    }
  }
  return pids;
}

/** The user and system time in a /proc `stat` file (a process's or a thread's), in µs. */
function statCpuUs(file: string): { user: number; system: number } {
  const stat = readFileSync(file, 'utf8');
  // Fields after the command name (which may contain spaces), from field 3 (state) on: utime is field 14, stime 15.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: (Number(fields[11]) * 1e6) / CLK_TCK, system: (Number(fields[12]) * 1e6) / CLK_TCK };
}

/** utime + stime of a process (all its threads) and of its descendants still running, in µs. */
export function processCpuUs(pid: number): number {
  let us = 0;
  for (const one of processTree(pid)) {
    try {
      const { user, system } = statCpuUs(`/proc/${one}/stat`);
      us += user + system;
    } catch {
      // a descendant that ended meanwhile
    }
  }
  return us;
}

/**
 * User time of a process's main thread, µs: the thread that serves (the relay's, and `serve --workers 1`'s), without
 * the kernel's time in its system calls or V8's helper threads. The system calls cost every proxy about the same per
 * event (docs/performance.md, "Why, ranked" 2 and 4), so this is where a gateway's own work shows, undiluted.
 */
export function mainThreadUserUs(pid: number): number {
  return statCpuUs(`/proc/${pid}/task/${pid}/stat`).user;
}

/**
 * Time on CPU of every thread of a process, µs, from /proc/<pid>/task/<tid>/schedstat (nanoseconds): finer than the
 * clock ticks of /proc/<pid>/stat, for small amounts such as the CPU a proxy uses at rest.
 */
export function processRuntimeUs(pid: number): number {
  let ns = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // the thread ended meanwhile (its time is then lost: this is for small, steady amounts only)
    }
  }
  return ns / 1000;
}

/** VmRSS and VmHWM (peak RSS) of a process, its descendants' added, in KiB. */
export function processMemoryKiB(pid: number): { rss: number; hwm: number } {
  let rss = 0;
  let hwm = 0;
  for (const one of processTree(pid)) {
    let status: string;
    try {
      status = readFileSync(`/proc/${one}/status`, 'utf8');
    } catch {
      continue;
    }
    const field = (name: string) => {
      const match = new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status);
      return match === null ? Number.NaN : Number(match[1]);
    };
    rss += field('VmRSS');
    hwm += field('VmHWM');
  }
  return { rss, hwm };
}

/** Busy and total time of each CPU, µs (from /proc/stat). */
export function coreTimes(): { busyUs: number; totalUs: number }[] {
  const cores: { busyUs: number; totalUs: number }[] = [];
  for (const line of readFileSync('/proc/stat', 'utf8').split('\n')) {
    const match = /^cpu(\d+)\s+(.*)$/.exec(line);
    if (match === null) continue;
    const values = (match[2] as string).split(/\s+/).map(Number);
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user.
    const total = values.slice(0, 8).reduce((a, b) => a + b, 0);
    const idle = (values[3] ?? 0) + (values[4] ?? 0);
    cores[Number(match[1])] = { busyUs: ((total - idle) * 1e6) / CLK_TCK, totalUs: (total * 1e6) / CLK_TCK };
  }
  return cores;
}

/** Pins the calling process (every thread) to `core`. */
export function pinSelf(core: number): void {
  execFileSync('taskset', ['-a', '-p', '-c', String(core), String(process.pid)], { stdio: 'ignore' });
}

/**
 * Lets every thread of `pid` but the main one run on `cores` (e.g. "0,1"). For CPU profiling: V8's sampler thread
 * pinned to the same core as a busy main thread gets to run mostly when the main thread is idle, which biases the
 * samples toward idle time; on another core it interrupts the main thread on time.
 */
export function unpinHelperThreads(pid: number, cores: string): number {
  let moved = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    if (tid === String(pid)) continue;
    try {
      execFileSync('taskset', ['-p', '-c', cores, tid], { stdio: 'ignore' });
      moved++;
    } catch {
      // the thread ended meanwhile
    }
  }
  return moved;
}

/** Which cores a process may run on, as taskset prints it (e.g. "0"). */
export function affinityOf(pid: number): string {
  const out = execFileSync('taskset', ['-c', '-p', String(pid)], { encoding: 'utf8' });
  return out.slice(out.lastIndexOf(':') + 1).trim();
}
