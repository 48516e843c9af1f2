/**
 * What Waybill costs: the same fixed streaming workload straight to the simulated vLLM and through Waybill (and,
 * when nginx is installed, through nginx as a plain streaming reverse proxy that parses nothing), in one run.
 *
 *   npm run bench                                   (= npm run build && node dist/bench/proxy.js)
 *   node dist/bench/proxy.js --seconds 2 --repeats 1 --scenarios c64,max
 *   node dist/bench/proxy.js --profile --scenarios none      (CPU profiles of the gateway only)
 *
 * Pinning (2 cores): the proxy under test (Waybill or nginx) alone on core 0; the simulator and this process (the
 * load client) on core 1. docs/performance.md explains the method and holds the figures of a full run.
 */
import { mkdtempSync, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { execFileSync, spawnSync } from 'node:child_process';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { performance } from 'node:perf_hooks';
import { runLoad, type WindowResult } from './proxy/client.js';
import {
  affinityOf,
  coreTimes,
  killAll,
  pinSelf,
  processCpuUs,
  processMemoryKiB,
  processRuntimeUs,
  startGateway,
  startNginx,
  startSim,
  unpinHelperThreads,
  type Child,
} from './proxy/procs.js';
import { perEvent, perfAvailable, startPerf } from './proxy/perf.js';
import { formatProfile, summariseProfile, type ProfileSummary } from './proxy/profile.js';
import { distribution, median, type Distribution } from './proxy/stats.js';

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BIN = join(REPO, 'bin', 'waybill.js');
const PROXY_CORE = 0;
const LOAD_CORE = 1;

// --- scenarios and options ---------------------------------------------------------------------------------------

interface Scenario {
  name: string;
  concurrency: number;
  itlMs: number;
  ttftMs: number;
  /** Also run the gateway with the per-request wide log line on. */
  logVariant: boolean;
  note: string;
}

const SCENARIOS: Scenario[] = [
  { name: 'c1', concurrency: 1, itlMs: 10, ttftMs: 20, logVariant: false, note: '1 stream, 10 ms inter-token delay' },
  { name: 'c64', concurrency: 64, itlMs: 10, ttftMs: 20, logVariant: true, note: '64 streams, 10 ms inter-token delay' },
  { name: 'c256', concurrency: 256, itlMs: 20, ttftMs: 20, logVariant: false, note: '256 streams, 20 ms inter-token delay' },
  { name: 'max', concurrency: 64, itlMs: 0, ttftMs: 0, logVariant: true, note: '64 streams, no delay (saturation)' },
];

/** Figures from /work/shared/docs/peer-figures.md (nginx 1.22, same method), used when nginx is not installed. */
const PEER_NGINX_US_PER_EVENT: Record<string, number> = { c64: 27.0, c256: 22.7, max: 12.7 };

interface Options {
  seconds: number;
  repeats: number;
  scenarios: Scenario[];
  outputTokens: number;
  seed: number;
  out: string;
  nginx: string | undefined;
  logVariant: boolean;
  contractVariant: boolean;
  profile: string[];
  profileDir: string | undefined;
  perf: boolean;
  minWarmupS: number;
  keep: boolean;
}

const USAGE = `usage: node dist/bench/proxy.js [options]
  --seconds N          measured window per target and repeat (default 10)
  --repeats N          repeats; medians are reported (default 2)
  --scenarios LIST     c1,c64,c256,max (default all), or none
  --tokens N           output tokens per request (default 200)
  --seed N             simulator seed (default 1)
  --warmup N           minimum warm-up seconds before each window (default 2)
  --nginx PATH|off     nginx binary (default: nginx on PATH, if any)
  --no-log-variant     skip the run with the per-request log line on
  --no-contract-variant  skip the run whose requests ask for an output contract (response_format json_object)
  --profile [LIST]     also CPU-profile the gateway under these scenarios (default c64,max)
  --profile-dir DIR    where the .cpuprofile files go (default a new /tmp directory, kept)
  --perf               with --profile: also count syscalls per event and split CPU by binary with Linux perf,
                       for Waybill and nginx (needs perf on PATH)
  --out FILE           JSON results (default bench-results.json)
  --keep               keep the temporary directory (configs, child logs)`;

function parseOptions(argv: string[]): Options {
  const options: Options = {
    seconds: 10,
    repeats: 2,
    scenarios: SCENARIOS,
    outputTokens: 200,
    seed: 1,
    out: 'bench-results.json',
    nginx: onPath('nginx'),
    logVariant: true,
    contractVariant: true,
    profile: [],
    profileDir: undefined,
    perf: false,
    minWarmupS: 2,
    keep: false,
  };
  const number = (flag: string, raw: string | undefined, min: number): number => {
    const value = Number(raw);
    if (raw === undefined || !Number.isFinite(value) || value < min) throw new UsageError(`${flag}: needs a number >= ${min}`);
    return value;
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i] as string;
    const next = () => argv[++i];
    switch (flag) {
      case '--seconds':
        options.seconds = number(flag, next(), 0.5);
        break;
      case '--repeats':
        options.repeats = Math.round(number(flag, next(), 1));
        break;
      case '--tokens':
        options.outputTokens = Math.round(number(flag, next(), 2));
        break;
      case '--seed':
        options.seed = Math.round(number(flag, next(), 0));
        break;
      case '--warmup':
        options.minWarmupS = number(flag, next(), 0);
        break;
      case '--scenarios': {
        const list = next() ?? '';
        options.scenarios = list === 'none' ? [] : list.split(',').map(scenarioNamed);
        break;
      }
      case '--nginx': {
        const path = next();
        if (path === undefined) throw new UsageError('--nginx: needs a path or "off"');
        options.nginx = path === 'off' ? undefined : path;
        break;
      }
      case '--no-log-variant':
        options.logVariant = false;
        break;
      case '--no-contract-variant':
        options.contractVariant = false;
        break;
      case '--profile': {
        const list = argv[i + 1];
        if (list !== undefined && !list.startsWith('--')) {
          i++;
          options.profile = list.split(',').map((name) => scenarioNamed(name).name);
        } else {
          options.profile = ['c64', 'max'];
        }
        break;
      }
      case '--perf':
        options.perf = true;
        break;
      case '--profile-dir':
        options.profileDir = next();
        break;
      case '--out':
        options.out = next() ?? options.out;
        break;
      case '--keep':
        options.keep = true;
        break;
      case '-h':
      case '--help':
        console.log(USAGE);
        process.exit(0);
        break;
      default:
        throw new UsageError(`unknown flag ${flag}`);
    }
  }
  return options;
}

