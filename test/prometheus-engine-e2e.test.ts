/**
 * The engine-side rules against a real Prometheus (skipped without one; WAYBILL_REQUIRE_TOOLS=1: fails): it scrapes a
 * gateway with an admission queue and the two simulated vLLMs behind it (job `vllm`, the simulator's engine model and
 * its vLLM /metrics), evaluates both rule files, and checks what they record against what the clients saw: the
 * engines' `length` share beside Waybill's, each engine's prefix-cache state, and a restart as cache-reset evidence.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { request } from 'undici';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { PrometheusServer } from './helpers/prometheus-server.js';
import { PROMETHEUS, runTool } from './helpers/promql.js';
import { describeWithTool } from './helpers/system-tool.js';

const ROOT = join(import.meta.dirname, '..');
const RULES = [join(ROOT, 'deploy', 'prometheus', 'waybill-rules.yaml'), join(ROOT, 'deploy', 'prometheus', 'vllm-rules.yaml')];
const MODEL = 'sim-model';
/** Every LENGTH_EVERY-th request asks for fewer tokens than the simulator writes: finish_reason `length`. */
const LENGTH_EVERY = 3;
const REQUESTS = 60;

let prom: PrometheusServer | undefined;
let gateway: Gateway | undefined;
let gatewayBase = '';
const sims: Simulator[] = [];
const simHosts: string[] = [];
let dir = '';
let missing: Error | undefined;
const finishReasons: string[] = [];

const server = (): PrometheusServer => {
  if (prom === undefined) throw new Error('Prometheus did not start');
  return prom;
};
const query = (expr: string) => server().query(expr);
const range = (selector: string) => server().range(selector);
const scalar = (expr: string) => server().scalar(expr);
const waitFor = <T>(what: string, ms: number, check: () => Promise<T | undefined>) => server().waitFor(what, ms, check);

