/**
 * The ledger is exact under load and faults: about 2,000 requests through Waybill in front of three simulators,
 * with a 20% fault mix covering every fault kind, client cancellations before and after the first token, slow
 * requests that miss the SLO, streams and non-streams, chat and legacy completions, n > 1 — and zero mismatches
 * between what the clients saw, what the simulators counted and injected, and what Waybill's metrics say. What a
 * client cannot observe exactly (SLO results within the margin of a threshold, events Waybill reads after a
 * response ended) is compared as bounds, and must stay small and explained (docs/load.md). It holds with both cores
 * of a 2-core machine busy with other work. A second run, through the same gateway and simulators, mixes every
 * route the load tool sends — Responses and Messages (named events, streamed and not), embeddings, rerank and
 * tokenize beside chat and legacy completions — with the faults and cancellations each supports.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { parseMetrics, sumBy } from '../load/reconcile.js';
import { FAULT_KINDS } from '../load/workload.js';

/**
 * Comparisons that are bounds by design rather than races: SLO results near a threshold, connections without a
 * request, and attempts — a request answered with a failure status before any output may have been retried any
 * number of times, and one cancelled before its first token may have left before it was sent upstream.
 */
const BOUNDED_BY_DESIGN: ReadonlySet<string> = new Set(['slo', 'empty_connections', 'attempts_by_route', 'faults_injected', 'requests_with_attempts']);

let gateway: Gateway;
const sims: Simulator[] = [];
const simUrls: string[] = [];
let base: string;
const jsonPath = join(mkdtempSync(join(tmpdir(), 'waybill-reconcile-')), 'mixed.json');