class UsageError extends Error {}

function scenarioNamed(name: string): Scenario {
  const scenario = SCENARIOS.find((s) => s.name === name);
  if (scenario === undefined) throw new UsageError(`unknown scenario "${name}" (one of ${SCENARIOS.map((s) => s.name).join(', ')})`);
  return scenario;
}

function onPath(command: string): string | undefined {
  try {
    const found = execFileSync('sh', ['-c', `command -v ${command}`], { encoding: 'utf8' }).trim();
    return found === '' ? undefined : found;
  } catch {
    return undefined;
  }
}

// --- one measured window -----------------------------------------------------------------------------------------

interface Target {
  /** direct, waybill, waybill+log, waybill+contract, nginx */
  name: string;
  origin: string;
  /** The requests ask for an output contract (response_format json_object): the gateway assembles and checks answers. */
  contract: boolean;
  /** The proxy process (undefined for direct). */
  proxy: Child | undefined;
  /** VmRSS at rest: after start-up, or (c256) after a warm-up load and a quiet period. */
  idleRssKiB: number;
  /** c256 only: VmRSS with the scenario's streams in flight, read right after a full GC. */
  loadedGcRssKiB: number;
  /** Started with gc-hook.js (SIGUSR2 → full GC). */
  gcHook: boolean;
  /** CPU the proxy uses with no traffic, ms per second. */
  idleCpuMsPerS: number;
  /** VmRSS after start-up, before any traffic. */
  startRssKiB: number;
}

function newTarget(name: string, origin: string, proxy: Child | undefined, gcHook = false): Target {
  return { name, origin, proxy, gcHook, contract: false, idleRssKiB: Number.NaN, loadedGcRssKiB: Number.NaN, idleCpuMsPerS: Number.NaN, startRssKiB: Number.NaN };
}

interface WindowFigures {
  target: string;
  repeat: number;
  windowMs: number;
  events: number;
  eventsPerS: number;
  outputEventsPerS: number;
  /** Events per HTTP body chunk the client received (one per write of the sender, simulator or proxy): batching. */
  eventsPerRead: number;
  requestsCompleted: number;
  requestsIncomplete: number;
  errors: number;
  errorMessages: string[];
  ttftMs: Distribution;
  itlMs: Distribution;
  /** CPU of the proxy process in the window per event the client received, µs. */
  proxyUsPerEvent: number;
  /** Share of one core the proxy used in the window. */
  proxyCpuShare: number;
  simUsPerEvent: number;
  clientUsPerEvent: number;
  /** Busy share of each core, and what was not ours (other processes on the machine). */
  core0Busy: number;
  core1Busy: number;
  core0Foreign: number;
  core1Foreign: number;
  /** Proxy VmRSS during the window, KiB. */
  rssMedianKiB: number;
  rssMaxKiB: number;
  /** Bytes of gateway log written per completed request (log variant). */
  logBytesPerRequest: number;
  /** The window in CLOCK_MONOTONIC µs (to cut a CPU profile to it). */
  monoFromUs: number;
  monoToUs: number;
}

function requestBody(outputTokens: number, contract = false): Buffer {
  return Buffer.from(
    JSON.stringify({
      model: 'sim-model',
      stream: true,
      max_tokens: outputTokens,
      messages: [{ role: 'user', content: 'Benchmark prompt: tell me about waybills.' }],
      // An output contract: every event is then parsed whole and the answer assembled and checked at the end.
      ...(contract ? { response_format: { type: 'json_object' } } : {}),
    }),
  );
}

