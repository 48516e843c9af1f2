/**
 * The fuzz harness: a case is 1–3 hostile client requests, each with the transcripts its upstream attempts replay.
 * Every case runs against a real gateway (createGateway over loopback sockets, small timeouts) in front of two
 * scripted upstreams, and must keep every invariant in invariants.ts. `runFuzz` drives the cases with fast-check
 * (seeded, time-boxed, shrinking) and watches the process RSS across the run.
 */
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import fc from 'fast-check';
import { pino } from 'pino';
import type { Settlement } from '../../src/accounting/ledger.js';
import { parseConfig } from '../../src/config/load.js';
import { createGateway, type Gateway } from '../../src/app/gateway.js';
import { clientArbitrary, describeRequest, expectedChoices, asksStream, type ClientPlan } from './client-grammar.js';
import { checkCase, INVARIANTS, parseMetrics, type InvariantName, type RequestOutcome, type Sample, type Violation } from './invariants.js';
import { runClient } from './raw-client.js';
import { ScriptBook, startFuzzUpstream, type FuzzUpstream } from './scripted-upstream.js';
import { attemptTranscripts, describeTranscript, renderTranscript, type Transcript, type TranscriptContext } from './upstream-grammar.js';
import { createRandom } from '../../src/util/prng.js';

/** The gateway's limits under fuzzing: small, so deadlines and size limits are reached quickly. */
export const FUZZ_LIMITS = {
  totalMs: 3_000,
  idleMs: 1_000,
  firstOutputMs: 2_000,
  connectMs: 1_000,
  /** server.read_timeout and server.headers_timeout: a stalled request is answered 408 after this. */
  readTimeoutMs: 2_000,
  drainGraceMs: 200,
  maxAttempts: 2,
  maxEventBytes: 32 * 1024,
  maxResponseBytes: 256 * 1024,
  bodyLimitBytes: 256 * 1024,
  /** What the invariants allow past the total deadline for the answer to arrive (timers, scheduling, a busy CI). */
  marginMs: 1_500,
  /** How long, after every client is done, the settlements may take (drain grace and the attempt's own close). */
  settleWaitMs: 1_500,
} as const;

export interface FuzzRequest {
  readonly client: ClientPlan;
  readonly transcripts: Transcript[];
}

export interface FuzzCase {
  readonly requests: FuzzRequest[];
  /** Seeds the gateway's picking and retry jitter. */
  readonly random: number;
}

export interface GrammarWeights {
  /** Integer weight of pieces that wait for gateway timeouts (stalls, hangs, stalled request bodies); default 4, 0 for none. */
  readonly slowWeight?: number;
}

/** Transcripts finish at most this many choices (past it, the upstream answer is simply incomplete). */
const MAX_SCRIPTED_CHOICES = 2048;

function contextOf(plan: ClientPlan): TranscriptContext {
  return { route: plan.route, choices: Math.min(MAX_SCRIPTED_CHOICES, expectedChoices(plan)), stream: asksStream(plan.body) };
}

export function fuzzCaseArbitrary(weights: GrammarWeights = {}): fc.Arbitrary<FuzzCase> {
  const slowWeight = weights.slowWeight ?? 4;
  const request = clientArbitrary({ slowWeight, bodyLimitBytes: FUZZ_LIMITS.bodyLimitBytes }).chain((client) =>
    attemptTranscripts(contextOf(client), { slowWeight, maxEventBytes: FUZZ_LIMITS.maxEventBytes, maxResponseBytes: FUZZ_LIMITS.maxResponseBytes }).map(
      (transcripts) => ({ client, transcripts }),
    ),
  );
  return fc.record({ requests: fc.array(request, { minLength: 1, maxLength: 3 }), random: fc.nat() });
}

/** The readable transcript of a case: each request as sent, and what each of its upstream attempts replays. */
export function describeCase(c: FuzzCase, ids: readonly string[] = c.requests.map((_, i) => `r${i}`)): string {
  return c.requests
    .map((r, i) => {
      const id = ids[i] ?? `r${i}`;
      const ctx = contextOf(r.client);
      return [describeRequest(r.client, id), ...r.transcripts.map((t, k) => describeTranscript(ctx.route, ctx.choices, t, k + 1))].join('\n');
    })
    .join('\n');
}

// --- The gateway under test ----------------------------------------------------------------------------------------

export interface FuzzGateway {
  readonly gateway: Gateway;
  readonly port: number;
  readonly settlements: Array<{ id: string; settlement: Settlement }>;
  scrape(): Promise<Sample[]>;
  close(): Promise<void>;
}

/** The project's seeded PRNG (mulberry32), so jitter is part of the generated case. */
const mulberry32 = createRandom;

