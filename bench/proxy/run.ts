/**
 * One scenario: the simulator and every proxy row started (each pinned to its core), their memory and CPU at rest
 * read, the targets measured in turn for each repeat, the processes stopped; and the medians per target.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { performance } from 'node:perf_hooks';
import { runLoad } from './client.js';
import { brief, mib } from './format.js';
import { BIN, FLOOR, GC_HOOK, LOAD_CORE, PROXY_CORE, sleep } from './layout.js';
import { measure, newTarget, type Target, type WindowFigures } from './measure.js';
import { tokensOf, type Options } from './options.js';
import { affinityOf, freePort, processMemoryKiB, processRuntimeUs, startFloor, startGateway, startNginx, startSim, type Child } from './procs.js';
import { requestBody, type Scenario, type Variant } from './scenarios.js';
import { median } from './stats.js';

export interface TargetSummary {
  target: string;
  eventsPerS: number;
  requestsPerS: number;
  eventsPerRead: number;
  ttftP50: number;
  ttftP99: number;
  itlP50: number;
  itlP99: number;
  proxyUsPerEvent: number;
  proxyUsPerRequest: number;
  proxyCpuShare: number;
  simUsPerEvent: number;
  clientUsPerEvent: number;
  core0Foreign: number;
  core1Foreign: number;
  idleRssKiB: number;
  rssMedianKiB: number;
  peakRssKiB: number;
  idleCpuMsPerS: number;
  /** c256, c256s: (RSS with the streams in flight - RSS at rest) / streams, both after a full GC. */
  rssPerStreamKiB: number;
  /** c256, c256s: (median RSS during the measured windows, no forced GC - RSS after start-up) / streams. */
  rssWindowPerStreamKiB: number;
  loadedGcRssKiB: number;
  startRssKiB: number;
  errors: number;
  incomplete: number;
  completed: number;
  logBytesPerRequest: number;
}

export interface ScenarioResult {
  scenario: Scenario;
  windows: WindowFigures[];
  targets: TargetSummary[];
}

/**
 * Before the c256 and c256s windows: the proxy's memory with the scenario's streams in flight and at rest, each read after a
 * full garbage collection (the gateway runs with gc-hook.js: SIGUSR2 → gc()), so the difference is what the streams
 * hold rather than how much garbage V8 let accumulate. Also serves as the warm-up. nginx needs no collection.
 */