async function measure(
  scenario: Scenario,
  target: Target,
  repeat: number,
  sim: Child,
  allProxies: Child[],
  options: Options,
  hooks: { onWindowStart?: () => void; onWindowEnd?: () => void } = {},
): Promise<WindowFigures> {
  const requestMs = scenario.ttftMs + scenario.itlMs * (options.outputTokens - 1);
  const rampMs = scenario.concurrency > 1 ? Math.min(requestMs, 5000) : 0;
  const warmupMs = Math.max(options.minWarmupS * 1000, rampMs + 1000);
  const proxyPid = target.proxy?.pid;
  const cpuOf = (pid: number | undefined) => (pid === undefined ? 0 : processCpuUs(pid));
  const allCpu = () => allProxies.reduce((sum, child) => sum + processCpuUs(child.pid), 0);
  const rss: number[] = [];
  const logSize = () => (target.proxy !== undefined && target.name.includes('log') ? statSync(target.proxy.logFile).size : 0);
  let before = { proxy: 0, sim: 0, ours0: 0, cores: coreTimes(), log: 0, mono: 0 };
  let after = before;
  const read = () => ({
    proxy: cpuOf(proxyPid),
    sim: processCpuUs(sim.pid),
    ours0: allCpu(),
    cores: coreTimes(),
    log: logSize(),
    mono: Number(process.hrtime.bigint() / 1000n),
  });
  const result: WindowResult = await runLoad({
    origin: target.origin,
    path: '/v1/chat/completions',
    body: requestBody(options.outputTokens, target.contract),
    concurrency: scenario.concurrency,
    rampMs,
    warmupMs,
    windowMs: options.seconds * 1000,
    onWindowStart: () => {
      before = read();
      hooks.onWindowStart?.();
    },
    onWindowEnd: () => {
      after = read();
      hooks.onWindowEnd?.();
    },
    sampleEveryMs: 200,
    onSample: () => {
      if (proxyPid !== undefined) rss.push(processMemoryKiB(proxyPid).rss);
    },
  });
  const seconds = result.windowMs / 1000;
  const proxyUs = after.proxy - before.proxy;
  const simUs = after.sim - before.sim;
  const coreShare = (core: number) => {
    const a = after.cores[core];
    const b = before.cores[core];
    if (a === undefined || b === undefined) return Number.NaN;
    return (a.busyUs - b.busyUs) / (a.totalUs - b.totalUs);
  };
  const windowUs = result.windowMs * 1000;
  const core0Busy = coreShare(PROXY_CORE);
  const core1Busy = coreShare(LOAD_CORE);
  const events = result.events;
  const perEvent = (us: number) => (events > 0 ? us / events : Number.NaN);
  const requests = result.completed + result.incomplete;
  return {
    target: target.name,
    repeat,
    windowMs: result.windowMs,
    events,
    eventsPerS: events / seconds,
    outputEventsPerS: result.outputEvents / seconds,
    eventsPerRead: result.reads > 0 ? events / result.reads : Number.NaN,
    requestsCompleted: result.completed,
    requestsIncomplete: result.incomplete,
    errors: result.errors,
    errorMessages: result.errorMessages,
    ttftMs: distribution(result.ttft),
    itlMs: distribution(result.itl),
    proxyUsPerEvent: proxyPid === undefined ? Number.NaN : perEvent(proxyUs),
    proxyCpuShare: proxyPid === undefined ? Number.NaN : proxyUs / windowUs,
    simUsPerEvent: perEvent(simUs),
    clientUsPerEvent: perEvent(result.clientCpuUs),
    core0Busy,
    core1Busy,
    core0Foreign: Math.max(0, core0Busy - (after.ours0 - before.ours0) / windowUs),
    core1Foreign: Math.max(0, core1Busy - (simUs + result.clientCpuUs) / windowUs),
    rssMedianKiB: median(rss),
    rssMaxKiB: rss.length === 0 ? Number.NaN : Math.max(...rss),
    logBytesPerRequest: requests > 0 && after.log > before.log ? (after.log - before.log) / requests : Number.NaN,
    monoFromUs: before.mono,
    monoToUs: after.mono,
  };
}

// --- a scenario: processes up, targets measured in turn, processes down -----------------------------------------

interface TargetSummary {
  target: string;
  eventsPerS: number;
  eventsPerRead: number;
  ttftP50: number;
  ttftP99: number;
  itlP50: number;
  itlP99: number;
  proxyUsPerEvent: number;
  proxyCpuShare: number;
  simUsPerEvent: number;
  clientUsPerEvent: number;
  core0Foreign: number;
  core1Foreign: number;
  idleRssKiB: number;
  rssMedianKiB: number;
  peakRssKiB: number;
  idleCpuMsPerS: number;
  /** c256: (RSS with the streams in flight - RSS at rest) / streams, both after a full GC. */
  rssPerStreamKiB: number;
  /** c256: (median RSS during the measured windows, no forced GC - RSS after start-up) / streams. */
  rssWindowPerStreamKiB: number;
  loadedGcRssKiB: number;
  startRssKiB: number;
  errors: number;
  incomplete: number;
  completed: number;
  logBytesPerRequest: number;
}

interface ScenarioResult {
  scenario: Scenario;
  windows: WindowFigures[];
  targets: TargetSummary[];
}

const GC_HOOK = join(REPO, 'dist', 'bench', 'proxy', 'gc-hook.js');

/**
 * Before the c256 windows: the proxy's memory with the scenario's streams in flight and at rest, each read after a
 * full garbage collection (the gateway runs with gc-hook.js: SIGUSR2 → gc()), so the difference is what the streams
 * hold rather than how much garbage V8 let accumulate. Also serves as the warm-up. nginx needs no collection.
 */
async function rssProbe(scenario: Scenario, target: Target, options: Options): Promise<void> {
  const proxy = target.proxy;
  if (proxy === undefined) return;
  const collect = async () => {
    if (target.gcHook) process.kill(proxy.pid, 'SIGUSR2');
    await sleep(300);
    return processMemoryKiB(proxy.pid).rss;
  };
  const loaded: number[] = [];
  const requestMs = scenario.ttftMs + scenario.itlMs * (options.outputTokens - 1);
  const rampMs = Math.min(requestMs, 5000);
  const pending: Promise<number>[] = [];
  await runLoad({
    origin: target.origin,
    path: '/v1/chat/completions',
    body: requestBody(options.outputTokens),
    concurrency: scenario.concurrency,
    rampMs,
    warmupMs: rampMs + 1000,
    windowMs: 3500,
    sampleEveryMs: 900,
    onSample: () => {
      pending.push(collect().then((kib) => (loaded.push(kib), kib)));
    },
  });
  await Promise.all(pending);
  await sleep(1500);
  const idle: number[] = [];
  for (let i = 0; i < 3; i++) idle.push(await collect());
  target.loadedGcRssKiB = median(loaded);
  target.idleRssKiB = median(idle);
}

