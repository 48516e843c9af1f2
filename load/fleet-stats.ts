/**
 * What a fleet workload (load/fleet.ts) measured beyond the usual summary: how much of the prompt the server said
 * it had cached, which upstreams served the run, and the idle gaps between a session's turns as they happened.
 * Pure: results and metric texts in, figures out; main.ts fetches the metrics.
 */
import type { RequestResult } from './client.js';
import type { FleetKind } from './fleet.js';
import { parseMetrics, sumBy } from './reconcile.js';
import { percentiles, type Percentiles } from './stats.js';

/**
 * How much of the prompt the server said it had cached, two ways. `ratio`: Σ cached_tokens / Σ prompt_tokens over the
 * requests whose usage reported cached tokens — absent is not zero, a server that does not report its cache says
 * nothing about it. `ratioAll`: over every request with usage, absent details counted as 0, once any request
 * reported them — vLLM with --enable-prompt-tokens-details omits `prompt_tokens_details` when cached_tokens is 0
 * (vllm/entrypoints/openai/chat_completion/serving.py: `if self.enable_prompt_tokens_details and num_cached_tokens`),
 * so among a server's answers that report it sometimes, absent means 0, and `ratio` alone would overstate the cache.
 */
export interface CachedPrompt {
  readonly reported: number;
  /** Requests whose usage had no cached_tokens, and of those, the ones without any usage. */
  readonly absent: number;
  readonly withoutUsage: number;
  readonly cachedTokens: number;
  readonly promptTokens: number;
  /** Undefined when no request reported it. */
  readonly ratio: number | undefined;
  /** Prompt tokens of every request with usage. */
  readonly promptTokensAll: number;
  /** cachedTokens / promptTokensAll; undefined when no request reported cached tokens. */
  readonly ratioAll: number | undefined;
}

export function cachedPrompt(results: readonly RequestResult[]): CachedPrompt {
  let reported = 0;
  let withoutUsage = 0;
  let cachedTokens = 0;
  let promptTokens = 0;
  let promptTokensAll = 0;
  for (const r of results) {
    const usage = r.usage;
    if (usage === undefined) withoutUsage++;
    promptTokensAll += usage?.promptTokens ?? 0;
    if (usage?.cachedTokens === undefined || usage.promptTokens === undefined) continue;
    reported++;
    cachedTokens += usage.cachedTokens;
    promptTokens += usage.promptTokens;
  }
  return {
    reported,
    absent: results.length - reported,
    withoutUsage,
    cachedTokens,
    promptTokens,
    ratio: promptTokens > 0 ? cachedTokens / promptTokens : undefined,
    promptTokensAll,
    ratioAll: reported > 0 && promptTokensAll > 0 ? cachedTokens / promptTokensAll : undefined,
  };
}

/** Which upstreams served the run, and each one's share of the attempts. */
export interface UpstreamShares {
  /** `gateway`: from Waybill's `waybill_upstream_attempts_total`; `target`: not a gateway, so the target is the one upstream. */
  readonly source: 'gateway' | 'target';
  readonly attempts: Record<string, number>;
  readonly shares: Record<string, number>;
}

/** Waybill writes this HELP/TYPE line even before any request: a /metrics without it is not a gateway's. */
const WAYBILL_MARKER = '# TYPE waybill_requests_total counter';

/**
 * Per-upstream attempts over the run, from the gateway's /metrics before and after it (the lookups of stored
 * responses, `model="_lookup"`, are not requests). A target whose /metrics is not Waybill's (a simulator, vLLM) or
 * could not be read is its own single upstream, serving all `requests`.
 */
export function upstreamShares(before: string | undefined, after: string | undefined, target: string, requests: number): UpstreamShares {
  if (before === undefined || after === undefined || !before.includes(WAYBILL_MARKER) || !after.includes(WAYBILL_MARKER)) {
    return { source: 'target', attempts: { [target]: requests }, shares: requests > 0 ? { [target]: 1 } : {} };
  }
  const count = (text: string) => {
    const samples = parseMetrics(text).filter((s) => s.labels['model'] !== '_lookup');
    return sumBy(samples, 'waybill_upstream_attempts_total', ['upstream']);
  };
  const start = count(before);
  const attempts: Record<string, number> = {};
  for (const [upstream, value] of count(after)) {
    const grown = value - (start.get(upstream) ?? 0);
    if (grown > 0) attempts[upstream] = grown;
  }
  const total = Object.values(attempts).reduce((a, b) => a + b, 0);
  const shares = Object.fromEntries(Object.entries(attempts).map(([upstream, n]) => [upstream, n / total]));
  return { source: 'gateway', attempts, shares };
}

/**
 * The idle gaps as realised: for each session's turn after the first, the time from the previous turn's completion
 * (its start + end-to-end time, on the client) to this turn's start. Think time plus the runner's own delay.
 */
