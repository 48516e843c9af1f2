/**
 * Fleet workloads of `waybill load` (load/fleet.ts, load/fleet-stats.ts): shared prefixes and multi-turn sessions,
 * planned from the seed; the report's cached-prompt ratio, upstream shares and idle gaps, by value; and one small
 * run of each against an in-process simulator.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RequestResult, Usage } from '../load/client.js';
import {
  groupPrompts,
  groupWeights,
  planSession,
  planSharedPrefix,
  planTurn,
  turnMessages,
  turnQuestion,
  type ChatMessage,
  type MultiTurnFleet,
  type SharedPrefixFleet,
} from '../load/fleet.js';
import { cachedPrompt, fleetSummary, idleGaps, upstreamShares, type FleetSummary } from '../load/fleet-stats.js';
import { compareReports, parseReport } from '../load/compare.js';
import { requestBody } from '../load/load-routes.js';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { runWorkload } from '../load/runner.js';
import { chatShareMix, seededRandom, type PlannedRequest, type Workload } from '../load/workload.js';
import { parseConfig } from '../src/config/load.js';
import { createGateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';

const BASE: Workload = {
  model: undefined,
  promptTokens: { min: 64, max: 512 },
  outputTokens: { min: 8, max: 16 },
  streamShare: 0.5,
  routeShares: chatShareMix(1),
  n: { min: 1, max: 1 },
  usageShare: 0,
  cancelShare: 0,
  cancelAfterFirstTokenShare: 0.5,
  faultShare: 0,
  faultKinds: [],
  slowShare: 0,
};

const SHARED: SharedPrefixFleet = { kind: 'shared-prefix', groups: 8, prefixTokens: 256, questionTokens: 16, popularity: 'uniform', zipfS: 1.1 };
const MULTI: MultiTurnFleet = {
  kind: 'multi-turn', sessions: 4, turns: { min: 4, max: 4 }, prefixTokens: 128, questionTokens: 16, thinkTimeMs: 500, thinkTimeDist: 'exp', sessionHeader: 'x-session-id',
};

/** The shared-prefix requests a run of `seed` plans, in order. */
function sharedPlans(fleet: SharedPrefixFleet, seed: number, count: number): PlannedRequest[] {
  const random = seededRandom(seed);
  const prompts = groupPrompts(seed, fleet);
  return Array.from({ length: count }, (_, i) => planSharedPrefix({ ...BASE, fleet }, fleet, seed, random, i, true, prompts));
}

const bodies = (plans: readonly PlannedRequest[]) => plans.map((p) => requestBody(p, 'm'));
const content = (plan: PlannedRequest, role: ChatMessage['role']) => plan.messages?.find((m) => m.role === role)?.content ?? '';