beforeAll(async () => {
  for (let i = 0; i < 3; i++) {
    const sim = createSimulator({ ttftMs: 10, itlMs: 2, outputTokens: 64, jitter: 0.2, seed: i + 1, cachedTokens: 16, promptTokensDetails: true });
    simUrls.push((await sim.listen(0, '127.0.0.1')).url);
    sims.push(sim);
  }
  const config = parseConfig({
    server: { host: '127.0.0.1', port: 0 },
    pools: [{ name: 'sim', models: ['sim-model'], upstreams: simUrls.map((url, i) => ({ name: `sim-${i}`, url })) }],
    // Short clocks so stalls end quickly; slow requests (3 s TTFT) still fit under first_output.
    timeouts: { first_output: '4s', idle: '1s', total: '6s' },
    retries: { backoff_base: '5ms', backoff_max: '20ms' },
    health: { interval: '1h' },
    slo: { ttft: '2s', tpot: '100ms', e2e: '60s' },
    logging: { level: 'silent' },
  });
  gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
  await gateway.listen();
  base = `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await gateway.close();
  await Promise.all(sims.map((sim) => sim.close()));
});

it('reconciles 2,000 requests with a 20% fault mix, cancellations and slow requests: zero mismatches', async () => {
  const args = [
    '--url', base,
    '--model', 'sim-model',
    '--concurrency', '64',
    '--requests', '2000',
    '--seed', '7',
    // A cold process (gateway, simulators and clients are one here) reads its first burst of requests up to ~2 s
    // late on a loaded machine, which no margin covers: warm it up first; those requests are not reconciled.
    '--warmup', '256',
    '--prompt-tokens', '16-2000',
    '--output-tokens', '8-48',
    '--stream-share', '0.85',
    '--chat-share', '0.7',
    '--n', '1-2',
    '--cancel-share', '0.08',
    '--fault-share', '0.2',
    '--slow-share', '0.03',
    '--slo-ttft', '2s', '--slo-tpot', '100ms', '--slo-e2e', '60s',
    '--reconcile',
    '--borderline-margin', '50ms',
    '--quiet',
    ...simUrls.flatMap((url) => ['--sim', url]),
  ];
  const config = await parseLoadArgs(args);
  if ('problems' in config) throw new Error(config.problems.join('\n'));
  const lines: string[] = [];
  const outcome = await runLoadWith(config, (text) => lines.push(text));
  const report = lines.join('\n');
  // The report names every mismatch; none is allowed.
  expect(report).toContain('reconciliation: 0 mismatches');
  expect(outcome.mismatches, report).toBe(0);
  expect(outcome.exitCode).toBe(0);
  // What was compared as an interval stays small and explained. Borderline SLO results (client timing within
  // 50 ms of a threshold): at most 1% of the requests (0 to 3 were seen in runs on a loaded 2-core machine).
  const reconciliation = outcome.reconciliation;
  if (reconciliation === undefined) throw new Error('no reconciliation');
  expect(reconciliation.uncertain['slo'] ?? 0, report).toBeLessThanOrEqual(20);
  expect(report).toMatch(/borderline SLO results \(margin 50 ms\): \d+/);
  // Against the simulator cancellations cannot race the end of an answer, so no request, cancellation or token
  // count is uncertain; the only races are anomalies: events read after a response ended, and (rarely) a malformed
  // event on an answer a deadline cut right where it was sent...
  expect(Object.keys(reconciliation.uncertain).filter((k) => !BOUNDED_BY_DESIGN.has(k)), report).toEqual(['anomalies']);
  // Connections the client's HTTP pool opened and never used (around aborted requests): each may be a 408 `_other`.
  expect(reconciliation.uncertain['empty_connections'] ?? 0, report).toBeLessThanOrEqual(20);
  const boundedAnomalies = reconciliation.bounded.filter((b) => b.what.startsWith('anomalies'));
  for (const b of boundedAnomalies) expect(['data_after_done', 'done_after_error', 'malformed_event'], report).toContain(b.key);
  // ...and Waybill did count those after the end (within its drain grace), so the bounds are not vacuous.
  for (const kind of ['data_after_done', 'done_after_error']) {
    expect(boundedAnomalies.find((b) => b.key === kind)?.waybill ?? 0, `${kind}\n${report}`).toBeGreaterThan(0);
  }
  // And the run exercised what it claims to: every fault kind injected, both cancellation phases, retries.
  const injected: Record<string, number> = {};
  for (const sim of sims) for (const [kind, n] of Object.entries(sim.stats().faultsInjected)) injected[kind] = (injected[kind] ?? 0) + n;
  for (const kind of FAULT_KINDS) expect(injected[kind], kind).toBeGreaterThan(0);
  expect(report).toMatch(/requests=2000/);
  const text = await (await fetch(`${base}/metrics`)).text();
  // Read by label, whatever other labels the series carry.
  const total = (name: string, where: Record<string, string>) => sumBy(parseMetrics(text), name, [], { model: 'sim-model', ...where }).get('') ?? 0;
  expect(total('waybill_client_cancellations_total', { phase: 'before_first_token' })).toBeGreaterThan(0);
  expect(total('waybill_client_cancellations_total', { phase: 'streaming' })).toBeGreaterThan(0);
  expect(total('waybill_retries_total', { reason: 'http_5xx' })).toBeGreaterThan(0);
  expect(total('waybill_slo_requests_total', { result: 'missed_ttft' })).toBeGreaterThan(0);
}, 120_000);

it('reconciles a mix of every route — chat, completions, Responses, Messages, embeddings, rerank, tokenize — with faults and cancellations: zero mismatches', async () => {
  const args = [
    '--url', base,
    '--model', 'sim-model',
    '--concurrency', '32',
    '--requests', '700',
    // Seed 5 plans every fault kind on Responses and Messages streams, the non-stream faults on each route that has
    // them, and both cancellation phases on both event routes (asserted below from the plans).
    '--seed', '5',
    '--warmup', '64',
    '--route-mix', 'chat=0.3,completions=0.1,responses=0.2,messages=0.2,embeddings=0.1,rerank=0.05,tokenize=0.05',
    '--prompt-tokens', '16-2000',
    '--output-tokens', '8-48',
    '--stream-share', '0.8',
    '--n', '1-2',
    '--cancel-share', '0.1',
    '--fault-share', '0.3',
    '--slow-share', '0.03',
    '--slo-ttft', '2s', '--slo-tpot', '100ms', '--slo-e2e', '60s',
    '--reconcile',
    '--borderline-margin', '50ms',
    '--quiet',
    '--json', jsonPath,
    ...simUrls.flatMap((url) => ['--sim', url]),
  ];
  const config = await parseLoadArgs(args);
  if ('problems' in config) throw new Error(config.problems.join('\n'));
  const lines: string[] = [];
  const outcome = await runLoadWith(config, (text) => lines.push(text));
  const report = lines.join('\n');
  expect(report).toContain('reconciliation: 0 mismatches');
  expect(outcome.mismatches, report).toBe(0);
  const reconciliation = outcome.reconciliation;
  if (reconciliation === undefined) throw new Error('no reconciliation');
  expect(reconciliation.uncertain['slo'] ?? 0, report).toBeLessThanOrEqual(10);
  expect(Object.keys(reconciliation.uncertain).filter((k) => !BOUNDED_BY_DESIGN.has(k) && k !== 'anomalies'), report).toEqual([]);
  for (const b of reconciliation.bounded.filter((m) => m.what.startsWith('anomalies'))) {
    expect(['data_after_done', 'done_after_error', 'malformed_event'], report).toContain(b.key);
  }

  // The run exercised what it claims to, on every route.
  const requests = (JSON.parse(readFileSync(jsonPath, 'utf8')) as { requests: PlannedSummary[] }).requests;
  const count = (pick: (r: PlannedSummary) => boolean) => requests.filter(pick).length;
  for (const route of ['chat_completions', 'completions', 'responses', 'messages', 'embeddings', 'rerank', 'tokenize']) {
    expect(count((r) => r.route === route && r.outcome === 'delivered'), route).toBeGreaterThan(0);
    // (Legacy completions' non-stream faults are the first run's.)
    if (route !== 'completions') expect(count((r) => r.route === route && !r.stream && r.fault !== undefined), `${route} non-stream faults`).toBeGreaterThan(0);
  }
  for (const route of ['responses', 'messages']) {
    expect(count((r) => r.route === route && r.stream && r.outcome === 'delivered'), route).toBeGreaterThan(0);
    expect(count((r) => r.route === route && !r.stream && r.outcome === 'delivered'), route).toBeGreaterThan(0);
    for (const kind of FAULT_KINDS) expect(count((r) => r.route === route && r.stream && r.fault === kind), `${route} ${kind}`).toBeGreaterThan(0);
    for (const phase of ['before_first_token', 'streaming']) expect(count((r) => r.route === route && r.cancel === phase), `${route} ${phase}`).toBeGreaterThan(0);
    // vLLM's Responses never sends an error event (an engine error cuts the connection): no stream_error there.
    for (const result of ['incomplete', 'timeout', 'client_cancelled', 'failed', ...(route === 'messages' ? ['stream_error'] : [])]) {
      expect(count((r) => r.route === route && r.outcome === result), `${route} ${result}`).toBeGreaterThan(0);
    }
  }
  expect(report).toMatch(/requests=700/);
  const text = await (await fetch(`${base}/metrics`)).text();
  const delivered = sumBy(parseMetrics(text), 'waybill_requests_total', ['route'], { model: 'sim-model', code: '200', outcome: 'delivered' });
  for (const route of ['responses', 'messages', 'embeddings', 'rerank', 'tokenize']) expect(delivered.get(route) ?? 0, route).toBeGreaterThan(0);
}, 120_000);

interface PlannedSummary {
  readonly route: string;
  readonly stream: boolean;
  readonly fault: string | undefined;
  readonly cancel: string | undefined;
  readonly outcome: string;
}