async function runScenario(scenario: Scenario, options: Options, dir: string): Promise<ScenarioResult> {
  const scenarioDir = join(dir, scenario.name);
  mkdirSync(scenarioDir, { recursive: true });
  const started: Child[] = [];
  try {
    const sim = await startSim(BIN, LOAD_CORE, scenarioDir, {
      itlMs: scenario.itlMs,
      ttftMs: scenario.ttftMs,
      outputTokens: options.outputTokens,
      seed: options.seed,
    });
    started.push(sim.child);
    const targets: Target[] = [newTarget('direct', sim.origin, undefined)];
    const proxies: Child[] = [];
    const addProxy = (name: string, p: { child: Child; origin: string }, gcHook = false) => {
      started.push(p.child);
      proxies.push(p.child);
      targets.push(newTarget(name, p.origin, p.child, gcHook));
    };
    // The c256 gateway can be asked for a full GC before its RSS is read (see rssProbe).
    const gcHook = scenario.name === 'c256';
    const gatewayFlags = gcHook ? ['--expose-gc', '--import', pathToFileURL(GC_HOOK).href] : [];
    addProxy(
      'waybill',
      await startGateway(BIN, PROXY_CORE, scenarioDir, { name: 'waybill', upstream: sim.origin, requestLogs: false, nodeFlags: gatewayFlags }),
      gcHook,
    );
    if (options.nginx !== undefined) addProxy('nginx', await startNginx(options.nginx, PROXY_CORE, scenarioDir, sim.origin));
    if (scenario.logVariant && options.contractVariant) {
      // The same gateway process as `waybill`, measured in its own windows with contract-bearing requests.
      const plain = targets.find((t) => t.name === 'waybill') as Target;
      targets.push({ ...newTarget('waybill+contract', plain.origin, plain.proxy), contract: true });
    }
    if (scenario.logVariant && options.logVariant) {
      addProxy('waybill+log', await startGateway(BIN, PROXY_CORE, scenarioDir, { name: 'waybill-log', upstream: sim.origin, requestLogs: true }));
    }
    for (const child of [sim.child, ...proxies]) {
      const want = child === sim.child ? String(LOAD_CORE) : String(PROXY_CORE);
      const got = affinityOf(child.pid);
      if (got !== want) throw new Error(`${child.name} (pid ${child.pid}) runs on cores ${got}, expected ${want}`);
    }
    // At rest: RSS after start-up, and CPU with no traffic (timers, health checks) over 2 s.
    await sleep(500);
    const idleBefore = proxies.map((child) => processRuntimeUs(child.pid));
    const idleStart = performance.now();
    await sleep(2000);
    const idleSeconds = (performance.now() - idleStart) / 1000;
    for (const target of targets) {
      if (target.proxy === undefined) continue;
      const index = proxies.indexOf(target.proxy);
      target.idleCpuMsPerS = (processRuntimeUs(target.proxy.pid) - (idleBefore[index] as number)) / 1000 / idleSeconds;
      target.startRssKiB = processMemoryKiB(target.proxy.pid).rss;
      target.idleRssKiB = target.startRssKiB;
    }
    if (scenario.name === 'c256') {
      for (const target of targets) {
        if (target.proxy === undefined || target.name.includes('log')) continue;
        await rssProbe(scenario, target, options);
        console.log(
          `  ${scenario.name} RSS probe ${target.name}${target.gcHook ? ' (after a full GC)' : ''}: ` +
            `${scenario.concurrency} streams ${mib(target.loadedGcRssKiB)} MiB, at rest ${mib(target.idleRssKiB)} MiB (after start-up ${mib(target.startRssKiB)} MiB)`,
        );
      }
    }

    const windows: WindowFigures[] = [];
    for (let repeat = 1; repeat <= options.repeats; repeat++) {
      for (const target of targets) {
        const figures = await measure(scenario, target, repeat, sim.child, proxies, options);
        windows.push(figures);
        console.log(`  ${scenario.name} #${repeat} ${target.name.padEnd(11)} ${brief(figures)}`);
        await sleep(300);
      }
    }
    const summaries = targets.map((target) => summarise(scenario, target, windows.filter((w) => w.target === target.name)));
    return { scenario, windows, targets: summaries };
  } finally {
    await Promise.all(started.map((child) => child.stop()));
  }
}