describe('shared-prefix planning', () => {
  it('sends the same request bodies for the same seed, and others for another seed', () => {
    expect(bodies(sharedPlans(SHARED, 7, 50))).toEqual(bodies(sharedPlans(SHARED, 7, 50)));
    const other = bodies(sharedPlans(SHARED, 8, 50));
    expect(other).not.toEqual(bodies(sharedPlans(SHARED, 7, 50)));
    // The group prompts themselves differ with the seed, not only which group is drawn.
    expect(groupPrompts(8, SHARED)).not.toEqual(groupPrompts(7, SHARED));
  });

  it('with --prefix-seed, runs of other seeds share the system prompts and nothing else', async () => {
    const fleet: SharedPrefixFleet = { ...SHARED, prefixSeed: 3 };
    const a = sharedPlans(fleet, 7, 40);
    const b = sharedPlans(fleet, 8, 40);
    const systems = (plans: PlannedRequest[]) => new Set(plans.map((p) => content(p, 'system')));
    // The same G prompts (those of seed 3), but other questions and other draws.
    expect(new Set(groupPrompts(7, fleet))).toEqual(new Set(groupPrompts(3, SHARED)));
    for (const s of [...systems(a), ...systems(b)]) expect(groupPrompts(3, SHARED)).toContain(s);
    const questions = new Set(a.map((p) => content(p, 'user')));
    expect(b.some((p) => questions.has(content(p, 'user')))).toBe(false);
    // The flag (and the YAML key) reaches the fleet; a non-integer is refused.
    const parsed = await parseLoadArgs(['--url', 'http://127.0.0.1:1', '--concurrency', '2', '--requests', '4', '--workload', 'shared-prefix', '--prefix-seed', '3', '--seed', '8']);
    if ('problems' in parsed) throw new Error(parsed.problems.join('; '));
    expect(parsed.workload.fleet).toMatchObject({ kind: 'shared-prefix', prefixSeed: 3 });
    expect(await parseLoadArgs(['--url', 'http://127.0.0.1:1', '--concurrency', '2', '--requests', '4', '--workload', 'shared-prefix', '--prefix-seed', 'x'])).toEqual({ problems: ['--prefix-seed: "x" is not an integer'] });
  });

  it('has exactly G system prompts of P tokens, distinct from their first token, and a unique question of Q tokens each', () => {
    const plans = sharedPlans(SHARED, 1, 400);
    const systems = new Set(plans.map((p) => content(p, 'system')));
    expect(systems.size).toBe(8);
    for (const system of systems) expect(system.length).toBe(256 * 4);
    expect(new Set([...systems].map((s) => s.slice(0, 4))).size).toBe(8);
    const questions = plans.map((p) => content(p, 'user'));
    expect(new Set(questions).size).toBe(400);
    for (const q of questions) expect(q.length).toBe(16 * 4);
    // The simulator's count (ceil(chars / 4) of the contents) is exactly P + Q.
    for (const p of plans) expect(p.promptTokens).toBe(256 + 16);
    for (const p of plans) {
      expect(p.route).toBe('chat_completions');
      expect(p.includeUsage).toBe(p.stream);
      expect(p.fleet?.group).toBeGreaterThanOrEqual(0);
    }
    const body = JSON.parse(requestBody(plans.find((p) => p.stream) ?? plans[0] ?? (undefined as never), 'm')) as { stream_options?: unknown; messages: unknown[] };
    expect(body.stream_options).toEqual({ include_usage: true });
    expect(body.messages).toHaveLength(2);
  });

  it('spreads uniform popularity evenly, and skews Zipf to the first group', () => {
    const count = (fleet: SharedPrefixFleet) => {
      const counts = new Array<number>(fleet.groups).fill(0);
      for (const p of sharedPlans(fleet, 3, 8000)) counts[p.fleet?.group ?? -1]! += 1;
      return counts;
    };
    for (const n of count(SHARED)) expect(Math.abs(n - 1000)).toBeLessThan(120);
    const zipf = count({ ...SHARED, popularity: 'zipf' });
    const weights = groupWeights(8, 'zipf', 1.1);
    expect(weights[0]! / weights[1]!).toBeCloseTo(2 ** 1.1, 10);
    expect(Math.max(...zipf)).toBe(zipf[0]);
    for (let k = 0; k < 8; k++) expect(Math.abs(zipf[k]! / 8000 - weights[k]!)).toBeLessThan(0.02);
  });
});