export async function startFuzzGateway(upstreams: readonly FuzzUpstream[], seed: number): Promise<FuzzGateway> {
  const L = FUZZ_LIMITS;
  const config = parseConfig(
    {
      // A request body (or head) that stalls is cut off well inside the total deadline the invariants allow.
      server: { host: '127.0.0.1', port: 0, body_limit_bytes: L.bodyLimitBytes, read_timeout: `${L.readTimeoutMs}ms`, headers_timeout: `${L.readTimeoutMs}ms` },
      pools: [{ name: 'fuzz', models: ['m'], upstreams: upstreams.map((u, i) => ({ name: `u${i}`, url: u.url })) }],
      timeouts: { connect: `${L.connectMs}ms`, first_output: `${L.firstOutputMs}ms`, idle: `${L.idleMs}ms`, total: `${L.totalMs}ms` },
      // Retries stay possible, but neither ejection nor the retry budget carries state from one request to the next.
      retries: { max_attempts: L.maxAttempts, backoff_base: '10ms', backoff_max: '50ms', retry_after_max: '1s', budget: { ratio: 1, min_per_second: 100_000 } },
      health: { interval: 60, eject_after_failures: 1_000_000 },
      streaming: { drain_grace: `${L.drainGraceMs}ms`, max_event_bytes: L.maxEventBytes, max_response_bytes: L.maxResponseBytes },
      shutdown: { grace: 0, drain_timeout: 1 },
      logging: { level: 'silent' },
    },
    'fuzz',
  );
  const settlements: Array<{ id: string; settlement: Settlement }> = [];
  const gateway = createGateway(config, {
    logger: pino({ level: 'silent' }),
    defaultMetrics: false,
    random: mulberry32(seed),
    onSettled: (settlement, id) => settlements.push({ id, settlement }),
  });
  await gateway.listen();
  const port = (gateway.app.server.address() as AddressInfo).port;
  return {
    gateway,
    port,
    settlements,
    async scrape() {
      const response = await fetch(`http://127.0.0.1:${port}/metrics`);
      return parseMetrics(await response.text());
    },
    async close() {
      // A request the gateway never ends would hold close() forever: give it a moment, then cut every connection.
      const closed = gateway.close();
      const timer = setTimeout(() => gateway.app.server.closeAllConnections(), 2_000);
      await Promise.race([closed, new Promise((resolve) => setTimeout(resolve, 4_000).unref())]);
      clearTimeout(timer);
    },
  };
}

// --- One case ------------------------------------------------------------------------------------------------------

export interface CaseReport {
  readonly ids: string[];
  readonly violations: Violation[];
  readonly outcomes: RequestOutcome[];
  readonly durationMs: number;
}

export interface FuzzEnv {
  readonly book: ScriptBook;
  readonly upstreams: FuzzUpstream[];
  /** A gateway shared by every case ('shared' mode), or undefined for a fresh gateway per case. */
  shared: FuzzGateway | undefined;
  nextCase: number;
  close(): Promise<void>;
}