function summarise(scenario: Scenario, target: Target, windows: WindowFigures[]): TargetSummary {
  const med = (pick: (w: WindowFigures) => number) => median(windows.map(pick));
  const rssMedian = med((w) => w.rssMedianKiB);
  const peak = target.proxy !== undefined && target.proxy.process.exitCode === null ? processMemoryKiB(target.proxy.pid).hwm : Number.NaN;
  return {
    target: target.name,
    eventsPerS: med((w) => w.eventsPerS),
    eventsPerRead: med((w) => w.eventsPerRead),
    ttftP50: med((w) => w.ttftMs.p50),
    ttftP99: med((w) => w.ttftMs.p99),
    itlP50: med((w) => w.itlMs.p50),
    itlP99: med((w) => w.itlMs.p99),
    proxyUsPerEvent: med((w) => w.proxyUsPerEvent),
    proxyCpuShare: med((w) => w.proxyCpuShare),
    simUsPerEvent: med((w) => w.simUsPerEvent),
    clientUsPerEvent: med((w) => w.clientUsPerEvent),
    core0Foreign: med((w) => w.core0Foreign),
    core1Foreign: med((w) => w.core1Foreign),
    idleRssKiB: target.idleRssKiB,
    rssMedianKiB: rssMedian,
    peakRssKiB: peak,
    idleCpuMsPerS: target.idleCpuMsPerS,
    rssPerStreamKiB: (target.loadedGcRssKiB - target.idleRssKiB) / scenario.concurrency,
    rssWindowPerStreamKiB: (rssMedian - target.startRssKiB) / scenario.concurrency,
    loadedGcRssKiB: target.loadedGcRssKiB,
    startRssKiB: target.startRssKiB,
    errors: windows.reduce((sum, w) => sum + w.errors, 0),
    incomplete: windows.reduce((sum, w) => sum + w.requestsIncomplete, 0),
    completed: windows.reduce((sum, w) => sum + w.requestsCompleted, 0),
    logBytesPerRequest: med((w) => w.logBytesPerRequest),
  };
}

// --- profiling ------------------------------------------------------------------------------------------------

interface PerfResult {
  scenario: string;
  proxy: string;
  usPerEvent: number;
  perEvent: Record<string, number>;
  cpuByBinary: Record<string, number>;
}

/** One window per proxy under `perf stat` (syscalls) and `perf record` (CPU by binary). */
async function perfScenario(scenario: Scenario, options: Options, dir: string, sim: { child: Child; origin: string }): Promise<PerfResult[]> {
  const results: PerfResult[] = [];
  const proxies: { name: string; start: () => Promise<{ child: Child; origin: string }> }[] = [
    {
      name: 'waybill',
      // --perf-basic-prof: names JIT-compiled functions for perf (a /tmp/perf-PID.map file, removed below).
      start: () => startGateway(BIN, PROXY_CORE, dir, { name: 'waybill-perf', upstream: sim.origin, requestLogs: false, nodeFlags: ['--perf-basic-prof'] }),
    },
  ];
  const nginxBin = options.nginx;
  if (nginxBin !== undefined) proxies.push({ name: 'nginx', start: () => startNginx(nginxBin, PROXY_CORE, dir, sim.origin) });
  for (const proxy of proxies) {
    const started = await proxy.start();
    try {
      const target = newTarget(`${proxy.name} (perf)`, started.origin, started.child);
      let perf: ReturnType<typeof startPerf> | undefined;
      const figures = await measure(scenario, target, 1, sim.child, [started.child], options, {
        onWindowStart: () => {
          perf = startPerf(started.child.pid, join(dir, `perf-${proxy.name}.data`));
        },
        onWindowEnd: () => {
          void perf?.window.stop();
        },
      });
      await perf?.window.stop();
      const measured = perf?.result();
      if (measured === undefined) continue;
      results.push({
        scenario: scenario.name,
        proxy: proxy.name,
        usPerEvent: figures.proxyUsPerEvent,
        perEvent: perEvent(measured.counts, figures.events),
        cpuByBinary: measured.dso,
      });
    } finally {
      await started.child.stop(10_000);
      rmSync(`/tmp/perf-${started.child.pid}.map`, { force: true });
    }
  }
  return results;
}

async function profileScenario(
  scenario: Scenario,
  options: Options,
  dir: string,
  profileDir: string,
): Promise<{ summary: ProfileSummary; perf: PerfResult[] }> {
  const scenarioDir = join(dir, `profile-${scenario.name}`);
  mkdirSync(scenarioDir, { recursive: true });
  const outDir = join(profileDir, scenario.name);
  mkdirSync(outDir, { recursive: true });
  const existing = new Set(readdirSync(outDir));
  let window: { fromUs: number; toUs: number } | undefined;
  let cpuShare = Number.NaN;
  let perf: PerfResult[] = [];
  const sim = await startSim(BIN, LOAD_CORE, scenarioDir, {
    itlMs: scenario.itlMs,
    ttftMs: scenario.ttftMs,
    outputTokens: options.outputTokens,
    seed: options.seed,
  });
  try {
    const gateway = await startGateway(BIN, PROXY_CORE, scenarioDir, {
      name: 'waybill-profiled',
      upstream: sim.origin,
      requestLogs: false,
      nodeFlags: ['--cpu-prof', '--cpu-prof-dir', outDir, '--cpu-prof-interval', '500'],
    });
    // The main thread stays alone on core 0; the sampler (and V8's helper threads) may use either core.
    unpinHelperThreads(gateway.child.pid, `${PROXY_CORE},${LOAD_CORE}`);
    const target = newTarget('waybill (profiled)', gateway.origin, gateway.child);
    const figures = await measure(scenario, target, 1, sim.child, [gateway.child], options);
    window = { fromUs: figures.monoFromUs, toUs: figures.monoToUs };
    cpuShare = figures.proxyCpuShare;
    console.log(`  profile ${scenario.name} ${brief(figures)}`);
    // SIGTERM: drains (grace 0, drain timeout 1 s) and exits, which writes the profile.
    await gateway.child.stop(10_000);
    if (options.perf) perf = await perfScenario(scenario, options, scenarioDir, sim);
  } finally {
    await sim.child.stop();
  }
  const written = readdirSync(outDir).filter((f) => f.endsWith('.cpuprofile') && !existing.has(f));
  if (written.length === 0) throw new Error(`no .cpuprofile written in ${outDir}`);
  // Only the measured window: no start-up (module loading), warm-up or shutdown.
  const summary = summariseProfile(join(outDir, written[0] as string), 25, window);
  summary.processCpuShare = cpuShare;
  return { summary, perf };
}