describe('multi-turn planning', () => {
  it('appends the answer received and a new question to the previous turn, bounded by the turns', () => {
    const session = planSession(BASE, MULTI, 5, 2);
    let messages: ChatMessage[] | undefined;
    const turns: PlannedRequest[] = [];
    for (let turn = 0; turn < session.turns; turn++) {
      const answer = `answer ${turn - 1}`;
      const next = turnMessages(messages, answer, session.system, turnQuestion(5, MULTI, 2, turn));
      if (messages !== undefined) {
        expect(next.slice(0, messages.length)).toEqual(messages);
        expect(next.slice(messages.length)).toEqual([
          { role: 'assistant', content: answer },
          { role: 'user', content: turnQuestion(5, MULTI, 2, turn) },
        ]);
      } else {
        expect(next).toEqual([{ role: 'system', content: session.system }, { role: 'user', content: turnQuestion(5, MULTI, 2, 0) }]);
      }
      messages = next;
      turns.push(planTurn(MULTI, 5, session, turn, next, turn, true));
    }
    expect(messages).toHaveLength(2 * 4); // system, 4 questions, 3 answers
    expect(session.system).toHaveLength(128 * 4);
    expect(new Set(turns.map((t) => content(t, 'user'))).size).toBe(1);
    expect(new Set(turns.map((t) => t.messages?.at(-1)?.content)).size).toBe(4);
    // The session id is stable across the session's turns, and differs between sessions.
    expect(new Set(turns.map((t) => t.headers?.['x-session-id']))).toEqual(new Set([session.id]));
    expect(planSession(BASE, MULTI, 5, 3).id).not.toBe(session.id);
    expect(planTurn({ ...MULTI, sessionHeader: undefined }, 5, session, 0, turns[0]?.messages ?? [], 0, true).headers).toBeUndefined();
  });

  it('draws the same sessions for the same seed, and think times of the distribution asked', () => {
    expect(planSession(BASE, MULTI, 5, 1)).toEqual(planSession(BASE, MULTI, 5, 1));
    expect(planSession(BASE, MULTI, 6, 1).system).not.toBe(planSession(BASE, MULTI, 5, 1).system);
    expect(planSession(BASE, { ...MULTI, thinkTimeDist: 'fixed', thinkTimeMs: 250 }, 5, 1).thinkMs).toEqual([250, 250, 250]);
    // Exponential: seeded values (the same each time), whose mean over many sessions is the mean asked.
    const gaps = Array.from({ length: 2000 }, (_, s) => planSession(BASE, MULTI, 9, s).thinkMs).flat();
    expect(gaps).toEqual(Array.from({ length: 2000 }, (_, s) => planSession(BASE, MULTI, 9, s).thinkMs).flat());
    expect(new Set(gaps).size).toBe(gaps.length);
    const mean = gaps.reduce((a, b) => a + b, 0) / gaps.length;
    expect(Math.abs(mean - 500) / 500).toBeLessThan(0.05);
    // Drawn turns stay in their range.
    for (let s = 0; s < 50; s++) {
      const turns = planSession(BASE, { ...MULTI, turns: { min: 2, max: 5 } }, 1, s).turns;
      expect(turns).toBeGreaterThanOrEqual(2);
      expect(turns).toBeLessThanOrEqual(5);
    }
  });
});

/** A synthetic delivered result, for the report's pure parts. */
function result(index: number, usage: Usage | undefined, fleet?: PlannedRequest['fleet'], startedAt = 0, e2eMs = 10): RequestResult {
  const plan: PlannedRequest = {
    index, route: 'chat_completions', stream: true, n: 1, promptTokens: 10, maxTokens: 4, includeUsage: true, simHeader: undefined,
    fault: undefined, cancel: undefined, slow: undefined, ...(fleet === undefined ? {} : { fleet }),
  };
  return {
    plan, startedAt, sentMs: 0, status: 200, outcome: 'delivered', code: 200, cancelPhase: undefined, ttftMs: 1, tpotMs: 1, e2eMs, itlMs: [],
    outputEvents: 4, usage, finishReasons: ['length'], cancelRacedEnd: false, anomaly: undefined, error: undefined,
  };
}