export async function startFuzzEnv(mode: 'per-case' | 'shared', seed: number): Promise<FuzzEnv> {
  const book = new ScriptBook();
  const upstreams = [await startFuzzUpstream(book), await startFuzzUpstream(book)];
  const env: FuzzEnv = {
    book,
    upstreams,
    shared: mode === 'shared' ? await startFuzzGateway(upstreams, seed) : undefined,
    nextCase: 0,
    async close() {
      await env.shared?.close();
      await Promise.all(upstreams.map((u) => u.close()));
    },
  };
  return env;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

async function waitFor(done: () => boolean, ms: number): Promise<void> {
  const until = performance.now() + ms;
  while (!done() && performance.now() < until) await sleep(10);
}

export async function runCase(env: FuzzEnv, c: FuzzCase, ignore: ReadonlySet<InvariantName> = new Set()): Promise<CaseReport> {
  const started = performance.now();
  const caseNo = env.nextCase++;
  const ids = c.requests.map((_, i) => `fz${caseNo}-r${i}`);
  c.requests.forEach((r, i) => {
    const ctx = contextOf(r.client);
    env.book.set(ids[i] as string, { attempts: r.transcripts.map((t) => renderTranscript(ctx.route, ctx.choices, t)) });
  });
  const gw = env.shared ?? (await startFuzzGateway(env.upstreams, c.random));
  const firstSettlement = gw.settlements.length;
  const deadlineMs = FUZZ_LIMITS.totalMs + FUZZ_LIMITS.marginMs;
  try {
    const before = await gw.scrape();
    const observations = await Promise.all(
      c.requests.map(async (r, i) => {
        if (r.client.startMs > 0) await sleep(r.client.startMs);
        return runClient(r.client, ids[i] as string, gw.port, deadlineMs);
      }),
    );
    const mine = () => gw.settlements.slice(firstSettlement);
    const idSet = new Set(ids);
    await waitFor(() => ids.every((id) => mine().some((s) => s.id === id)), FUZZ_LIMITS.settleWaitMs);
    // A moment more, for a second settlement of the same request to show itself.
    await sleep(30);
    const after = await gw.scrape();
    const settled = mine();
    const outcomes: RequestOutcome[] = c.requests.map((r, i) => ({
      id: ids[i] as string,
      plan: r.client,
      obs: observations[i] as RequestOutcome['obs'],
      settlements: settled.filter((s) => s.id === ids[i]).map((s) => s.settlement),
    }));
    const violations = checkCase({
      requests: outcomes,
      settlementCount: settled.length,
      strangerSettlements: settled.filter((s) => !idSet.has(s.id)),
      before,
      after,
      gatewayInflight: gw.gateway.inflight,
      deadlineMs,
    }).filter((v) => !ignore.has(v.invariant));
    return { ids, violations, outcomes, durationMs: performance.now() - started };
  } finally {
    for (const id of ids) env.book.delete(id);
    if (env.shared === undefined) await gw.close();
  }
}

/** What a failing case says: its transcript, what each client saw, how each request settled, and what broke. */
export function caseFailureMessage(c: FuzzCase, report: CaseReport): string {
  const seen = report.outcomes
    .map((o) => {
      const s = o.settlements[0];
      return `  ${o.id}: client saw ${o.obs.status ?? 'no status'} (${o.obs.endedBy} after ${Math.round(o.obs.endedAfterMs)} ms, ${o.obs.body.length} body bytes${o.obs.headSent ? '' : ', left before its request head was written'}); settled ${s === undefined ? 'never' : `${s.code}/${s.outcome}, attempts [${s.attempts.map((a) => a.result ?? '?').join(', ')}], finish reasons [${s.finishReasons.join(', ')}]`}`;
    })
    .join('\n');
  const broken = report.violations.map((v) => `  ✗ ${v.invariant}${v.request === undefined ? '' : ` (${v.request})`}: ${v.detail}`).join('\n');
  return `invariants broken:\n${broken}\ncase:\n${describeCase(c, report.ids)}\nobserved:\n${seen}`;
}

// --- The run ---------------------------------------------------------------------------------------------------------

export interface FuzzOptions {
  readonly seed: number;
  /** Upper bound on cases; the time limit may stop the run earlier (which is not a failure). */
  readonly runs: number;
  /** fast-check's interruptAfterTimeLimit: the whole run, shrinking included. */
  readonly timeLimitMs: number;
  /** A fresh gateway per case (default; shrinks cleanly) or one gateway for the whole run (a soak). */
  readonly gateway?: 'per-case' | 'shared';
  /** Invariants not to check (e.g. the ones already known to fail, to look for others). */
  readonly ignore?: readonly InvariantName[];
  /** Allowed RSS growth across the run, after GC, in MiB. Default 96. */
  readonly rssGrowthLimitMb?: number;
  readonly weights?: GrammarWeights;
  /** fast-check's replay path (printed with a failure): with the same seed, starts from that counterexample. */
  readonly path?: string;
  /** Only cases it accepts run (fc.pre), e.g. to keep a known bug's trigger out while looking for other failures. */
  readonly filter?: (c: FuzzCase) => boolean;
  /** Progress lines (each failing case as it is found, shrink steps). */
  readonly log?: (line: string) => void;
}

export interface FuzzSummary {
  readonly seed: number;
  readonly runs: number;
  readonly interrupted: boolean;
  readonly failed: boolean;
  /** Invariants the (shrunk) counterexample broke, and rss_bounded if memory grew too much. */
  readonly brokenInvariants: InvariantName[];
  /** The shrunk counterexample, readable; undefined when the property held. */
  readonly counterexample: string | undefined;
  /** fast-check's own report (seed, path for replay, counterexample as data). */
  readonly fastCheckReport: string | undefined;
  /** With `seed`, replays the counterexample (runFuzz `path`, fuzz/run.ts --path). */
  readonly path: string | undefined;
  readonly shrinks: number;
  readonly rss: { startMb: number; peakMb: number; endMb: number; growthMb: number; limitMb: number };
  readonly outcomes: Record<string, number>;
  readonly durationMs: number;
}

function collectGarbage(): void {
  try {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as (() => void) | undefined;
    gc?.();
    gc?.();
  } catch {
    // No GC available: RSS is compared as it is.
  }
}

const MB = 1024 * 1024;

export async function runFuzz(options: FuzzOptions): Promise<FuzzSummary> {
  const started = performance.now();
  const log = options.log ?? (() => {});
  const ignore = new Set(options.ignore ?? []);
  const limitMb = options.rssGrowthLimitMb ?? 96;
  const env = await startFuzzEnv(options.gateway ?? 'per-case', options.seed);
  const outcomes: Record<string, number> = {};
  let lastFailure: { c: FuzzCase; message: string; broken: InvariantName[] } | undefined;
  let peak = 0;
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 100);
  sampler.unref();
  let startRss = 0;
  try {
    // Warm up (JIT, sockets, first gateway) before the baseline.
    await runCase(env, { requests: [], random: 0 }).catch(() => undefined);
    collectGarbage();
    startRss = process.memoryUsage().rss;
    peak = startRss;
    const property = fc.asyncProperty(fuzzCaseArbitrary(options.weights), async (c) => {
      if (options.filter !== undefined) fc.pre(options.filter(c));
      const report = await runCase(env, c, ignore);
      for (const o of report.outcomes) {
        const s = o.settlements[0];
        const key = s === undefined ? 'unsettled' : `${s.code}/${s.outcome}`;
        outcomes[key] = (outcomes[key] ?? 0) + 1;
      }
      if (report.violations.length > 0) {
        const message = caseFailureMessage(c, report);
        const broken = [...new Set(report.violations.map((v) => v.invariant))];
        lastFailure = { c, message, broken };
        log(`failing case (${broken.join(', ')}), ${report.outcomes.length} request(s), ${Math.round(report.durationMs)} ms`);
        throw new Error(message);
      }
    });
    const details = await fc.check(property, {
      seed: options.seed,
      numRuns: options.runs,
      interruptAfterTimeLimit: options.timeLimitMs,
      markInterruptAsFailure: false,
      ...(options.path === undefined ? {} : { path: options.path }),
    });
    collectGarbage();
    const endRss = process.memoryUsage().rss;
    const growthMb = (endRss - startRss) / MB;
    const broken: InvariantName[] = [];
    let counterexample: string | undefined;
    if (details.failed && details.counterexample !== null) {
      // Replay the shrunk counterexample once more, so the message is the final one (the last run may have been
      // a shrink attempt that passed).
      let [c] = details.counterexample;
      let report = await runCase(env, c, ignore);
      if (report.violations.length > 0) {
        // fast-check shrinks an array from its front; drop any request the failure does not need, from the back too
        // (while the time budget lasts).
        const target = new Set(report.violations.map((v) => v.invariant));
        for (let i = c.requests.length - 1; i >= 0 && c.requests.length > 1 && performance.now() - started < options.timeLimitMs; i--) {
          const smaller: FuzzCase = { ...c, requests: c.requests.filter((_, k) => k !== i) };
          const attempt = await runCase(env, smaller, ignore);
          if (attempt.violations.some((v) => target.has(v.invariant))) {
            c = smaller;
            report = attempt;
          }
        }
        counterexample = caseFailureMessage(c, report);
        broken.push(...new Set(report.violations.map((v) => v.invariant)));
      } else if (lastFailure !== undefined) {
        counterexample = `${lastFailure.message}\n(note: the replay of this counterexample passed: timing-dependent)`;
        broken.push(...lastFailure.broken);
      }
    }
    if (growthMb > limitMb && !ignore.has('rss_bounded')) broken.push('rss_bounded');
    return {
      seed: options.seed,
      runs: details.numRuns,
      interrupted: details.interrupted,
      failed: broken.length > 0,
      brokenInvariants: broken,
      counterexample,
      fastCheckReport: details.failed ? fc.defaultReportMessage(details) : undefined,
      path: details.counterexamplePath ?? undefined,
      shrinks: details.numShrinks,
      rss: { startMb: startRss / MB, peakMb: Math.max(peak, endRss) / MB, endMb: endRss / MB, growthMb, limitMb },
      outcomes,
      durationMs: performance.now() - started,
    };
  } finally {
    clearInterval(sampler);
    await env.close();
  }
}

export function formatSummary(s: FuzzSummary): string {
  const rss = s.rss;
  const lines = [
    `fuzz: seed ${s.seed}, ${s.runs} case(s)${s.interrupted ? ' (time limit reached)' : ''}, ${Math.round(s.durationMs / 1000)} s, ${s.failed ? `FAILED: ${s.brokenInvariants.join(', ')}` : 'all invariants held'}`,
    `rss: start ${rss.startMb.toFixed(0)} MiB, peak ${rss.peakMb.toFixed(0)} MiB, end ${rss.endMb.toFixed(0)} MiB, growth ${rss.growthMb.toFixed(1)} MiB (limit ${rss.limitMb} MiB)`,
    `outcomes seen: ${Object.entries(s.outcomes)
      .sort((a, b) => b[1] - a[1])
      .map(([k, n]) => `${k} ×${n}`)
      .join(', ')}`,
  ];
  if (s.counterexample !== undefined) {
    lines.push(`shrunk counterexample (${s.shrinks} shrinks; replay: --seed ${s.seed} --path ${s.path ?? '?'}):\n${s.counterexample}`);
  }
  return lines.join('\n');
}

export { INVARIANTS };