function formatPerf(results: PerfResult[]): string {
  const lines: string[] = [];
  for (const r of results) {
    const e = r.perEvent;
    const binaries = Object.entries(r.cpuByBinary)
      .filter(([, share]) => share >= 0.005)
      .sort((a, b) => b[1] - a[1])
      .map(([name, share]) => `${name} ${Math.round(share * 100)}%`)
      .join(', ');
    lines.push(
      `  perf ${r.scenario} ${r.proxy}: ${f1(r.usPerEvent)} µs/event; per event ${f2(e['syscalls'] ?? Number.NaN)} syscalls ` +
        `(${f2(e['reads'] ?? Number.NaN)} reads, ${f2(e['writes'] ?? Number.NaN)} writes, ${f2(e['epollWaits'] ?? Number.NaN)} epoll waits), ` +
        `${f2(e['contextSwitches'] ?? Number.NaN)} context switches; CPU by binary: ${binaries}`,
    );
  }
  return lines.join('\n');
}

// --- output ---------------------------------------------------------------------------------------------------

const f1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : '–');
const f2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : '–');
const signed = (x: number, digits = 2) => (Number.isFinite(x) ? `${x >= 0 ? '+' : ''}${x.toFixed(digits)}` : '–');
const pct = (x: number) => (Number.isFinite(x) ? `${Math.round(x * 100)}%` : '–');
const mib = (kib: number) => (Number.isFinite(kib) ? (kib / 1024).toFixed(0) : '–');

function brief(w: WindowFigures): string {
  return (
    `${Math.round(w.eventsPerS)} ev/s (${f1(w.eventsPerRead)}/chunk), TTFT p50 ${f2(w.ttftMs.p50)} p99 ${f2(w.ttftMs.p99)} ms, ITL p99 ${f2(w.itlMs.p99)} ms` +
    (Number.isFinite(w.proxyUsPerEvent) ? `, proxy ${f1(w.proxyUsPerEvent)} µs/ev (${pct(w.proxyCpuShare)} of core 0)` : '') +
    `, other load core0 ${pct(w.core0Foreign)} core1 ${pct(w.core1Foreign)}` +
    (w.errors + w.requestsIncomplete > 0 ? `, ${w.errors} errors ${w.requestsIncomplete} incomplete ${w.errorMessages.join('; ')}` : '')
  );
}

function table(rows: string[][]): string {
  const widths = (rows[0] as string[]).map((_, c) => Math.max(...rows.map((r) => (r[c] ?? '').length)));
  return rows.map((r) => r.map((cell, c) => (c === 0 || c === 1 ? cell.padEnd(widths[c] as number) : cell.padStart(widths[c] as number))).join('  ')).join('\n');
}

interface Comparison {
  scenario: string;
  proxy: string;
  addedTtftP50Ms: number;
  addedTtftP99Ms: number;
  addedItlP99Ms: number;
  throughputRatio: number;
  usPerEvent: number;
  nginxUsPerEvent: number;
  nginxSource: 'this run' | 'peer-figures.md' | 'none';
  vsNginx: number;
  rssPerStreamKiB: number;
  rssWindowPerStreamKiB: number;
  peakRssMiB: number;
}

function compare(results: ScenarioResult[]): Comparison[] {
  const rows: Comparison[] = [];
  for (const result of results) {
    const direct = result.targets.find((t) => t.target === 'direct');
    const nginx = result.targets.find((t) => t.target === 'nginx');
    if (direct === undefined) continue;
    const peer = PEER_NGINX_US_PER_EVENT[result.scenario.name];
    const nginxUs = nginx?.proxyUsPerEvent ?? peer ?? Number.NaN;
    const nginxSource = nginx !== undefined ? 'this run' : peer !== undefined ? 'peer-figures.md' : 'none';
    for (const t of result.targets) {
      if (t.target === 'direct') continue;
      rows.push({
        scenario: result.scenario.name,
        proxy: t.target,
        addedTtftP50Ms: t.ttftP50 - direct.ttftP50,
        addedTtftP99Ms: t.ttftP99 - direct.ttftP99,
        addedItlP99Ms: t.itlP99 - direct.itlP99,
        throughputRatio: t.eventsPerS / direct.eventsPerS,
        usPerEvent: t.proxyUsPerEvent,
        nginxUsPerEvent: nginxUs,
        nginxSource,
        vsNginx: t.proxyUsPerEvent / nginxUs,
        rssPerStreamKiB: result.scenario.name === 'c256' ? t.rssPerStreamKiB : Number.NaN,
        rssWindowPerStreamKiB: result.scenario.name === 'c256' ? t.rssWindowPerStreamKiB : Number.NaN,
        peakRssMiB: t.peakRssKiB / 1024,
      });
    }
  }
  return rows;
}

interface TargetCheck {
  target: string;
  measured: string;
  met: boolean | undefined;
}

