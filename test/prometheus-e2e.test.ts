/**
 * Against a real Prometheus (Debian's package, which .ci/run installs): it scrapes a gateway in front of two
 * simulated vLLMs, one of them breaking a share of its answers, evaluates deploy/prometheus/waybill-rules.yaml, and
 * what it records must agree with what the clients saw. A client counts an answer as delivered when it got 200 and
 * the stream ended with `data: [DONE]`. Without prometheus on PATH it skips (WAYBILL_REQUIRE_TOOLS=1: fails).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { request } from 'undici';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type FaultKind, type Simulator } from '../src/sim/server.js';
import { FAULT_KINDS as ALL_FAULT_KINDS } from '../src/sim/faults.js';
import { PrometheusServer, sleep } from './helpers/prometheus-server.js';
import { PROMETHEUS, runTool } from './helpers/promql.js';
import { describeWithTool } from './helpers/system-tool.js';

const ROOT = join(import.meta.dirname, '..');
const RULES = join(ROOT, 'deploy', 'prometheus', 'waybill-rules.yaml');
const MODEL = 'sim-model';
const DONE = 'data: [DONE]\n\n';

const REQUESTS = 300;
const CONCURRENCY = 8;
/** Each client pauses between requests, so the run spans several scrapes. */
const PAUSE_MS = 120;
/** Every SLOW_EVERY-th request decodes slowly on purpose: delivered, but over the TPOT threshold. */
const SLOW_EVERY = 7;
const SLOW_FAULT = 'tokens=3; itl_ms=250';
/**
 * Before the measured run, one of each outcome, so its counter series exist when the run starts: rate() cannot see
 * the increment that creates a series (Waybill does not pre-create its counters at 0), which over a run of a few
 * scrapes would skew the recorded ratios.
 */
const WARM_UP: Array<string | undefined> = [
  ...Array.from({ length: 20 }, () => undefined),
  SLOW_FAULT,
  SLOW_FAULT,
  'error_before_output',
  'error_before_output',
  'status=500',
  'status=503',
  'error_after=2',
  'error_after=0',
  'reset_after=2',
  'reset_after=0',
  'reset_before_response',
  'stall_after=2',
  'stall_after=0',
  'end_after=2',
  'end_after=0',
  'no_done',
  'drop_finish',
  'malformed_after=2',
  'data_after_done',
];
/**
 * Random faults of the broken simulator: failures before and after the first token, retried or not — every kind but
 * oversized events (2 MiB each, which would only slow the run).
 */
const FAULT_KINDS: FaultKind[] = ALL_FAULT_KINDS.filter((kind) => kind !== 'oversized_after');

interface Observed {
  readonly status: number;
  readonly delivered: boolean;
  readonly slow: boolean;
}

interface RulesResult {
  data: { groups: Array<{ name: string; rules: Array<{ name: string; health: string; lastError?: string }> }> };
}

let prom: PrometheusServer | undefined;
let gateway: Gateway | undefined;
let gatewayBase = '';
const sims: Simulator[] = [];
let dir = '';
let warmUp: Observed[] = [];

const server = (): PrometheusServer => {
  if (prom === undefined) throw new Error('Prometheus did not start');
  return prom;
};
/** The single value of an instant query, or undefined when it has none. */
const scalar = (expr: string) => server().scalar(expr);
/** Polls until `check` returns a value, or fails after `ms` saying what it waited for. */
const waitFor = <T>(what: string, ms: number, check: () => Promise<T | undefined>) => server().waitFor(what, ms, check);

async function send(
  base: string,
  index: number,
  fault = index % SLOW_EVERY === 3 ? SLOW_FAULT : undefined,
  extra: { body?: Record<string, unknown>; headers?: Record<string, string> } = {},
): Promise<Observed> {
  const slow = fault === SLOW_FAULT;
  const response = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(fault !== undefined ? { 'x-sim-fault': fault } : {}), ...extra.headers },
    body: JSON.stringify({ model: MODEL, stream: true, messages: [{ role: 'user', content: `request ${index}` }], ...extra.body }),
    headersTimeout: 10_000,
    bodyTimeout: 10_000,
  });
  const body = await response.body.text();
  return { status: response.statusCode, delivered: response.statusCode === 200 && body.endsWith(DONE), slow };
}

/** Set when Prometheus cannot run here (one not on PATH skips the block): the test then fails with it, not its hook. */
let missing: Error | undefined;

