/**
 * The run's figures against the direct row (added latency, throughput, CPU per event, nginx's ratio — this run's
 * nginx, or its reference figures), and each proxy's CPU split into a cost per request and one per event.
 */
import { fitCost, type CostFit, type CostPoint } from './fit.js';
import type { NginxReference } from './reference.js';
import type { ScenarioResult } from './run.js';
import { median } from './stats.js';

export interface Comparison {
  scenario: string;
  proxy: string;
  addedTtftP50Ms: number;
  addedTtftP99Ms: number;
  addedItlP99Ms: number;
  /** Events/s through the proxy ÷ direct; requests/s for a non-streaming scenario. */
  throughputRatio: number;
  usPerEvent: number;
  usPerRequest: number;
  nginxUsPerEvent: number;
  nginxSource: 'this run' | 'peer-figures.md' | 'none';
  vsNginx: number;
  /** The bare Node relay's (node-floor) CPU per event in this run, and this row's ratio to it (per request for `req`). */
  relayUsPerEvent: number;
  vsRelay: number;
  /** This row's ITL p99 less the relay's, ms. */
  itlP99VsRelayMs: number;
  rssPerStreamKiB: number;
  rssWindowPerStreamKiB: number;
  peakRssMiB: number;
}

/** `reference`: nginx's figures for a scenario this run has no nginx row for. */
export function compare(results: ScenarioResult[], reference: NginxReference): Comparison[] {
  const rows: Comparison[] = [];
  for (const result of results) {
    const direct = result.targets.find((t) => t.target === 'direct');
    const nginx = result.targets.find((t) => t.target === 'nginx');
    const relay = result.targets.find((t) => t.target === 'node-floor');
    if (direct === undefined) continue;
    const { stream, rssProbe } = result.scenario;
    const peer = stream ? reference.usPerEvent[result.scenario.name] : undefined;
    const nginxUs = nginx?.proxyUsPerEvent ?? peer ?? Number.NaN;
    const nginxSource = nginx !== undefined ? 'this run' : peer !== undefined ? reference.label : 'none';
    for (const t of result.targets) {
      if (t.target === 'direct') continue;
      rows.push({
        scenario: result.scenario.name,
        proxy: t.target,
        addedTtftP50Ms: t.ttftP50 - direct.ttftP50,
        addedTtftP99Ms: t.ttftP99 - direct.ttftP99,
        addedItlP99Ms: t.itlP99 - direct.itlP99,
        throughputRatio: stream ? t.eventsPerS / direct.eventsPerS : t.requestsPerS / direct.requestsPerS,
        usPerEvent: t.proxyUsPerEvent,
        usPerRequest: t.proxyUsPerRequest,
        nginxUsPerEvent: nginxUs,
        nginxSource,
        // Non-streaming: the ratio of CPU per request (the only unit there).
        vsNginx: stream ? t.proxyUsPerEvent / nginxUs : t.proxyUsPerRequest / (nginx?.proxyUsPerRequest ?? Number.NaN),
        relayUsPerEvent: relay?.proxyUsPerEvent ?? Number.NaN,
        vsRelay: stream ? t.proxyUsPerEvent / (relay?.proxyUsPerEvent ?? Number.NaN) : t.proxyUsPerRequest / (relay?.proxyUsPerRequest ?? Number.NaN),
        itlP99VsRelayMs: t.itlP99 - (relay?.itlP99 ?? Number.NaN),
        rssPerStreamKiB: rssProbe ? t.rssPerStreamKiB : Number.NaN,
        rssWindowPerStreamKiB: rssProbe ? t.rssWindowPerStreamKiB : Number.NaN,
        peakRssMiB: t.peakRssKiB / 1024,
      });
    }
  }
  return rows;
}

/** Proxies whose CPU is split into a per-request and a per-event cost. */
export const SPLIT_PROXIES = ['waybill', 'waybill-lean', 'waybill+otel', 'nginx'];

export interface CostSplit {
  proxy: string;
  /** Scenarios whose windows went into the fit. */
  scenarios: string[];
  /** CPU at rest subtracted from each window, ms per second (median over the fitted scenarios). */
  idleCpuMsPerS: number;
  fit: CostFit;
  /** a / (a + b × events per request) at the fit's smallest events per request: the per-request share of short answers. */
  perRequestShare: number;
  /** µs per request measured directly by the non-streaming `req` scenario, when it ran. */
  reqUsPerRequest: number;
}

/** Issue 15's a × requests + b × events, per proxy, over the paced streaming windows (bench/proxy/fit.ts). */
export function splitCosts(results: ScenarioResult[]): CostSplit[] {
  const fitted = results.filter((r) => r.scenario.fit && r.scenario.stream);
  const req = results.find((r) => r.scenario.name === 'req');
  const splits: CostSplit[] = [];
  for (const proxy of SPLIT_PROXIES) {
    const points: CostPoint[] = [];
    const scenarios: string[] = [];
    const idle: number[] = [];
    for (const result of fitted) {
      const summary = result.targets.find((t) => t.target === proxy);
      if (summary === undefined) continue;
      scenarios.push(result.scenario.name);
      // At rest the gateway still spends a few ms per second (timers, event-loop monitors): not per request or event.
      const idleMsPerS = Number.isFinite(summary.idleCpuMsPerS) ? summary.idleCpuMsPerS : 0;
      idle.push(idleMsPerS);
      for (const w of result.windows.filter((x) => x.target === proxy)) {
        points.push({
          label: `${result.scenario.name}#${w.repeat}`,
          group: result.scenario.name,
          requests: w.requestsCompleted + w.requestsIncomplete,
          events: w.events,
          cpuUs: w.proxyCpuUs - idleMsPerS * w.windowMs,
        });
      }
    }
    const reqSummary = req?.targets.find((t) => t.target === proxy);
    if (points.length === 0 && reqSummary === undefined) continue;
    const fit = fitCost(points);
    const shortest = fit.eventsPerRequest[0] ?? Number.NaN;
    splits.push({
      proxy,
      scenarios,
      idleCpuMsPerS: median(idle),
      fit,
      perRequestShare: fit.usPerRequest / (fit.usPerRequest + fit.usPerEvent * shortest),
      reqUsPerRequest: reqSummary?.proxyUsPerRequest ?? Number.NaN,
    });
  }
  return splits;
}