export async function rssProbe(scenario: Scenario, target: Target, options: Options): Promise<void> {
  const proxy = target.proxy;
  if (proxy === undefined) return;
  const collect = async () => {
    if (target.gcHook) process.kill(proxy.pid, 'SIGUSR2');
    await sleep(300);
    return processMemoryKiB(proxy.pid).rss;
  };
  const loaded: number[] = [];
  const tokens = tokensOf(scenario, options);
  const requestMs = scenario.ttftMs + scenario.itlMs * (tokens - 1);
  const rampMs = Math.min(requestMs, 5000);
  const pending: Promise<number>[] = [];
  await runLoad({
    origin: target.origin,
    path: '/v1/chat/completions',
    body: requestBody(tokens),
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

export async function runScenario(scenario: Scenario, options: Options, dir: string): Promise<ScenarioResult> {
  const scenarioDir = join(dir, scenario.name);
  mkdirSync(scenarioDir, { recursive: true });
  const started: Child[] = [];
  try {
    const sim = await startSim(BIN, LOAD_CORE, scenarioDir, {
      itlMs: scenario.itlMs,
      ttftMs: scenario.ttftMs,
      outputTokens: tokensOf(scenario, options),
      seed: options.seed,
    });
    started.push(sim.child);
    const targets: Target[] = [newTarget('direct', sim.origin, undefined)];
    const proxies: Child[] = [];
    const addProxy = (name: string, p: { child: Child; origin: string }, gcHook = false, logsRequests = false) => {
      started.push(p.child);
      proxies.push(p.child);
      targets.push(newTarget(name, p.origin, p.child, gcHook, logsRequests));
    };
    // The probed gateway can be asked for a full GC before its RSS is read (see rssProbe).
    const gcHook = scenario.rssProbe;
    const gatewayFlags = gcHook ? ['--expose-gc', '--import', pathToFileURL(GC_HOOK).href] : [];
    addProxy(
      'waybill',
      await startGateway(BIN, PROXY_CORE, scenarioDir, { name: 'waybill', upstream: sim.origin, logging: 'default', nodeFlags: gatewayFlags }),
      gcHook,
      true,
    );
    if (options.nginx !== undefined) addProxy('nginx', await startNginx(options.nginx, PROXY_CORE, scenarioDir, sim.origin));
    if (options.floor) addProxy('node-floor', await startFloor(FLOOR, PROXY_CORE, scenarioDir, sim.origin));
    const has = (variant: Variant) => scenario.variants.includes(variant);
    if (has('lean') && options.lean) {
      addProxy('waybill-lean', await startGateway(BIN, PROXY_CORE, scenarioDir, { name: 'waybill-lean', upstream: sim.origin, logging: 'lean' }));
    }
    if (has('otel') && options.otel) {
      // A collector that is down: a port that was free a moment ago and that nothing listens on (connection refused).
      const otlpEndpoint = `http://127.0.0.1:${await freePort()}`;
      addProxy(
        'waybill+otel',
        await startGateway(BIN, PROXY_CORE, scenarioDir, { name: 'waybill-otel', upstream: sim.origin, logging: 'default', otlpEndpoint }),
        false,
        true,
      );
    }
    if (has('workers') && options.workers) {
      // Two workers and their primary, all on the proxy's core: the CPU of the whole process tree per event, against
      // one worker's (a second core would add throughput, not lower the cost per event).
      addProxy('waybill-2w', await startGateway(BIN, PROXY_CORE, scenarioDir, { name: 'waybill-2w', upstream: sim.origin, logging: 'default', workers: 2 }), false, true);
    }
    if (has('turnsOff') && options.turnsOff) {
      // The default configuration with the read turns off: answering streams never yield (src/proxy/read-turns.ts).
      addProxy(
        'waybill-turns-off',
        await startGateway(BIN, PROXY_CORE, scenarioDir, { name: 'waybill-turns-off', upstream: sim.origin, logging: 'default', turnBudget: '0ms' }),
        false,
        true,
      );
    }
    for (const variant of options.variants) {
      const name = `waybill-${variant.name}`;
      addProxy(name, await startGateway(BIN, PROXY_CORE, scenarioDir, { name, upstream: sim.origin, logging: 'default', extra: variant.config }), false, true);
    }
    if (has('contract') && options.contractVariant) {
      // The same gateway process as `waybill`, measured in its own windows with contract-bearing requests.
      const plain = targets.find((t) => t.name === 'waybill') as Target;
      targets.push({ ...newTarget('waybill+contract', plain.origin, plain.proxy, false, true), contract: true });
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
    if (scenario.rssProbe) {
      for (const target of targets) {
        if (target.name !== 'waybill' && target.name !== 'nginx') continue;
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
        console.log(`  ${scenario.name} #${repeat} ${target.name.padEnd(18)} ${brief(figures, scenario.stream)}`);
        await sleep(300);
      }
    }
    // A row labelled turns-off must have run with the turns off, and the default one with them on (at saturation).
    for (const target of targets) {
      if (target.name !== 'waybill-turns-off' && !(target.name === 'waybill' && has('turnsOff'))) continue;
      const yields = await metricOf(target.origin, 'waybill_turn_yields_total');
      const ok = target.name === 'waybill-turns-off' ? yields === 0 : yields > 0;
      if (!ok) console.log(`  WARNING: ${target.name} at ${scenario.name}: waybill_turn_yields_total ${yields}, expected ${target.name === 'waybill' ? '> 0' : '0'}`);
    }
    const summaries = targets.map((target) => summarise(scenario, target, windows.filter((w) => w.target === target.name)));
    return { scenario, windows, targets: summaries };
  } finally {
    await Promise.all(started.map((child) => child.stop()));
  }
}

/** One unlabelled series of a gateway's /metrics (NaN when unreadable). */
export async function metricOf(origin: string, name: string): Promise<number> {
  try {
    // A gateway that stopped answering must not hang the bench: its figure is unreadable.
    const text = await (await fetch(`${origin}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
    const line = text.split('\n').find((l) => l.startsWith(`${name} `));
    return line === undefined ? Number.NaN : Number(line.slice(name.length + 1));
  } catch {
    return Number.NaN;
  }
}

export function summarise(scenario: Scenario, target: Target, windows: WindowFigures[]): TargetSummary {
  const med = (pick: (w: WindowFigures) => number) => median(windows.map(pick));
  const rssMedian = med((w) => w.rssMedianKiB);
  const peak = target.proxy !== undefined && target.proxy.process.exitCode === null ? processMemoryKiB(target.proxy.pid).hwm : Number.NaN;
  return {
    target: target.name,
    eventsPerS: med((w) => w.eventsPerS),
    requestsPerS: med((w) => w.requestsPerS),
    eventsPerRead: med((w) => w.eventsPerRead),
    ttftP50: med((w) => w.ttftMs.p50),
    ttftP99: med((w) => w.ttftMs.p99),
    itlP50: med((w) => w.itlMs.p50),
    itlP99: med((w) => w.itlMs.p99),
    proxyUsPerEvent: med((w) => w.proxyUsPerEvent),
    proxyUsPerRequest: med((w) => w.proxyUsPerRequest),
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

