/**
 * Issue 25, incident (2), end to end: four simulated vLLM engines behind a real gateway, scraped (gateway and engines)
 * by a real Prometheus that evaluates deploy/prometheus/waybill-rules.yaml and vllm-rules.yaml. One engine runs a new
 * revision (its GET /version says 0.10.0; the others 0.9.1) that ends 30% of its answers with finish_reason `length`,
 * three times the others' 10%. The revision comparison must flag that revision — and no other alert may be pending or
 * firing, of any severity: evaluated in Prometheus itself (its ALERTS series), not re-derived here.
 *
 * What the clients saw is the ground truth: each answer's finish_reason, and (by its response id, which is the
 * engine's request id) which engine answered it, hence which revision. Prometheus's counters must equal it.
 *
 * Timing (classified): the only waits are for Prometheus to scrape and evaluate (polled, bounded). `for: 10m` keeps the
 * revision alert pending during a run of seconds, which is what is asserted: its expression holds. The run spans
 * several 1 s scrapes; rate() over [30m] of a counter that existed before the run then counts the run's increments.
 * Borderline: none of the shares is near a threshold (30% against 2 × 10%; the floor is 200 choices, the canary gets
 * about 300 of 1 200). Runtime about 15 s. Without prometheus on PATH it skips (WAYBILL_REQUIRE_TOOLS=1: fails).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { request } from 'undici';
import { afterAll, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type RequestRecord, type Simulator } from '../src/sim/server.js';
import { PrometheusServer, sleep } from './helpers/prometheus-server.js';
import { PROMETHEUS, runTool, withoutGrafanaVariables } from './helpers/promql.js';
import { describeWithTool } from './helpers/system-tool.js';

const ROOT = join(import.meta.dirname, '..');
const DASHBOARD = join(ROOT, 'deploy', 'grafana', 'waybill-dashboard.json');
const RULES = [join(ROOT, 'deploy', 'prometheus', 'waybill-rules.yaml'), join(ROOT, 'deploy', 'prometheus', 'vllm-rules.yaml')];
const MODEL = 'sim-model';
const STABLE = '0.9.1';
const CANARY = '0.10.0';
const STABLE_LENGTH_RATE = 0.1;
const CANARY_LENGTH_RATE = 0.3;
const ENGINES = 4;
const WARM_UP = 80;
const REQUESTS = 1200;
const CONCURRENCY = 12;
/** Each client pauses between requests, so the run spans several scrapes. */
const PAUSE_MS = 20;
/** A shared system prompt of several KV blocks: the engines' prefix caches hit, as a chat fleet's do. */
const SYSTEM = 'You are a helpful assistant. Answer briefly and precisely, in plain words. '.repeat(8);

interface Answer {
  readonly status: number;
  readonly finishReason: string | undefined;
  /** The engine's request id (the response id is `chatcmpl-<request id>`). */
  readonly requestId: string | undefined;
}

let prom: PrometheusServer | undefined;
let gateway: Gateway | undefined;
const sims: Simulator[] = [];
/** Which engine (by index) answered each request id. */
const engineOf = new Map<string, number>();
let dir = '';

const server = (): PrometheusServer => {
  if (prom === undefined) throw new Error('Prometheus did not start');
  return prom;
};
const query = (expr: string) => server().query(expr);
const scalar = (expr: string) => server().scalar(expr);
const waitFor = <T>(what: string, ms: number, check: () => Promise<T | undefined>) => server().waitFor(what, ms, check);

async function send(base: string, index: number): Promise<Answer> {
  const response = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: MODEL,
      stream: true,
      messages: [
        { role: 'system', content: SYSTEM },
        { role: 'user', content: `question ${index}` },
      ],
    }),
    headersTimeout: 10_000,
    bodyTimeout: 10_000,
  });
  const body = await response.body.text();
  const reasons = [...body.matchAll(/"finish_reason":"(\w+)"/g)].map((m) => m[1]);
  return { status: response.statusCode, finishReason: reasons.at(-1), requestId: /"id":"chatcmpl-([^"]+)"/.exec(body)?.[1] };
}

/** Every client-side request, in order: the warm-up first. */
const answers: Answer[] = [];

/** Per revision, what the clients saw: choices and `length` ones. */
function truth(of: readonly Answer[]): Map<string, { choices: number; length: number }> {
  const table = new Map<string, { choices: number; length: number }>();
  for (const answer of of) {
    const engine = answer.requestId === undefined ? undefined : engineOf.get(answer.requestId);
    if (engine === undefined || answer.finishReason === undefined) throw new Error(`an answer without its engine or finish reason: ${JSON.stringify(answer)}`);
    const revision = engine === ENGINES - 1 ? CANARY : STABLE;
    const row = table.get(revision) ?? { choices: 0, length: 0 };
    row.choices++;
    if (answer.finishReason === 'length') row.length++;
    table.set(revision, row);
  }
  return table;
}