describe('fleet report figures', () => {
  it('computes the cached-prompt ratio over the requests that reported it, absent apart from zero', () => {
    const results = [
      result(0, { promptTokens: 100, completionTokens: 4, cachedTokens: 50 }),
      result(1, { promptTokens: 300, completionTokens: 4, cachedTokens: 0 }),
      result(2, { promptTokens: 1000, completionTokens: 4, cachedTokens: undefined }),
      result(3, undefined),
    ];
    // Over every request with usage, the one without details counted as 0 (vLLM omits a 0): 50 / (100 + 300 + 1000).
    expect(cachedPrompt(results)).toEqual({ reported: 2, absent: 2, withoutUsage: 1, cachedTokens: 50, promptTokens: 400, ratio: 0.125, promptTokensAll: 1400, ratioAll: 50 / 1400 });
    expect(cachedPrompt([result(0, { promptTokens: 10, completionTokens: 1, cachedTokens: undefined })]).ratioAll).toBeUndefined();
    expect(cachedPrompt([result(0, undefined)]).ratio).toBeUndefined();
  });

  it('shares the run among upstreams by the growth of waybill_upstream_attempts_total, lookups left out', () => {
    const text = (a: number, b: number, lookup: number) =>
      [
        '# HELP waybill_requests_total requests', '# TYPE waybill_requests_total counter',
        `waybill_upstream_attempts_total{model="m",upstream="a",result="ok"} ${a}`,
        `waybill_upstream_attempts_total{model="m",upstream="b",result="ok"} ${b}`,
        `waybill_upstream_attempts_total{model="m",upstream="b",result="error"} 1`,
        `waybill_upstream_attempts_total{model="_lookup",upstream="c",result="ok"} ${lookup}`,
      ].join('\n');
    expect(upstreamShares(text(10, 5, 0), text(40, 15, 9), 'http://t', 40)).toEqual({ source: 'gateway', attempts: { a: 30, b: 10 }, shares: { a: 0.75, b: 0.25 } });
    // Not a gateway (a simulator's or vLLM's /metrics, or none): the target is the one upstream.
    expect(upstreamShares('vllm:num_requests_running 0', 'vllm:num_requests_running 0', 'http://t', 20)).toEqual({ source: 'target', attempts: { 'http://t': 20 }, shares: { 'http://t': 1 } });
    expect(upstreamShares(undefined, undefined, 'http://t', 0).shares).toEqual({});
  });

  it('measures the idle gaps from a turn\'s completion to the next turn\'s start, per session', () => {
    const results = [
      result(0, undefined, { kind: 'multi-turn', session: 0, turn: 0 }, 0, 100),
      result(2, undefined, { kind: 'multi-turn', session: 0, turn: 1 }, 150, 100),
      result(1, undefined, { kind: 'multi-turn', session: 1, turn: 0 }, 10, 20),
      result(4, undefined, { kind: 'multi-turn', session: 0, turn: 2 }, 280, 10),
      result(3, undefined, { kind: 'multi-turn', session: 1, turn: 1 }, 40, 20),
    ];
    expect(idleGaps(results).sort((a, b) => a - b)).toEqual([10, 30, 50]);
    const summary = fleetSummary('multi-turn', results, 1, upstreamShares(undefined, undefined, 't', 5));
    expect(summary.sessions).toBe(2);
    expect(summary.idleGapMs).toMatchObject({ count: 3, p50: 30, p90: 50, max: 50 });
  });

  it('compares the cached-prompt ratio of two fleet reports in points', () => {
    const report = (ratio: number) =>
      parseReport(JSON.stringify({ summary: { requests: 10, byOutcome: { delivered: 10 }, fleet: { cachedPrompt: { ratio, reported: 10 }, promptTokensPerS: 100, idleGapMs: { p50: 5, p90: 9 } } } }));
    const [a, b] = [report(0.5), report(0.4)];
    if ('problem' in a || 'problem' in b) throw new Error('not a report');
    const row = compareReports(a, b).find((r) => r.label === 'cached prompt ratio');
    expect(row).toMatchObject({ a: 0.5, b: 0.4, verdict: 'worse' });
    expect(row?.change).toBeCloseTo(-10, 10);
  });
});

