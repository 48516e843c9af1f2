/**
 * Incident (1) of issue 25, end to end: four simulated vLLM engines (the engine model) behind a real gateway, a real
 * Prometheus scraping the gateway and the four engines and evaluating deploy/prometheus/waybill-rules.yaml and
 * vllm-rules.yaml. Engine 3 is kept near full KV by other clients' 18 000-token prompts (seen only in its /metrics),
 * and is declared `weight: 8` — the unbalanced routing of seed 002 §7 (a replica declared bigger than its share,
 * shared with other clients), so half of the gateway's picks land on it. Its 16k–64k prompts wait in its queue and
 * miss their TTFT (or time out at the first-output deadline: failed, also not met) while the same prompts on the three
 * other engines meet it. Then:
 * - the per-class page, WaybillGoodputSLOPromptLenFastBurn{prompt_len="16k-64k"}, is pending or firing in Prometheus
 *   (its `for: 2m` is longer than the test: pending means its expression holds);
 * - the dashboard's replica panel (its own query, run on that Prometheus) has sim-3 at the bottom for the class, and
 *   the engines' per-replica panels, joined on Waybill's `upstream` (the scrape sets it, as the PodMonitor does),
 *   put the same replica at the top of KV use and queue time.
 *
 * Margins, with the simulator's jitter off: on engines 0–2 a 20 000-token prompt prefills in 10 steps of 2 048 tokens
 * (≈ 49 ms each) shared with at most a few other long prompts, ≈ 1.5 s at worst against the 2 s threshold; on engine 3
 * it queues behind external prompts that only two at a time fit, held at ≥ 3 waiting before the gateway's traffic
 * starts (the external load outruns the engine, so its queue only grows), ≥ 2 s before its own prefill. A request
 * whose TTFT (the gateway's) is within 300 ms of the threshold is borderline and left unclassified. Without
 * prometheus on PATH the test skips (WAYBILL_REQUIRE_TOOLS=1: fails).
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { request } from 'undici';
import { afterAll, expect, it } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { createRandom } from '../src/util/prng.js';
import { PrometheusServer, waitFor as waitForCheck, type Sample } from './helpers/prometheus-server.js';
import { PROMETHEUS, withoutGrafanaVariables } from './helpers/promql.js';
import { describeWithTool } from './helpers/system-tool.js';

const ROOT = join(import.meta.dirname, '..');
const RULES = ['waybill-rules.yaml', 'vllm-rules.yaml'].map((f) => join(ROOT, 'deploy', 'prometheus', f));
const DASHBOARD = JSON.parse(readFileSync(join(ROOT, 'deploy', 'grafana', 'waybill-dashboard.json'), 'utf8')) as {
  panels: Array<{ title: string; targets?: Array<{ expr: string; refId: string }> }>;
};
const MODEL = 'sim-model';
const LONG_TOKENS = 20_000;
const THRESHOLD_MS = 2_000;
const BORDERLINE_MS = 300;
/** Above the per-class floor of 50 counted requests, with room for the few whose new series rate() cannot see. */
const REQUESTS = 60;
const CONCURRENCY = 8;
const BUSY = 'sim-3';

let prom: PrometheusServer | undefined;
let gateway: Gateway | undefined;
const sims: Simulator[] = [];
let dir = '';

async function query(expr: string): Promise<Sample[]> {
  if (prom === undefined) throw new Error('Prometheus did not start');
  return prom.query(expr);
}

/** Polls until `check` returns a value (Prometheus scrapes and evaluates every second), or fails saying what it waited for. */
function waitFor<T>(what: string, ms: number, check: () => Promise<T | undefined>): Promise<T> {
  return waitForCheck(what, ms, check, () => prom?.log ?? '');
}

/** A dashboard panel's query by title, with Grafana's variables replaced (every model and upstream, 5m). */
function panelQuery(title: string, refId = 'A'): string {
  const panel = DASHBOARD.panels.find((p) => p.title === title);
  const expr = panel?.targets?.find((t) => t.refId === refId)?.expr;
  if (expr === undefined) throw new Error(`no panel "${title}" ${refId}`);
  return withoutGrafanaVariables(expr);
}

afterAll(async () => {
  await prom?.stop();
  await gateway?.close();
  await Promise.all(sims.map((sim) => sim.close()));
  if (dir !== '') rmSync(dir, { recursive: true, force: true });
});