beforeAll(async () => {
  try {
    const version = runTool(PROMETHEUS.command, ['--version']);
    if (version.status !== 0) throw new Error(`${PROMETHEUS.command} --version failed:\n${version.output}`);
  } catch (err) {
    missing = err as Error;
    return;
  }
  sims.push(createSimulator({ ttftMs: 5, itlMs: 1, outputTokens: 8, jitter: 0, seed: 7 }));
  sims.push(createSimulator({ ttftMs: 5, itlMs: 1, outputTokens: 8, jitter: 0, seed: 11, faultRate: 0.5, faultKinds: FAULT_KINDS }));
  const urls = await Promise.all(sims.map(async (sim) => (await sim.listen(0, '127.0.0.1')).url));
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'sim', models: [MODEL], upstreams: urls.map((url, i) => ({ name: `sim-${i}`, url })) }],
      // Keep the broken simulator in rotation: the point is a steady fault mix, not ejection.
      health: { interval: '1h', eject_after_failures: 1000 },
      timeouts: { first_output: '1s', idle: '600ms', total: '10s' },
      // Generous TTFT (a retry after a first-output timeout still meets it); a TPOT threshold that only the slow
      // requests miss (a normal one would need 700 ms of stalls across its 8 tokens).
      slo: { ttft: '3s', tpot: '100ms' },
      // For the evaluation test: any answer asked to be JSON is over this cap (its format check unevaluated); the
      // first test sends no contract, so nothing it counts changes.
      output_checks: { max_output_chars: 1 },
      evaluation: { evaluator_header: 'x-waybill-evaluator' },
      logging: { level: 'silent' },
    },
    'e2e',
  );
  gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: true });
  gatewayBase = await gateway.listen();
  // The warm-up ends before Prometheus starts, so every series it creates enters Prometheus's first sample whole: a
  // warm-up that straddled scrapes would put its slow requests (stalls, timeouts) inside the measured rate().
  warmUp = await Promise.all(WARM_UP.map((fault, i) => send(gatewayBase, -1 - i, fault)));

  dir = mkdtempSync(join(tmpdir(), 'waybill-prometheus-'));
  prom = await PrometheusServer.start(dir, {
    global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
    rule_files: [RULES],
    scrape_configs: [{ job_name: 'waybill', static_configs: [{ targets: [new URL(gatewayBase).host] }] }],
  });
  await waitFor('the first scrape of the gateway', 15_000, async () => ((await scalar('up{job="waybill"}')) === 1 ? true : undefined));
}, 45_000);

afterAll(async () => {
  await prom?.stop();
  await gateway?.close();
  await Promise.all(sims.map((sim) => sim.close()));
  if (dir !== '') rmSync(dir, { recursive: true, force: true });
});