export function idleGaps(results: readonly RequestResult[]): number[] {
  const bySession = new Map<number, RequestResult[]>();
  for (const r of results) {
    const session = r.plan.fleet?.session;
    if (session === undefined) continue;
    const turns = bySession.get(session) ?? [];
    turns.push(r);
    bySession.set(session, turns);
  }
  const gaps: number[] = [];
  for (const turns of bySession.values()) {
    turns.sort((a, b) => (a.plan.fleet?.turn ?? 0) - (b.plan.fleet?.turn ?? 0));
    for (let i = 1; i < turns.length; i++) {
      const previous = turns[i - 1];
      const current = turns[i];
      if (previous !== undefined && current !== undefined) gaps.push(current.startedAt - (previous.startedAt + previous.e2eMs));
    }
  }
  return gaps;
}

export interface FleetSummary {
  readonly workload: FleetKind;
  /** Shared-prefix: groups asked for, and requests per group (index as the key). */
  readonly groups?: number;
  readonly byGroup?: Record<string, number>;
  /** Multi-turn: sessions started (the last ones may stop early, when the run's count or window runs out). */
  readonly sessions?: number;
  readonly cachedPrompt: CachedPrompt;
  /** Usage's prompt and completion tokens per second of the run (over the requests that reported usage). */
  readonly promptTokensPerS: number;
  readonly completionTokensPerS: number;
  readonly upstreams: UpstreamShares;
  /** Multi-turn: the realised gaps between a turn's completion and the next turn's start. */
  readonly idleGapMs?: Percentiles;
}

export function fleetSummary(kind: FleetKind, results: readonly RequestResult[], durationS: number, upstreams: UpstreamShares, groups?: number): FleetSummary {
  let prompt = 0;
  let completion = 0;
  const byGroup: Record<string, number> = {};
  const sessions = new Set<number>();
  for (const r of results) {
    prompt += r.usage?.promptTokens ?? 0;
    completion += r.usage?.completionTokens ?? 0;
    const group = r.plan.fleet?.group;
    if (group !== undefined) byGroup[String(group)] = (byGroup[String(group)] ?? 0) + 1;
    const session = r.plan.fleet?.session;
    if (session !== undefined) sessions.add(session);
  }
  const common = {
    workload: kind,
    cachedPrompt: cachedPrompt(results),
    promptTokensPerS: durationS > 0 ? prompt / durationS : 0,
    completionTokensPerS: durationS > 0 ? completion / durationS : 0,
    upstreams,
  };
  if (kind === 'shared-prefix') return { ...common, groups: groups ?? Object.keys(byGroup).length, byGroup };
  return { ...common, sessions: sessions.size, idleGapMs: percentiles(idleGaps(results)) };
}

const pct = (value: number | undefined) => (value === undefined ? '—' : `${(value * 100).toFixed(2)}%`);
const ms = (value: number | undefined) => (value === undefined ? '—' : value.toFixed(1));

/** The summary table's fleet lines. */
export function fleetText(fleet: FleetSummary): string {
  const c = fleet.cachedPrompt;
  const shares = Object.entries(fleet.upstreams.shares).map(([upstream, share]) => `${upstream}=${pct(share)} (${fleet.upstreams.attempts[upstream] ?? 0})`);
  const lines = [
    `fleet           ${fleet.workload}${fleet.groups === undefined ? '' : `, ${fleet.groups} groups`}${fleet.sessions === undefined ? '' : `, ${fleet.sessions} sessions`}`,
    `  cached prompt ${pct(c.ratioAll)}  (${c.cachedTokens} of ${c.promptTokensAll} prompt tokens, absent counted as 0: vLLM omits a cached_tokens of 0)`,
    `                ${pct(c.ratio)} among the ${c.reported} that reported it (absent on ${c.absent}, of which ${c.withoutUsage} without usage)`,
    `  tokens/s      prompt ${fleet.promptTokensPerS.toFixed(0)}  completion ${fleet.completionTokensPerS.toFixed(0)}`,
    `  upstreams     ${shares.length === 0 ? '—' : shares.join('  ')}${fleet.upstreams.source === 'target' ? '  (not a gateway: the target is the one upstream)' : ''}`,
  ];
  if (fleet.byGroup !== undefined) lines.push(`  per group     ${Object.entries(fleet.byGroup).sort(([a], [b]) => Number(a) - Number(b)).map(([g, n]) => `${g}=${n}`).join('  ')}`);
  const gaps = fleet.idleGapMs;
  if (gaps !== undefined) lines.push(`  idle gap (ms) count ${gaps.count}  p50 ${ms(gaps.p50)}  p90 ${ms(gaps.p90)}  max ${ms(gaps.max)}`);
  return lines.join('\n');
}