async function start(): Promise<string> {
  const version = runTool(PROMETHEUS.command, ['--version']);
  if (version.status !== 0) throw new Error(`${PROMETHEUS.command} --version failed:\n${version.output}`);
  for (let i = 0; i < ENGINES; i++) {
    const canary = i === ENGINES - 1;
    const sim = createSimulator({
      engineModel: true,
      outputTokens: 4,
      seed: 100 + i,
      revision: canary ? CANARY : STABLE,
      lengthRate: canary ? CANARY_LENGTH_RATE : STABLE_LENGTH_RATE,
    });
    sim.events.on('request-end', (record: RequestRecord) => engineOf.set(record.requestId, i));
    sims.push(sim);
  }
  const urls = await Promise.all(sims.map(async (sim) => (await sim.listen(0, '127.0.0.1')).url));
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port: 0 },
      // No revision configured: each is read from the engine's GET /version.
      // least_request: every engine gets a share (cache_aware would keep the shared system prompt on one).
      pools: [{ name: 'sim', models: [MODEL], routing: { policy: 'least_request' }, upstreams: urls.map((url, i) => ({ name: `engine-${i}`, url })) }],
      health: { interval: '1h' },
      slo: { ttft: '3s', tpot: '1s' },
      logging: { level: 'silent' },
    },
    'revision-incident',
  );
  gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: true });
  const base = await gateway.listen();
  // Before Prometheus's first scrape, so the series the run increments exist in it (rate() cannot see the increment
  // that creates a series): both revisions, both finish reasons.
  // Random picking may leave a revision without a `length` answer in WARM_UP requests (p < 0.003): go on until not.
  const warmed = () => [STABLE, CANARY].every((revision) => (truth(answers).get(revision)?.length ?? 0) > 0);
  for (let i = 0; i < WARM_UP || (!warmed() && i < 5 * WARM_UP); i++) answers.push(await send(base, -1 - i));

  dir = mkdtempSync(join(tmpdir(), 'waybill-revision-incident-'));
  prom = await PrometheusServer.start(dir, {
    global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
    rule_files: RULES,
    scrape_configs: [
      { job_name: 'waybill', static_configs: [{ targets: [new URL(base).host] }] },
      { job_name: 'vllm', static_configs: [{ targets: urls.map((url) => new URL(url).host) }] },
    ],
  });
  await waitFor('the first scrape of the gateway and the engines', 15_000, async () =>
    (await scalar('count(up == 1)')) === ENGINES + 1 ? true : undefined,
  );
  return base;
}

afterAll(async () => {
  await prom?.stop();
  await gateway?.close();
  await Promise.all(sims.map((sim) => sim.close()));
  if (dir !== '') rmSync(dir, { recursive: true, force: true });
});