describe('fleet runs against the simulator', () => {
  let sim: Simulator;
  let url: string;
  beforeAll(async () => {
    sim = createSimulator({ ttftMs: 2, itlMs: 1, jitter: 0, promptTokensDetails: true, cachedTokens: 40 });
    url = (await sim.listen(0, '127.0.0.1')).url;
  });
  afterAll(async () => {
    await sim.close();
  });

  interface Report {
    header: { workload: Record<string, unknown> };
    summary: { requests: number; byOutcome: Record<string, number>; ttftMs: { count: number }; fleet: FleetSummary };
    requests: Array<{ group?: number; session?: number; turn?: number; usage: { promptTokens: number; cachedTokens: number }; prompt_tokens_planned: number }>;
  }

  it('runs shared-prefix: every request delivered, the cached ratio from usage, one upstream', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-fleet-'));
    const config = await parseLoadArgs([
      '--url', url, '--concurrency', '4', '--requests', '20', '--output-tokens', '4', '--workload', 'shared-prefix', '--groups', '3',
      '--prefix-tokens', '64', '--question-tokens', '16', '--popularity', 'zipf', '--json', join(dir, 'r.json'), '--quiet',
    ]);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    const lines: string[] = [];
    expect(await runLoadWith(config, (t) => lines.push(t))).toEqual({ exitCode: 0, mismatches: 0 });
    const report = JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as Report;
    expect(report.summary.byOutcome).toEqual({ delivered: 20 });
    const fleet = report.summary.fleet;
    expect(fleet.workload).toBe('shared-prefix');
    expect(fleet.groups).toBe(3);
    expect(Object.values(fleet.byGroup ?? {}).reduce((a, b) => a + b, 0)).toBe(20);
    // Every prompt is 64 + 16 tokens; the simulator reports 40 of them cached on each.
    expect(report.requests.every((r) => r.usage.promptTokens === 80 && r.prompt_tokens_planned === 80)).toBe(true);
    expect(fleet.cachedPrompt).toEqual({ reported: 20, absent: 0, withoutUsage: 0, cachedTokens: 800, promptTokens: 1600, ratio: 0.5, promptTokensAll: 1600, ratioAll: 0.5 });
    expect(fleet.upstreams).toEqual({ source: 'target', attempts: { [url]: 20 }, shares: { [url]: 1 } });
    expect(report.header.workload).toMatchObject({ fleet: 'shared-prefix', groups: 3, prefix_tokens: 64, question_tokens: 16, popularity: 'zipf', zipf_s: 1.1 });
    expect(lines.join('\n')).toContain('cached prompt 50.00%  (800 of 1600 prompt tokens, absent counted as 0: vLLM omits a cached_tokens of 0)');
    expect(lines.join('\n')).toContain('50.00% among the 20 that reported it (absent on 0, of which 0 without usage)');
  });

  it('runs multi-turn sessions: each turn resends what the client received, after the think time', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-fleet-'));
    const config = await parseLoadArgs([
      '--url', url, '--concurrency', '5', '--requests', '20', '--output-tokens', '4', '--workload', 'multi-turn', '--turns', '4',
      '--prefix-tokens', '32', '--question-tokens', '8', '--think-time-ms', '30', '--think-time-dist', 'fixed', '--session-header', 'x-session-id',
      '--json', join(dir, 'r.json'), '--quiet',
    ]);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    expect(await runLoadWith(config, () => {})).toEqual({ exitCode: 0, mismatches: 0 });
    const report = JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as Report;
    expect(report.summary.byOutcome).toEqual({ delivered: 20 });
    const fleet = report.summary.fleet;
    // 5 sessions of 4 turns make exactly the 20 requests: 15 gaps, each at least the fixed 30 ms.
    expect(fleet.sessions).toBe(5);
    expect(fleet.idleGapMs?.count).toBe(15);
    expect(fleet.idleGapMs?.p50).toBeGreaterThanOrEqual(29);
    // The simulator counts what was sent: the plan's messages, answers included (min(40, prompt) cached).
    for (const r of report.requests) expect(r.usage.promptTokens).toBe(r.prompt_tokens_planned);
    expect(fleet.cachedPrompt.cachedTokens).toBe(report.requests.reduce((sum, r) => sum + Math.min(40, r.usage.promptTokens), 0));
    expect(fleet.cachedPrompt.reported).toBe(20);
  });

  it('keeps the answers as received in the next turn of the same session', async () => {
    const fleet: MultiTurnFleet = { ...MULTI, sessions: 2, turns: { min: 3, max: 3 }, prefixTokens: 16, questionTokens: 4, thinkTimeMs: 1, thinkTimeDist: 'fixed' };
    const run = await runWorkload({
      baseUrl: url, model: 'sim-model', apiKey: undefined, workload: { ...BASE, outputTokens: { min: 3, max: 3 }, fleet }, seed: 4, concurrency: 2, rate: undefined,
      requests: 6, durationMs: undefined, simulator: true, requestTimeoutMs: 10_000,
    });
    expect(run.results.map((r) => r.outcome)).toEqual(new Array(6).fill('delivered'));
    for (const session of [0, 1]) {
      const turns = run.results.filter((r) => r.plan.fleet?.session === session).sort((a, b) => (a.plan.fleet?.turn ?? 0) - (b.plan.fleet?.turn ?? 0));
      expect(turns).toHaveLength(3);
      for (let k = 1; k < turns.length; k++) {
        const [previous, current] = [turns[k - 1]!, turns[k]!];
        expect(previous.answerText).not.toBe('');
        expect(current.plan.messages?.slice(0, -2)).toEqual(previous.plan.messages);
        expect(current.plan.messages?.at(-2)).toEqual({ role: 'assistant', content: previous.answerText });
        expect(current.plan.headers).toEqual(previous.plan.headers);
      }
    }
  });

  it('reads a fleet workload from a YAML file (`fleet:` and its keys), flags winning', async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'waybill-fleet-')), 'w.yaml');
    writeFileSync(file, 'fleet: multi-turn\nsessions: 3\nturns: 2-6\nthink_time_dist: fixed\nprefix_tokens: 100\n');
    const config = await parseLoadArgs(['--url', url, '--concurrency', '2', '--requests', '5', '--workload', file, '--prefix-tokens', '50']);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    expect(config.workload.fleet).toEqual({
      kind: 'multi-turn', sessions: 3, turns: { min: 2, max: 6 }, prefixTokens: 50, questionTokens: 64, thinkTimeMs: 1000, thinkTimeDist: 'fixed', sessionHeader: undefined,
    });
    const shared = await parseLoadArgs(['--url', url, '--concurrency', '2', '--requests', '5', '--workload', 'shared-prefix']);
    if ('problems' in shared) throw new Error(shared.problems.join('\n'));
    expect(shared.workload.fleet).toEqual({ kind: 'shared-prefix', groups: 8, prefixTokens: 2048, questionTokens: 64, popularity: 'uniform', zipfS: 1.1 });
  });

  it('refuses what a fleet workload cannot run', async () => {
    const problems = await parseLoadArgs([
      '--url', url, '--rate', '5', '--requests', '5', '--workload', 'multi-turn', '--think-time-dist', 'normal', '--fault-share', '0.1', '--question-tokens', '2',
    ]);
    expect('problems' in problems && [...problems.problems].sort()).toEqual([
      '--cancel-share / --fault-share / --slow-share: not with a fleet workload',
      '--question-tokens: "2" must be an integer ≥ 4',
      '--rate: multi-turn runs a closed loop of sessions; give --concurrency (and --sessions)',
      '--think-time-dist: "normal" is not one of exp, fixed',
    ]);
  });
});

