/** --profile and --perf: the gateway under node --cpu-prof for one scenario's window, then Linux perf per proxy. */
import { mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { f1, f2, brief } from './format.js';
import { BIN, LOAD_CORE, PROXY_CORE } from './layout.js';
import { measure, newTarget } from './measure.js';
import { tokensOf, type Options } from './options.js';
import { perEvent, startPerf } from './perf.js';
import { startGateway, startNginx, startSim, unpinHelperThreads, type Child } from './procs.js';
import { summariseProfile, type ProfileSummary } from './profile.js';
import type { Scenario } from './scenarios.js';

export interface PerfResult {
  scenario: string;
  proxy: string;
  usPerEvent: number;
  perEvent: Record<string, number>;
  cpuByBinary: Record<string, number>;
}

/** One window per proxy under `perf stat` (syscalls) and `perf record` (CPU by binary). */
export async function perfScenario(scenario: Scenario, options: Options, dir: string, sim: { child: Child; origin: string }): Promise<PerfResult[]> {
  const results: PerfResult[] = [];
  const proxies: { name: string; start: () => Promise<{ child: Child; origin: string }> }[] = [
    {
      name: 'waybill',
      // --perf-basic-prof: names JIT-compiled functions for perf (a /tmp/perf-PID.map file, removed below).
      start: () => startGateway(BIN, PROXY_CORE, dir, { name: 'waybill-perf', upstream: sim.origin, logging: 'default', nodeFlags: ['--perf-basic-prof'] }),
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

export async function profileScenario(
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
    outputTokens: tokensOf(scenario, options),
    seed: options.seed,
  });
  try {
    const gateway = await startGateway(BIN, PROXY_CORE, scenarioDir, {
      name: 'waybill-profiled',
      upstream: sim.origin,
      logging: 'default',
      nodeFlags: ['--cpu-prof', '--cpu-prof-dir', outDir, '--cpu-prof-interval', '500'],
    });
    // The main thread stays alone on core 0; the sampler (and V8's helper threads) may use either core.
    unpinHelperThreads(gateway.child.pid, `${PROXY_CORE},${LOAD_CORE}`);
    const target = newTarget('waybill (profiled)', gateway.origin, gateway.child);
    const figures = await measure(scenario, target, 1, sim.child, [gateway.child], options);
    window = { fromUs: figures.monoFromUs, toUs: figures.monoToUs };
    cpuShare = figures.proxyCpuShare;
    console.log(`  profile ${scenario.name} ${brief(figures, scenario.stream)}`);
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

export function formatPerf(results: PerfResult[]): string {
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