describeWithTool(PROMETHEUS, 'incident: one upstream on a new revision answers with `length` three times as often', () => {
  it('the revision comparison flags that revision, its counters are what the clients saw, and no other alert is pending or firing', async () => {
    const base = await start();
    // The warm-up created both revisions' stop and length series.
    const warm = truth(answers);
    expect(warm.get(STABLE)?.length, 'stable length answers in the warm-up').toBeGreaterThan(0);
    expect(warm.get(CANARY)?.length, 'canary length answers in the warm-up').toBeGreaterThan(0);

    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < REQUESTS) {
          answers.push(await send(base, next++));
          await sleep(PAUSE_MS);
        }
      }),
    );
    expect(answers.every((a) => a.status === 200)).toBe(true);
    const seen = truth(answers);

    // A scrape holding every request, then a rule evaluation after it.
    const scraped = await waitFor('Prometheus to scrape every request', 20_000, async () =>
      (await scalar('sum(waybill_choice_finish_reasons_total{job="waybill"})')) === answers.length
        ? await scalar('max(timestamp(waybill_choice_finish_reasons_total{job="waybill"}))')
        : undefined,
    );
    await waitFor('the revision rules to evaluate after the last scrape', 15_000, async () => {
      const at = await scalar(`min(timestamp(model_revision:waybill_length_choices:ratio_rate30m{model="${MODEL}"}))`);
      return at !== undefined && at > scraped + 1 ? true : undefined;
    });

    // Exact: the counters by revision are what the clients saw, per the engine that answered.
    for (const revision of [STABLE, CANARY]) {
      const row = seen.get(revision);
      expect(await scalar(`sum(waybill_choice_finish_reasons_total{revision="${revision}"})`), revision).toBe(row?.choices);
      expect(await scalar(`sum(waybill_choice_finish_reasons_total{revision="${revision}",finish_reason="length"})`), revision).toBe(row?.length);
      expect(await scalar(`sum(waybill_slo_requests_total{revision="${revision}"})`), revision).toBe(row?.choices);
    }
    expect(await scalar(`count(waybill_upstream_revision_info{revision="${STABLE}"})`)).toBe(ENGINES - 1);
    expect(await scalar(`count(waybill_upstream_revision_info{upstream="engine-${ENGINES - 1}",revision="${CANARY}"})`)).toBe(1);

    // The recorded shares, over the run (rate() of counters the warm-up created): near what the engines were told.
    const share = (revision: string) => scalar(`model_revision:waybill_length_choices:ratio_rate30m{model="${MODEL}",revision="${revision}"}`);
    const others = (revision: string) => scalar(`model_revision:waybill_others_length_choices:ratio_rate30m{model="${MODEL}",revision="${revision}"}`);
    const canaryShare = await share(CANARY);
    const stableShare = await share(STABLE);
    const canaryVolume = await scalar(`model_revision:waybill_choices:rate30m{model="${MODEL}",revision="${CANARY}"} * 1800`);
    const clientCanary = seen.get(CANARY);
    const clientStable = seen.get(STABLE);
    console.log(
      `revision incident: ${answers.length} answers; length share, clients (all) vs Prometheus (rate over the run): ` +
        `canary ${((clientCanary?.length ?? 0) / (clientCanary?.choices ?? 1)).toFixed(3)} vs ${canaryShare?.toFixed(3)}, ` +
        `stable ${((clientStable?.length ?? 0) / (clientStable?.choices ?? 1)).toFixed(3)} vs ${stableShare?.toFixed(3)}; ` +
        `canary choices in the window ${canaryVolume?.toFixed(0)}`,
    );
    expect(Math.abs((canaryShare ?? Number.NaN) - CANARY_LENGTH_RATE)).toBeLessThan(0.1);
    expect(Math.abs((stableShare ?? Number.NaN) - STABLE_LENGTH_RATE)).toBeLessThan(0.05);
    expect(await others(CANARY)).toBeCloseTo(stableShare ?? Number.NaN, 12);
    expect(canaryVolume).toBeGreaterThanOrEqual(200);

    // The dashboard's Revisions row on the same data (its variables at All, windows at 5m): every panel answers for
    // both revisions, and the finish-reason panel shows the canary's `length` share as the rule recorded it.
    const panels = (JSON.parse(readFileSync(DASHBOARD, 'utf8')) as { panels: Array<{ type: string; title: string; targets?: Array<{ expr: string }> }> }).panels;
    const rowAt = panels.findIndex((p) => p.type === 'row' && p.title === 'Revisions');
    const rowEnd = panels.findIndex((p, i) => i > rowAt && p.type === 'row');
    const row = panels.slice(rowAt + 1, rowEnd === -1 ? undefined : rowEnd);
    expect(row.length).toBeGreaterThanOrEqual(5);
    for (const panel of row) {
      const result = await query(withoutGrafanaVariables(panel.targets?.[0]?.expr ?? ''));
      expect(new Set(result.map((r) => r.metric['revision'])), panel.title).toEqual(new Set([STABLE, CANARY]));
      if (panel.title === 'Finish-reason shares by revision') {
        const length = result.find((r) => r.metric['revision'] === CANARY && r.metric['finish_reason'] === 'length');
        // Its own 5m window over the same samples: rate()'s extrapolation differs from the rule's 30m in the 5th digit.
        expect(Math.abs(Number(length?.value[1]) - (canaryShare ?? Number.NaN)), panel.title).toBeLessThan(0.005);
      }
    }

    // Every rule evaluated without error on real series.
    const rulesResponse = await request(`${server().base}/api/v1/rules`);
    const rules = (await rulesResponse.body.json()) as { data: { groups: Array<{ rules: Array<{ name: string; health: string; lastError?: string }> }> } };
    for (const rule of rules.data.groups.flatMap((g) => g.rules)) expect(`${rule.name}: ${rule.health} ${rule.lastError ?? ''}`.trim()).toBe(`${rule.name}: ok`);

    // Prometheus's own verdict: the one alert pending (its `for: 10m` has not passed), on the canary, and nothing else.
    const alerts = await query('ALERTS');
    const described = alerts.map((a) => `${a.metric['alertname']}{${Object.entries(a.metric).filter(([k]) => !['__name__', 'alertname'].includes(k)).map(([k, v]) => `${k}="${v}"`).join(',')}}`);
    expect(described).toEqual([`WaybillRevisionLengthShareHigh{alertstate="pending",model="${MODEL}",revision="${CANARY}",severity="warning"}`]);
  }, 60_000);
});