describe('a fleet run through Waybill', () => {
  it('shares the requests among the upstreams as the gateway counted them, and still reconciles', async () => {
    const sims = [0, 1].map((i) => createSimulator({ ttftMs: 2, itlMs: 1, jitter: 0, seed: i + 1, promptTokensDetails: true, cachedTokens: 8 }));
    const urls = await Promise.all(sims.map(async (sim) => (await sim.listen(0, '127.0.0.1')).url));
    const config = parseConfig({
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'sim', models: ['sim-model'], upstreams: urls.map((url, i) => ({ name: `sim-${i}`, url })) }],
      health: { interval: '1h' },
      logging: { level: 'silent' },
    });
    const gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
    try {
      await gateway.listen();
      const base = `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`;
      const dir = mkdtempSync(join(tmpdir(), 'waybill-fleet-'));
      const args = await parseLoadArgs([
        '--url', base, '--concurrency', '4', '--requests', '20', '--output-tokens', '4', '--workload', 'shared-prefix', '--groups', '4',
        '--prefix-tokens', '32', '--question-tokens', '8', '--reconcile', ...urls.flatMap((url) => ['--sim', url]), '--json', join(dir, 'r.json'), '--quiet',
      ]);
      if ('problems' in args) throw new Error(args.problems.join('\n'));
      const outcome = await runLoadWith(args, () => {});
      expect(outcome.mismatches).toBe(0);
      const fleet = (JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as { summary: { fleet: FleetSummary } }).summary.fleet;
      const served = sims.map((sim) => sim.stats().byRoute.chat_completions);
      expect(fleet.upstreams.source).toBe('gateway');
      expect(fleet.upstreams.attempts).toEqual(Object.fromEntries(served.map((n, i) => [`sim-${i}`, n]).filter(([, n]) => n !== 0)));
      expect(Object.values(fleet.upstreams.attempts).reduce((a, b) => a + b, 0)).toBe(20);
      for (const [upstream, share] of Object.entries(fleet.upstreams.shares)) expect(share).toBeCloseTo((fleet.upstreams.attempts[upstream] ?? 0) / 20, 10);
      expect(fleet.cachedPrompt).toMatchObject({ reported: 20, absent: 0, cachedTokens: 20 * 8, promptTokens: 20 * 40, ratio: 0.2 });
    } finally {
      await gateway.close();
      await Promise.all(sims.map((sim) => sim.close()));
    }
  });
});