describeWithTool(PROMETHEUS, 'incident (1): one engine of four at high KV use', () => {
  it('the 16k-64k class misses its TTFT on that engine: the per-class page holds and the replica slice names it', async () => {
    const fleet = { engineModel: true, promptTokensDetails: true, jitter: 0, ttftMs: 5, itlMs: 1, outputTokens: 8 } as const;
    for (let i = 0; i < 4; i++) {
      const busy = i === 3 ? { kvBlocks: 2_600, externalLoad: 2, externalPromptTokens: 18_000, externalOutputTokens: 100 } : {};
      sims.push(createSimulator({ ...fleet, seed: 7 + i, ...busy }));
    }
    const urls = await Promise.all(sims.map(async (sim) => (await sim.listen(0, '127.0.0.1')).url));
    const settlements: Settlement[] = [];
    let onAll: (() => void) | undefined;
    const config = parseConfig(
      {
        server: { host: '127.0.0.1', port: 0 },
        pools: [
          {
            name: 'sim',
            models: [MODEL],
            upstreams: urls.map((url, i) => ({ name: `sim-${i}`, url, ...(i === 3 ? { weight: 8 } : {}) })),
            routing: { policy: 'least_request' },
          },
        ],
        slo: { ttft: '500ms', ttft_by_prompt_len: { '16k-64k': `${THRESHOLD_MS}ms` } },
        // One attempt per request and no ejection: each count is one request's own result on one engine.
        retries: { max_attempts: 1 },
        timeouts: { first_output: '4s', idle: '10s', total: '30s' },
        health: { interval: '1h', eject_after_failures: 1000 },
        logging: { level: 'silent' },
      },
      'replica-incident',
    );
    gateway = createGateway(config, {
      // The pairs the picker draws, seeded: engine 3 wins every pair it is in (weight 8 against 1), so its share is
      // the share of the seed's pairs holding it, 33 of 60 here (every run), not a binomial draw around 50% that came down to 19
      // in a CI run, where rate()'s blind spot on new series took the error ratio under the page's 30%.
      random: createRandom(4),
      logger: pino({ level: 'silent' }),
      defaultMetrics: false,
      onSettled: (settlement) => {
        settlements.push(settlement);
        if (settlements.length === REQUESTS) onAll?.();
      },
    });
    const gatewayBase = await gateway.listen();

    dir = mkdtempSync(join(tmpdir(), 'waybill-replica-incident-'));
    prom = await PrometheusServer.start(dir, {
      global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
      rule_files: RULES,
      scrape_configs: [
        { job_name: 'waybill', static_configs: [{ targets: [new URL(gatewayBase).host] }] },
        // What deploy/kubernetes/vllm-podmonitor.yaml's relabelling gives: Waybill's upstream name on each
        // engine's series, and the namespace its pool runs in.
        { job_name: 'vllm', static_configs: urls.map((url, i) => ({ targets: [new URL(url).host], labels: { upstream: `sim-${i}`, namespace: 'fleet' } })) },
      ],
    });
    await waitFor('the first scrape of the gateway and the four engines', 20_000, async () =>
      (await query('sum(up{job=~"waybill|vllm"})'))[0]?.value[1] === '5' ? true : undefined,
    );
    // Engine 3 has other clients queued before the gateway's traffic starts.
    await waitFor('engine 3 to have other clients queued', 20_000, () => Promise.resolve((sims[3]?.engineSnapshot()?.waiting ?? 0) >= 3 ? true : undefined));

    const allSettled = new Promise<void>((resolve) => (onAll = resolve));
    const longPrompt = (i: number) => `${String(i).padStart(4, '0')}${'y'.repeat(LONG_TOKENS * 4 - 4)}`;
    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < REQUESTS) {
          const i = next++;
          const response = await request(`${gatewayBase}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: MODEL, stream: true, messages: [{ role: 'user', content: longPrompt(i) }] }),
            headersTimeout: 30_000,
            bodyTimeout: 30_000,
          });
          await response.body.dump();
        }
      }),
    );
    await allSettled;

    // The ledger: every request in 16k-64k; on the other engines met (unless borderline), on sim-3 not met.
    const borderline = (x: Settlement) => x.ttftMs !== undefined && Math.abs(x.ttftMs - THRESHOLD_MS) < BORDERLINE_MS;
    const on = (x: Settlement) => x.attempts.at(-1)?.upstream ?? '_none';
    const onBusy = settlements.filter((x) => on(x) === BUSY);
    const onOthers = settlements.filter((x) => on(x) !== BUSY);
    console.log(
      `replica incident: ${onBusy.length} of ${REQUESTS} on ${BUSY}; ${JSON.stringify(settlements.map((x) => [on(x), x.slo, Math.round(x.ttftMs ?? -1)]))}`,
    );
    for (const x of settlements) expect(x.promptLen).toBe('16k-64k');
    for (const x of onOthers.filter((y) => !borderline(y))) expect(x.slo, `${on(x)} ${x.ttftMs}`).toBe('met');
    for (const x of onBusy.filter((y) => !borderline(y))) expect(['missed_ttft', 'failed'], `${x.ttftMs}`).toContain(x.slo);
    // Half the picks by weight: enough on sim-3 for the class to burn at the 6x page's 30%, and some elsewhere.
    const missed = settlements.filter((x) => x.slo !== 'met').length;
    expect(missed / REQUESTS).toBeGreaterThan(0.3);
    expect(onOthers.length).toBeGreaterThan(0);

    // Prometheus has every request, then the rules evaluate on that scrape.
    const scraped = await waitFor(`Prometheus to scrape ${REQUESTS} requests`, 20_000, async () => {
      const [row] = await query('sum(waybill_slo_requests_total{prompt_len="16k-64k"})');
      return row?.value[1] === String(REQUESTS) ? row.value[0] : undefined;
    });

    // The per-class page: its expression holds (pending; firing after its `for: 2m`).
    const alert = await waitFor('WaybillGoodputSLOPromptLenFastBurn for 16k-64k', 20_000, async () => {
      const rows = await query('ALERTS{alertname="WaybillGoodputSLOPromptLenFastBurn"}');
      return rows.length > 0 ? rows : undefined;
    });
    expect(alert.map((r) => [r.metric.model, r.metric.prompt_len])).toEqual([[MODEL, '16k-64k']]);
    expect(['pending', 'firing']).toContain(alert[0]?.metric.alertstate);

    // The replica slice names the engine: the dashboard's own panel query, and its recording rule.
    await waitFor('the replica rules to evaluate after the last scrape', 15_000, async () => {
      const [row] = await query('min(timestamp(model_upstream_prompt_len:waybill_slo_attainment:ratio_rate5m))');
      return row !== undefined && Number(row.value[1]) > scraped + 1 ? true : undefined;
    });
    const attainment = (await query(panelQuery('SLO attainment by upstream and prompt length'))).filter((r) => r.metric.prompt_len === '16k-64k');
    const byUpstream = new Map(attainment.map((r) => [r.metric.upstream, Number(r.value[1])]));
    console.log(`attainment by upstream (16k-64k, dashboard panel): ${JSON.stringify([...byUpstream])}`);
    const worst = [...byUpstream].sort((a, b) => a[1] - b[1])[0];
    expect(worst?.[0]).toBe(BUSY);
    const busyBorderline = onBusy.filter(borderline).length;
    expect(worst?.[1] ?? 1).toBeLessThanOrEqual(busyBorderline / Math.max(1, onBusy.length) + 0.05);
    const recorded = await query('bottomk(1, model_upstream_prompt_len:waybill_slo_attainment:ratio_rate5m{prompt_len="16k-64k"})');
    expect(recorded.map((r) => r.metric.upstream)).toEqual([BUSY]);
    // The first output per upstream and class: the other engines' p95 within the threshold. sim-3's attempts mostly
    // time out before any output, and an attempt without output is not observed (they are `failed` in the SLO slice
    // above): its p95 is above the threshold where it has one, and may have none (NaN: no observation rate() saw).
    const firstOutput = (await query(panelQuery('First output p95 by upstream and prompt length'))).filter((r) => r.metric.prompt_len === '16k-64k');
    const p95 = new Map(firstOutput.map((r) => [r.metric.upstream, Number(r.value[1])]));
    console.log(`first output p95 by upstream (16k-64k, dashboard panel): ${JSON.stringify([...p95])}`);
    for (const upstream of ['sim-0', 'sim-1', 'sim-2']) expect(p95.get(upstream), upstream).toBeLessThan(THRESHOLD_MS / 1000);
    const busyP95 = p95.get(BUSY) ?? Number.NaN;
    if (!Number.isNaN(busyP95)) expect(busyP95).toBeGreaterThan(THRESHOLD_MS / 1000);

    // The engine side of the same row, joined on `upstream`: sim-3 at the top of KV use and of queue time.
    const kv = await query(panelQuery('vLLM KV use, waiting and preemptions per replica', 'A'));
    const queue = await query(panelQuery('vLLM queue time p95 per replica'));
    console.log(`engine KV use: ${JSON.stringify(kv.map((r) => [r.metric.upstream, r.value[1]]))}; queue p95: ${JSON.stringify(queue.map((r) => [r.metric.upstream, r.value[1]]))}`);
    expect(kv).toHaveLength(4);
    expect([...kv].sort((a, b) => Number(b.value[1]) - Number(a.value[1]))[0]?.metric.upstream).toBe(BUSY);
    expect([...queue].sort((a, b) => Number(b.value[1]) - Number(a.value[1]))[0]?.metric.upstream).toBe(BUSY);
    // docs/observability.md's join: the long-prompt attainment of the replicas at high KV use is sim-3's alone.
    const joined = await query(
      'model_upstream_prompt_len:waybill_slo_attainment:ratio_rate5m{prompt_len="16k-64k"} and on (upstream) (max by (upstream) (avg_over_time(vllm:kv_cache_usage_perc{job="vllm"}[5m])) > 0.5)',
    );
    expect(joined.map((r) => r.metric.upstream)).toEqual([BUSY]);
  }, 90_000);
});
