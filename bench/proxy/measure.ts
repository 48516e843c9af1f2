/**
 * One measured window of one target (direct, a gateway row, nginx…): the load client's figures, and the CPU, memory
 * and core shares read around it.
 */
import { statSync } from 'node:fs';
import { runLoad, type WindowResult } from './client.js';
import { LOAD_CORE, PROXY_CORE } from './layout.js';
import { tokensOf, type Options } from './options.js';
import { coreTimes, processCpuUs, processMemoryKiB, type Child } from './procs.js';
import { requestBody, type Scenario } from './scenarios.js';
import { distribution, median, type Distribution } from './stats.js';

export interface Target {
  /** direct, waybill (default configuration), waybill-lean, waybill+otel, waybill+contract, nginx */
  name: string;
  origin: string;
  /** The proxy writes a log line per request (to its log file): log bytes per request are measured. */
  logsRequests: boolean;
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

export function newTarget(name: string, origin: string, proxy: Child | undefined, gcHook = false, logsRequests = false): Target {
  return { name, origin, proxy, gcHook, logsRequests, contract: false, idleRssKiB: Number.NaN, loadedGcRssKiB: Number.NaN, idleCpuMsPerS: Number.NaN, startRssKiB: Number.NaN };
}

export interface WindowFigures {
  target: string;
  repeat: number;
  windowMs: number;
  events: number;
  eventsPerS: number;
  outputEventsPerS: number;
  /** Requests that ended in the window (complete or not), per second. */
  requestsPerS: number;
  /** Events per HTTP body chunk the client received (one per write of the sender, simulator or proxy): batching. */
  eventsPerRead: number;
  requestsCompleted: number;
  requestsIncomplete: number;
  errors: number;
  /** The proxy's CPU in the window, µs (for the a × requests + b × events fit). */
  proxyCpuUs: number;
  /** The proxy's CPU in the window per request that ended in it, µs. */
  proxyUsPerRequest: number;
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

export async function measure(
  scenario: Scenario,
  target: Target,
  repeat: number,
  sim: Child,
  allProxies: Child[],
  options: Options,
  hooks: { onWindowStart?: () => void; onWindowEnd?: () => void } = {},
): Promise<WindowFigures> {
  const tokens = tokensOf(scenario, options);
  const requestMs = scenario.ttftMs + scenario.itlMs * (tokens - 1);
  const rampMs = scenario.concurrency > 1 ? Math.min(requestMs, 5000) : 0;
  const warmupMs = Math.max(options.minWarmupS * 1000, rampMs + 1000);
  const proxyPid = target.proxy?.pid;
  const cpuOf = (pid: number | undefined) => (pid === undefined ? 0 : processCpuUs(pid));
  const allCpu = () => allProxies.reduce((sum, child) => sum + processCpuUs(child.pid), 0);
  const rss: number[] = [];
  const logSize = () => (target.proxy !== undefined && target.logsRequests ? statSync(target.proxy.logFile).size : 0);
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
    body: requestBody(tokens, target.contract, scenario.stream),
    stream: scenario.stream,
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
    requestsPerS: requests / seconds,
    eventsPerRead: result.reads > 0 ? events / result.reads : Number.NaN,
    requestsCompleted: result.completed,
    requestsIncomplete: result.incomplete,
    errors: result.errors,
    errorMessages: result.errorMessages,
    proxyCpuUs: proxyPid === undefined ? Number.NaN : proxyUs,
    proxyUsPerRequest: proxyPid === undefined || requests === 0 ? Number.NaN : proxyUs / requests,
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