describeWithTool(PROMETHEUS, 'waybill-rules.yaml on a real Prometheus', () => {
  it('records the delivered ratio and SLO attainment the clients observed', async () => {
    if (missing !== undefined) throw missing;
    // Settlement can trail the client's last byte (streaming.drain_grace): wait until a scrape has every request.
    const scrapedAll = (count: number) =>
      waitFor(`Prometheus to scrape ${count} requests`, 20_000, async () =>
        (await scalar('sum(waybill_requests_total{job="waybill"})')) === count ? await scalar('max(timestamp(waybill_requests_total{job="waybill"}))') : undefined,
      );
    const warmScrape = await scrapedAll(warmUp.length);

    const run: Observed[] = [];
    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < REQUESTS) {
          run.push(await send(gatewayBase, next++));
          await sleep(PAUSE_MS);
        }
      }),
    );
    expect(run).toHaveLength(REQUESTS);

    const count = (of: Observed[], is: (o: Observed) => boolean) => of.filter(is).length;
    const isDelivered = (o: Observed) => o.delivered;
    const is2xx = (o: Observed) => o.status >= 200 && o.status < 300;
    // The client's own fault: a 4xx other than 429 (here, vLLM's lazy-validation 400). Excluded from the SLO.
    const isExcluded = (o: Observed) => o.status >= 400 && o.status < 500 && o.status !== 429;
    const isMet = (o: Observed) => o.delivered && !o.slow;
    const observed = [...warmUp, ...run];
    const total = observed.length;
    const delivered = count(observed, isDelivered);
    const twoXX = count(observed, is2xx);
    const excluded = count(observed, isExcluded);
    const met = count(observed, isMet);
    // The mix did break things, and not everything.
    expect(count(run, isDelivered)).toBeGreaterThan(REQUESTS / 2);
    expect(count(run, isDelivered)).toBeLessThan(REQUESTS);
    expect(count(run, is2xx)).toBeGreaterThan(count(run, isDelivered));

    const scraped = await scrapedAll(total);
    // Then for a rule evaluation that saw that scrape.
    await waitFor('the recording rules to evaluate after the last scrape', 15_000, async () => {
      const at = await scalar(`min(timestamp(model:waybill_requests_delivered:ratio_rate5m{model="${MODEL}"}))`);
      return at !== undefined && at > scraped + 1 ? true : undefined;
    });

    // Exact: the counters hold every request since the gateway started, warm-up included.
    expect(await scalar('sum(waybill_requests_total{outcome="delivered"})')).toBe(delivered);
    expect(await scalar('sum(waybill_requests_total{code=~"2.."})')).toBe(twoXX);
    expect(await scalar('sum(waybill_slo_requests_total)')).toBe(total);
    expect(await scalar('sum(waybill_slo_requests_total{result="met"})')).toBe(met);
    expect(await scalar('sum(waybill_slo_requests_total{result="excluded"})')).toBe(excluded);
    const promDelivered = await scalar('sum(waybill_requests_total{outcome="delivered"}) / sum(waybill_requests_total)');
    const promAttainment = await scalar('sum(waybill_slo_requests_total{result="met"}) / sum(waybill_slo_requests_total{result!="excluded"})');
    expect(promDelivered).toBeCloseTo(delivered / total, 12);
    expect(promAttainment).toBeCloseTo(met / (total - excluded), 12);

    // The recording rules: rate() over the measured run (the warm-up is in the first sample, before it), so close
    // rather than equal: rate() extrapolates each series to the window's edges on its own.
    // A label set the warm-up did not create (a rare status or outcome of the random faults) is born during the run,
    // and rate() cannot see the increment that created it: its first sample is taken off the clients' counts, from
    // Prometheus's own raw samples, so the comparison is exact but for rate()'s extrapolation.
    const bornInRun = async (selector: string) =>
      (await scalar(`sum(min_over_time(waybill_requests_total{${selector}}[5m]) unless (waybill_requests_total @ ${warmScrape}))`)) ?? 0;
    const bornAll = await bornInRun('');
    const bornDelivered = await bornInRun('outcome="delivered"');
    const bornTwoXX = await bornInRun('code=~"2.."');
    const sloBorn = async (selector: string) =>
      (await scalar(`sum(min_over_time(waybill_slo_requests_total{${selector}}[5m]) unless (waybill_slo_requests_total @ ${warmScrape}))`)) ?? 0;
    const sloBornCounted = await sloBorn('result!="excluded"');
    const sloBornMet = await sloBorn('result="met"');
    const runDelivered = (count(run, isDelivered) - bornDelivered) / (REQUESTS - bornAll);
    const runTwoXX = (count(run, is2xx) - bornTwoXX) / (REQUESTS - bornAll);
    const runAttainment = (count(run, isMet) - sloBornMet) / (REQUESTS - count(run, isExcluded) - sloBornCounted);
    const recordedDelivered = await scalar(`model:waybill_requests_delivered:ratio_rate5m{model="${MODEL}"}`);
    const recordedTwoXX = await scalar(`model:waybill_requests_2xx:ratio_rate5m{model="${MODEL}"}`);
    const recordedAttainment = await scalar(`model:waybill_slo_attainment:ratio_rate5m{model="${MODEL}"}`);
    console.log(
      `e2e: ${total} requests (${REQUESTS} measured). Counters, clients vs Prometheus: delivered ${(delivered / total).toFixed(4)} vs ` +
        `${promDelivered?.toFixed(4)}, SLO attainment ${(met / (total - excluded)).toFixed(4)} vs ${promAttainment?.toFixed(4)} ` +
        `(met ${met}, excluded ${excluded}). Recording rules over the measured run, clients vs Prometheus: delivered ` +
        `${runDelivered.toFixed(4)} vs ${recordedDelivered?.toFixed(4)}, 2xx ${runTwoXX.toFixed(4)} vs ${recordedTwoXX?.toFixed(4)}, ` +
        `SLO attainment ${runAttainment.toFixed(4)} vs ${recordedAttainment?.toFixed(4)} (born in the run: ${bornAll} requests, ${sloBornCounted} SLO-counted)`,
    );
    expect(Math.abs((recordedDelivered ?? Number.NaN) - runDelivered)).toBeLessThan(0.02);
    expect(Math.abs((recordedTwoXX ?? Number.NaN) - runTwoXX)).toBeLessThan(0.02);
    expect(Math.abs((recordedAttainment ?? Number.NaN) - runAttainment)).toBeLessThan(0.02);

    // Every rule evaluated without error against real Waybill series (label matching, types).
    const rulesResponse = await request(`${server().base}/api/v1/rules`);
    const rules = (await rulesResponse.body.json()) as RulesResult;
    const evaluated = rules.data.groups.flatMap((g) => g.rules);
    expect(evaluated.length).toBeGreaterThan(50);
    for (const rule of evaluated) expect(`${rule.name}: ${rule.health} ${rule.lastError ?? ''}`.trim()).toBe(`${rule.name}: ok`);
    // The process metrics the dashboard reads came through the scrape too.
    expect(await scalar('count(nodejs_eventloop_lag_seconds{job="waybill"})')).toBe(1);
  }, 60_000);

  it('records evaluation coverage and accepted among evaluated over their own denominators, evaluator traffic apart', async () => {
    if (missing !== undefined) throw missing;
    const before = (await scalar('sum(waybill_requests_total{job="waybill"})')) ?? 0;
    const checkedBefore = (await scalar('sum(waybill_requests_checked_total{job="waybill"})')) ?? 0;
    const evaluatedBefore = (await scalar('sum(waybill_requests_checked_total{job="waybill",verdict!="unevaluated"})')) ?? 0;
    // Per round: two plain requests (no contract: evaluated), one asking for JSON (over the cap: unevaluated), one
    // from the evaluator (counted apart), on the same fleet whose second engine breaks half its answers.
    const ROUNDS = 40;
    const plain: Observed[] = [];
    const json: Observed[] = [];
    const evaluator: Observed[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      const [a, b, c, d] = await Promise.all([
        send(gatewayBase, 10_000 + 4 * i, undefined),
        send(gatewayBase, 10_001 + 4 * i, undefined),
        send(gatewayBase, 10_002 + 4 * i, undefined, { body: { response_format: { type: 'json_object' } } }),
        send(gatewayBase, 10_003 + 4 * i, undefined, { headers: { 'x-waybill-evaluator': 'nightly' } }),
      ]);
      plain.push(a, b);
      json.push(c);
      evaluator.push(d);
      await sleep(50);
    }
    const total = before + 4 * ROUNDS;
    const scraped = await waitFor(`Prometheus to scrape ${total} requests`, 20_000, async () =>
      (await scalar('sum(waybill_requests_total{job="waybill"})')) === total ? await scalar('max(timestamp(waybill_requests_total{job="waybill"}))') : undefined,
    );
    await waitFor('the evaluation rules to evaluate after the last scrape', 15_000, async () => {
      const at = await scalar(`min(timestamp(model:waybill_evaluation_coverage:ratio_rate5m{model="${MODEL}"}))`);
      return at !== undefined && at > scraped + 1 ? true : undefined;
    });
    const delivered = (of: Observed[]) => of.filter((o) => o.delivered).length;
    // Exact, from the counters: every delivered user answer is checked once; the over-cap ones are not evaluated;
    // the evaluator's are in none of it, and in their own counter by outcome.
    const checked = delivered(plain) + delivered(json);
    expect((await scalar('sum(waybill_requests_checked_total)')) ?? 0).toBe(checkedBefore + checked);
    expect((await scalar('sum(waybill_requests_checked_total{verdict!="unevaluated"})')) ?? 0).toBe(evaluatedBefore + delivered(plain));
    expect(await scalar('sum(waybill_requests_checked_total{verdict="unevaluated"})')).toBe(delivered(json));
    expect(await scalar('sum(waybill_evaluator_requests_total)')).toBe(ROUNDS);
    expect((await scalar('sum(waybill_evaluator_requests_total{outcome="delivered"})')) ?? 0).toBe(delivered(evaluator));
    // Still excluded from the SLO, as before.
    expect(await scalar('sum(waybill_slo_requests_total{result="excluded"})')).toBeGreaterThanOrEqual(ROUNDS);
    // The recorded ratios over the last 5m: the earlier run's checked requests are in the window too (all evaluated),
    // so the expected coverage counts them; rate() extrapolates, hence close rather than equal.
    const inWindow = async (selector: string) => (await scalar(`sum(increase(waybill_requests_checked_total{${selector}}[5m]))`)) ?? 0;
    const expectedCoverage = (await inWindow('verdict!="unevaluated"')) / (await inWindow(''));
    const coverage = await scalar(`model:waybill_evaluation_coverage:ratio_rate5m{model="${MODEL}"}`);
    const acceptedAmongEvaluated = await scalar(`model:waybill_requests_accepted_among_evaluated:ratio_rate5m{model="${MODEL}"}`);
    console.log(
      `e2e evaluation: ${checked} checked (${delivered(json)} over the cap), ${delivered(evaluator)} of ${ROUNDS} evaluator requests delivered; ` +
        `coverage ${coverage?.toFixed(4)} (from increase() ${expectedCoverage.toFixed(4)}), accepted among evaluated ${acceptedAmongEvaluated?.toFixed(4)}`,
    );
    expect(delivered(json)).toBeGreaterThan(ROUNDS / 3);
    expect(coverage).toBeLessThan(1);
    expect(Math.abs((coverage ?? Number.NaN) - expectedCoverage)).toBeLessThan(0.05);
    expect(acceptedAmongEvaluated).toBeGreaterThan(0);
    expect(acceptedAmongEvaluated).toBeLessThanOrEqual(1);
  }, 60_000);
});