function checkTargets(comparisons: Comparison[]): TargetCheck[] {
  const waybill = (scenario: string) => comparisons.find((c) => c.scenario === scenario && c.proxy === 'waybill');
  const checks: TargetCheck[] = [];
  const c64 = waybill('c64');
  if (c64 !== undefined) {
    checks.push({ target: 'added TTFT p50 <= 1 ms at c64', measured: `${signed(c64.addedTtftP50Ms)} ms`, met: c64.addedTtftP50Ms <= 1 });
    checks.push({ target: 'added TTFT p99 <= 5 ms at c64', measured: `${signed(c64.addedTtftP99Ms)} ms`, met: c64.addedTtftP99Ms <= 5 });
  }
  for (const name of ['c64', 'max']) {
    const c = waybill(name);
    if (c === undefined) continue;
    checks.push({
      target: `CPU/event <= 1.5x nginx at ${name}`,
      measured: `${f1(c.usPerEvent)} vs nginx ${f1(c.nginxUsPerEvent)} µs/ev (${c.nginxSource}) = ${f2(c.vsNginx)}x`,
      met: Number.isFinite(c.vsNginx) ? c.vsNginx <= 1.5 : undefined,
    });
  }
  const c256 = waybill('c256');
  if (c256 !== undefined) {
    checks.push({
      target: 'RSS <= 100 KiB per in-flight stream at c256',
      measured: `${f1(c256.rssPerStreamKiB)} KiB (after full GCs; without forcing GC: ${f1(c256.rssWindowPerStreamKiB)} KiB)`,
      met: c256.rssPerStreamKiB <= 100,
    });
  }
  return checks;
}

function printReport(results: ScenarioResult[], comparisons: Comparison[], checks: TargetCheck[]): void {
  const raw: string[][] = [
    ['scenario', 'target', 'events/s', 'ev/chunk', 'TTFT p50', 'TTFT p99', 'ITL p50', 'ITL p99', 'proxy µs/ev', 'proxy CPU', 'idle ms/s', 'sim µs/ev', 'client µs/ev', 'RSS MiB', 'other load c0/c1', 'errors'],
  ];
  for (const result of results) {
    for (const t of result.targets) {
      raw.push([
        result.scenario.name,
        t.target,
        String(Math.round(t.eventsPerS)),
        f2(t.eventsPerRead),
        f2(t.ttftP50),
        f2(t.ttftP99),
        f2(t.itlP50),
        f2(t.itlP99),
        f1(t.proxyUsPerEvent),
        pct(t.proxyCpuShare),
        f1(t.idleCpuMsPerS),
        f1(t.simUsPerEvent),
        f1(t.clientUsPerEvent),
        mib(t.rssMedianKiB),
        `${pct(t.core0Foreign)}/${pct(t.core1Foreign)}`,
        String(t.errors + t.incomplete),
      ]);
    }
  }
  console.log('\nPer target (medians over repeats; latencies in ms, measured by the client):');
  console.log(table(raw));

  const rows: string[][] = [
    ['scenario', 'proxy', '+TTFT p50', '+TTFT p99', '+ITL p99', 'throughput', 'CPU µs/event', 'x nginx', 'RSS/stream KiB', 'no-GC KiB', 'peak RSS MiB'],
  ];
  for (const c of comparisons) {
    rows.push([
      c.scenario,
      c.proxy,
      signed(c.addedTtftP50Ms),
      signed(c.addedTtftP99Ms),
      signed(c.addedItlP99Ms),
      `${f2(c.throughputRatio)}x`,
      f1(c.usPerEvent),
      c.proxy === 'nginx' ? '' : `${f2(c.vsNginx)}${c.nginxSource === 'peer-figures.md' ? '*' : ''}`,
      f1(c.rssPerStreamKiB),
      f1(c.rssWindowPerStreamKiB),
      f1(c.peakRssMiB),
    ]);
  }
  console.log('\nAgainst the direct run (added ms; throughput = events/s through the proxy / direct):');
  console.log(table(rows));
  if (comparisons.some((c) => c.nginxSource === 'peer-figures.md')) console.log('* nginx not run here: ratio to the nginx figure in peer-figures.md');
  console.log(
    'RSS/stream (c256): (VmRSS with 256 streams in flight - VmRSS at rest) / 256, both read after a full GC; no-GC: ' +
      '(median VmRSS during the measured windows - VmRSS after start-up) / 256. Peak: VmHWM at the end of the scenario.',
  );
  const logged = results.flatMap((r) => r.targets.filter((t) => t.target === 'waybill+log').map((t) => ({ scenario: r.scenario.name, t })));
  for (const { scenario, t } of logged) {
    const plain = results.find((r) => r.scenario.name === scenario)?.targets.find((x) => x.target === 'waybill');
    if (plain === undefined) continue;
    const perEventDelta = t.proxyUsPerEvent - plain.proxyUsPerEvent;
    console.log(
      `wide log line at ${scenario}: ${signed(perEventDelta, 1)} µs/event (${f1(t.proxyUsPerEvent)} vs ${f1(plain.proxyUsPerEvent)}), ` +
        `${Math.round(t.logBytesPerRequest)} bytes of log per request`,
    );
  }
  const contracted = results.flatMap((r) => r.targets.filter((t) => t.target === 'waybill+contract').map((t) => ({ scenario: r.scenario.name, t })));
  for (const { scenario, t } of contracted) {
    const plain = results.find((r) => r.scenario.name === scenario)?.targets.find((x) => x.target === 'waybill');
    if (plain === undefined) continue;
    console.log(
      `output contract (response_format json_object) at ${scenario}: ${signed(t.proxyUsPerEvent - plain.proxyUsPerEvent, 1)} µs/event ` +
        `(${f1(t.proxyUsPerEvent)} vs ${f1(plain.proxyUsPerEvent)} without a contract)`,
    );
  }
  console.log('\nTargets (issue 5):');
  for (const check of checks) {
    const verdict = check.met === undefined ? 'n/a ' : check.met ? 'MET ' : 'MISS';
    console.log(`  ${verdict}  ${check.target}: ${check.measured}`);
  }
}