/** One non-streamed chat request; returns the finish_reason the client got. */
async function send(index: number): Promise<string> {
  const response = await request(`${gatewayBase}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: `request ${index}` }], ...(index % LENGTH_EVERY === 0 ? { max_tokens: 2 } : {}) }),
  });
  const body = (await response.body.json()) as { choices?: Array<{ finish_reason?: string }> };
  expect(response.statusCode).toBe(200);
  const reason = body.choices?.[0]?.finish_reason ?? 'none';
  finishReasons.push(reason);
  return reason;
}

beforeAll(async () => {
  try {
    const version = runTool(PROMETHEUS.command, ['--version']);
    if (version.status !== 0) throw new Error(`${PROMETHEUS.command} --version failed:\n${version.output}`);
  } catch (err) {
    missing = err as Error;
    return;
  }
  for (const seed of [3, 5]) sims.push(createSimulator({ engineModel: true, kvCacheMetrics: true, outputTokens: 6, jitter: 0, seed }));
  const urls = await Promise.all(sims.map(async (sim) => (await sim.listen(0, '127.0.0.1')).url));
  for (const url of urls) simHosts.push(new URL(url).host);
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'sim', models: [MODEL], upstreams: urls.map((url, i) => ({ name: `sim-${i}`, url })), admission: { max_inflight: 1, max_queue: 64, queue_timeout: '30s' } }],
      health: { interval: '1h' },
      logging: { level: 'silent' },
    },
    'e2e-engine',
  );
  gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
  gatewayBase = await gateway.listen();
  // Both finish reasons before Prometheus starts: rate() cannot see the increment that creates a Waybill series.
  await send(0);
  await send(1);

  dir = mkdtempSync(join(tmpdir(), 'waybill-prometheus-engine-'));
  prom = await PrometheusServer.start(dir, {
    global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
    rule_files: RULES,
    scrape_configs: [
      { job_name: 'waybill', static_configs: [{ targets: [new URL(gatewayBase).host] }] },
      { job_name: 'vllm', static_configs: [{ targets: simHosts }] },
    ],
  });
  await waitFor('the first scrapes', 15_000, async () => ((await scalar('count(up == 1)')) === 3 ? true : undefined));
}, 45_000);

afterAll(async () => {
  await prom?.stop();
  await gateway?.close();
  await Promise.all(sims.map((sim) => sim.close()));
  if (dir !== '') rmSync(dir, { recursive: true, force: true });
});

describeWithTool(PROMETHEUS, 'the engine-side rules on a real Prometheus', () => {
  it("records the engines' finish-reason shares beside Waybill's, each engine's cache state, and a restart", async () => {
    if (missing !== undefined) throw missing;
    // Six clients through a gate of one: a queue forms at the gateway.
    let next = 2;
    await Promise.all(
      Array.from({ length: 6 }, async () => {
        while (next < REQUESTS) await send(next++);
      }),
    );
    const lengths = finishReasons.filter((r) => r === 'length').length;
    expect(lengths).toBe(REQUESTS / LENGTH_EVERY);
    expect(finishReasons.filter((r) => r === 'stop')).toHaveLength(REQUESTS - lengths);

    // The engines counted what the clients saw, by vLLM's finished_reason.
    await waitFor('the engines\' counters to be scraped whole', 20_000, async () =>
      (await scalar('sum(vllm:request_success_total{job="vllm"})')) === REQUESTS ? true : undefined,
    );
    expect(await scalar('sum(vllm:request_success_total{job="vllm",finished_reason="length"})')).toBe(lengths);
    expect(await scalar('sum(vllm:request_success_total{job="vllm",finished_reason=~"abort|error|repetition"})')).toBe(0);
    const scraped = (await scalar('max(timestamp(vllm:request_success_total{job="vllm"}))')) ?? 0;
    await waitFor('the rules to evaluate after that scrape', 15_000, async () => {
      const at = await scalar(`min(timestamp(model_name_finished_reason:vllm_request_success:ratio_rate5m{finished_reason="length"}))`);
      return at !== undefined && at > scraped + 1 ? true : undefined;
    });
    // One share per model (no cluster/namespace labels here), next to Waybill's of the same requests.
    const engineLength = await scalar(`model_name_finished_reason:vllm_request_success:ratio_rate5m{model_name="${MODEL}",finished_reason="length"}`);
    const waybillLength = await scalar(`model_finish_reason:waybill_choices:ratio_rate5m{model="${MODEL}",finish_reason="length"}`);
    console.log(`engine e2e: ${lengths}/${REQUESTS} length; recorded length share: engines ${engineLength?.toFixed(4)}, Waybill ${waybillLength?.toFixed(4)}`);
    expect(Math.abs((engineLength ?? Number.NaN) - 1 / LENGTH_EVERY)).toBeLessThan(0.1);
    expect(Math.abs((waybillLength ?? Number.NaN) - 1 / LENGTH_EVERY)).toBeLessThan(0.1);
    expect(await scalar(`model_name_finished_reason:vllm_request_success:ratio_rate5m{model_name="${MODEL}",finished_reason="error"}`)).toBe(0);

    // The gateway's queue signals are scraped, and both engines are classified: a few prompts over a 30m window are
    // far under 50 queried tokens a second, so both are idle (caching on, too little to judge).
    // Every scrape read the queue gauges together: each waiter's prompt ("request N", 9-10 characters) is 3 tokens
    // at 4 characters a token, and someone waited exactly when the queue was not empty.
    const samples = async (name: string) => new Map((await range(`${name}{model="${MODEL}"}[5m]`)).map(([at, value]) => [at, value]));
    const depth = await samples('waybill_queue_depth');
    const tokens = await samples('waybill_queue_prompt_tokens');
    const oldest = await samples('waybill_queue_oldest_wait_seconds');
    expect([...depth.values()].some((d) => d > 0)).toBe(true);
    for (const [at, d] of depth) {
      expect(tokens.get(at), `at ${at}`).toBe(3 * d);
      expect((oldest.get(at) ?? Number.NaN) > 0, `at ${at}`).toBe(d > 0);
    }
    console.log(`engine e2e: queue over ${depth.size} scrapes, peaks: depth ${Math.max(...depth.values())}, oldest wait ${Math.max(...oldest.values()).toFixed(3)} s, prompt tokens ${Math.max(...tokens.values())}`);
    expect(await scalar(`waybill_queue_oldest_wait_seconds{model="${MODEL}"}`)).toBe(0);
    expect(await scalar(`waybill_queue_prompt_tokens{model="${MODEL}"}`)).toBe(0);
    const states = await query('instance_engine:vllm_prefix_cache_state:class');
    expect(states.map((s) => `${s.metric['instance'] ?? ''} ${s.metric['state'] ?? ''}`).sort()).toEqual(simHosts.map((host) => `${host} idle`).sort());

    // A restart of one engine (its process start time moves; the old one was scraped above): reset evidence for that
    // target only.
    sims[1]?.restart();
    const firing = await waitFor('VllmCacheResetActivity to fire', 20_000, async () => {
      const alerts = await query('ALERTS{alertname="VllmCacheResetActivity",alertstate="firing"}');
      return alerts.length > 0 ? alerts : undefined;
    });
    expect(firing.map((a) => [a.metric['instance'], a.metric['evidence']])).toEqual([[simHosts[1], 'process_restart']]);

    // Every rule of both files evaluated without error against real Waybill and simulator series.
    const rulesResponse = await request(`${server().base}/api/v1/rules`);
    const rules = (await rulesResponse.body.json()) as { data: { groups: Array<{ rules: Array<{ name: string; health: string; lastError?: string }> }> } };
    const evaluated = rules.data.groups.flatMap((g) => g.rules);
    for (const rule of evaluated) expect(`${rule.name}: ${rule.health} ${rule.lastError ?? ''}`.trim()).toBe(`${rule.name}: ok`);
  }, 90_000);
});