// --- main -------------------------------------------------------------------------------------------------------

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function gitState(): { commit: string; dirtySrc: boolean } {
  try {
    const commit = execFileSync('git', ['-C', REPO, 'rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['-C', REPO, 'status', '--porcelain', '--', 'src'], { encoding: 'utf8' }).trim() !== '';
    return { commit, dirtySrc: dirty };
  } catch {
    return { commit: 'unknown', dirtySrc: false };
  }
}

function nginxVersion(bin: string | undefined): string | undefined {
  if (bin === undefined) return undefined;
  // nginx -v prints to stderr.
  const result = spawnSync(bin, ['-v'], { encoding: 'utf8' });
  const text = `${result.stdout ?? ''}${result.stderr ?? ''}`.trim();
  return text === '' ? undefined : text.replace(/^nginx version:\s*/, '');
}

async function main(argv: string[]): Promise<number> {
  let options: Options;
  try {
    options = parseOptions(argv);
  } catch (error) {
    if (error instanceof UsageError) {
      console.error(`${error.message}\n\n${USAGE}`);
      return 2;
    }
    throw error;
  }
  if (cpus().length < 2) {
    console.error('needs at least 2 cores (the proxy on core 0, the simulator and the client on core 1)');
    return 2;
  }
  pinSelf(LOAD_CORE);
  const dir = mkdtempSync(join(tmpdir(), 'waybill-bench-'));
  const startedAt = new Date();
  const git = gitState();
  const nginx = nginxVersion(options.nginx);
  const loadBefore = loadavg();
  console.log(`Waybill proxy benchmark — ${startedAt.toISOString()}, node ${process.version}, ${cpus().length} cores (${cpus()[0]?.model ?? '?'})`);
  console.log(
    `pinning: the proxy under test (Waybill${options.nginx !== undefined ? ', nginx' : ''}) alone on core ${PROXY_CORE}; ` +
      `the simulator and this load client (pid ${process.pid}) on core ${LOAD_CORE} (taskset)`,
  );
  console.log(
    `workload: closed loop, chat completions streamed, ${options.outputTokens} output tokens each (1 per event), simulator jitter 0, seed ${options.seed}; ` +
      `${options.seconds} s windows after a warm-up, ${options.repeats} repeat(s), medians reported`,
  );
  console.log(`nginx: ${nginx ?? 'not found (figures compared with peer-figures.md instead)'}; load average ${loadBefore.map((l) => l.toFixed(2)).join(' ')}`);
  if (git.dirtySrc) console.log(`note: src/ has uncommitted changes (HEAD ${git.commit.slice(0, 10)})`);

  const results: ScenarioResult[] = [];
  for (const scenario of options.scenarios) {
    console.log(`\n${scenario.name}: ${scenario.note} (TTFT ${scenario.ttftMs} ms)`);
    results.push(await runScenario(scenario, options, dir));
  }
  const comparisons = compare(results);
  const checks = checkTargets(comparisons);
  if (results.length > 0) printReport(results, comparisons, checks);

  const profiles: ProfileSummary[] = [];
  const perfResults: PerfResult[] = [];
  let profileDir: string | undefined;
  if (options.perf && !perfAvailable()) {
    console.log('\n--perf: perf is not on PATH or cannot read syscall tracepoints; skipped');
    options.perf = false;
  }
  if (options.profile.length > 0) {
    profileDir = options.profileDir ?? mkdtempSync(join(tmpdir(), 'waybill-cpuprof-'));
    for (const name of options.profile) {
      console.log(`\nprofiling the gateway under ${name} (node --cpu-prof, 500 µs sampling${options.perf ? '; then perf' : ''})`);
      const { summary, perf } = await profileScenario(scenarioNamed(name), options, dir, profileDir);
      profiles.push(summary);
      perfResults.push(...perf);
      console.log(formatProfile(summary, 20));
      if (perf.length > 0) console.log(formatPerf(perf));
    }
  }

  const loadAfter = loadavg();
  const report = {
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    git,
    node: process.version,
    cpu: cpus()[0]?.model,
    cores: cpus().length,
    nginx: nginx ?? null,
    pinning: { proxy: PROXY_CORE, simulatorAndClient: LOAD_CORE },
    loadAverage: { before: loadBefore, after: loadAfter },
    options: { ...options, scenarios: options.scenarios.map((s) => s.name) },
    scenarios: results.map((r) => ({ ...r.scenario, targets: r.targets, windows: r.windows })),
    comparisons,
    targets: checks,
    profiles,
    perf: perfResults,
    profileDir: profileDir ?? null,
  };
  if (results.length > 0 || profiles.length > 0) {
    writeFileSync(options.out, `${JSON.stringify(report, (_k, v: unknown) => (typeof v === 'number' && !Number.isFinite(v) ? null : v), 2)}\n`);
    console.log(`\nresults: ${resolve(options.out)}${profileDir !== undefined ? `; profiles: ${profileDir}` : ''}`);
  }
  console.log(`load average after: ${loadAfter.map((l) => l.toFixed(2)).join(' ')}`);
  if (options.keep) console.log(`kept: ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
  return 0;
}

const invokedPath = process.argv[1];
if (invokedPath !== undefined && import.meta.url === pathToFileURL(invokedPath).href) {
  main(process.argv.slice(2)).then(
    (code) => {
      killAll();
      process.exit(code);
    },
    (error: unknown) => {
      console.error(error instanceof Error ? (error.stack ?? error.message) : error);
      killAll();
      process.exit(1);
    },
  );
}
