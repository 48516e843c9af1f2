import { ROUTE_SHARE_RESULTS } from '../src/routing/route-bus.js';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { RequestLedger } from './helpers/ledger-driver.js';
import {
  ANOMALY_KINDS,
  ATTEMPT_RESULTS,
  CANCEL_PHASES,
  CHECK_RESULTS,
  CHECK_VERDICTS,
  OUTPUT_CHECKS,
  EJECTION_REASONS,
  FINISH_REASONS,
  RETRY_REASONS,
  OUTCOMES,
  ROUTES,
  SLO_RESULTS,
} from '../src/accounting/outcomes.js';
import { promptLenClasses } from '../src/accounting/prompt-len.js';
import { classifyEventData } from '../src/sse/classify.js';
import { requestInfo } from './helpers/ledger-info.js';
import { INTERNAL_ERROR_COMPONENTS } from '../src/telemetry/guard.js';
import { CONFIG_RELOAD_RESULTS, ENGINE_RESTART_CAUSES, EVALUATOR_TOKEN_KINDS, GatewayMetrics, METRICS, REQUEST_ATTEMPTS_BUCKETS, SESSION_GAP_LABELS } from '../src/telemetry/metrics.js';
import { SCRAPE_RESULTS } from '../src/routing/engine-signals.js';
import { PICK_REASONS } from '../src/routing/score.js';
import { LIMIT_NAMES } from '../src/proxy/tenant-limits.js';
import { LIMIT_STORE_OPS } from '../src/proxy/redis-limit-store.js';
import { ModelLabels } from '../src/proxy/model-labels.js';

const doc = readFileSync(new URL('../docs/metrics.md', import.meta.url), 'utf8');

/** Rows of the first table under "## Metrics". */
function metricRows(): Array<{ name: string; type: string; labels: string[] }> {
  const section = doc.split('## Metrics')[1]?.split('\n## ')[0] ?? '';
  return section
    .split('\n')
    .filter((line) => line.startsWith('| `'))
    .map((line) => {
      const cells = line.split('|').map((c) => c.trim());
      return {
        name: (cells[1] ?? '').replaceAll('`', ''),
        type: cells[2] ?? '',
        labels: (cells[3] ?? '').split(',').map((l) => l.trim()).filter((l) => l !== '' && l !== '—'),
      };
    });
}

/** The bullet for a label under "## Label values", with its wrapped and nested lines. */
function labelBullet(label: string, nth = 0): string {
  const section = doc.split('## Label values')[1]?.split('\n## ')[0] ?? '';
  const bullets = section.split(/\n(?=- `)/).filter((b) => b.startsWith(`- \`${label}\``));
  return bullets[nth] ?? '';
}

function backticked(text: string): string[] {
  return [...text.matchAll(/`([^`]+)`/g)].map((m) => m[1] ?? '');
}

/** Values listed on the bullet's own (possibly wrapped) first paragraph, before any ' — ' explanation. */
function listedValues(label: string, nth = 0): string[] {
  const bullet = labelBullet(label, nth);
  const firstParagraph = (bullet.split(/\n\s+- /)[0] ?? '').split(' — ')[0] ?? '';
  const afterColon = firstParagraph.slice(firstParagraph.indexOf(':') + 1);
  return backticked(afterColon);
}

describe('docs/metrics.md and the code agree', () => {
  it('lists exactly the metrics the code defines, with the same types and labels', () => {
    const rows = metricRows();
    const specs = Object.values(METRICS);
    expect(rows.map((r) => r.name).sort()).toEqual(specs.map((s) => s.name).sort());
    for (const spec of specs) {
      const row = rows.find((r) => r.name === spec.name);
      expect(row, spec.name).toBeDefined();
      expect(row?.type, spec.name).toBe(spec.type);
      expect(row?.labels, spec.name).toEqual([...spec.labels]);
    }
    expect(doc).toContain(`buckets ${REQUEST_ATTEMPTS_BUCKETS.join(',')}`);
  });

  it('lists exactly the closed label value sets of the code', () => {
    expect(listedValues('route')).toEqual([...ROUTES]);
    expect(listedValues('stream')).toEqual(['true', 'false']);
    expect(listedValues('result', 0)).toEqual([...ATTEMPT_RESULTS]);
    expect(listedValues('kind')).toEqual([...ANOMALY_KINDS]);
    expect(listedValues('finish_reason')).toEqual([...FINISH_REASONS]);
    expect(listedValues('phase')).toEqual([...CANCEL_PHASES]);
    expect(listedValues('result', 1)).toEqual([...SLO_RESULTS]);
    expect(listedValues('check')).toEqual([...OUTPUT_CHECKS]);
    expect(listedValues('result', 2)).toEqual([...CHECK_RESULTS]);
    expect(listedValues('reason', 0)).toEqual([...RETRY_REASONS]);
    expect(listedValues('reason', 1)).toEqual([...EJECTION_REASONS]);
    expect(listedValues('component')).toEqual([...INTERNAL_ERROR_COMPONENTS]);
    expect(listedValues('probe')).toEqual(['health', 'discovery']);
    expect(listedValues('limit')).toEqual([...LIMIT_NAMES]);
    expect(listedValues('op')).toEqual([...LIMIT_STORE_OPS]);
    expect(listedValues('store')).toEqual(['redis']);
    expect(listedValues('result', 3)).toEqual([...CONFIG_RELOAD_RESULTS]);
    expect(listedValues('policy')).toEqual(['cache_aware', 'least_request']);
    expect(listedValues('reason', 2)).toEqual([...PICK_REASONS]);
    expect(listedValues('gap')).toEqual([...SESSION_GAP_LABELS]);
    expect(listedValues('result', 4)).toEqual([...SCRAPE_RESULTS]);
    expect(listedValues('result', 5)).toEqual([...ROUTE_SHARE_RESULTS]);
    expect(listedValues('cause')).toEqual([...ENGINE_RESTART_CAUSES]);
    expect(listedValues('verdict')).toEqual([...CHECK_VERDICTS]);
    expect(listedValues('kind', 1)).toEqual([...EVALUATOR_TOKEN_KINDS]);
    const outcomeItems = labelBullet('outcome')
      .split('\n')
      .filter((line) => /^\s+- `/.test(line))
      .map((line) => backticked(line)[0]);
    expect(outcomeItems).toEqual([...OUTCOMES]);
    expect(listedValues('prompt_len')).toEqual(promptLenClasses([1024, 4096, 16384, 65536]));
  });

  it('documents a clock for every histogram', () => {
    const clocks = doc.split('## Where each clock starts and stops')[1]?.split('\n## ')[0] ?? '';
    for (const spec of Object.values(METRICS).filter((s) => s.type === 'histogram')) {
      expect(clocks, spec.name).toContain(`| \`${spec.name}\` |`);
    }
  });
});

describe('the exported text carries exactly the contracted label names', () => {
  it('emits every series with the documented labels and help', async () => {
    const metrics = new GatewayMetrics({ ttft: [1], itl: [1], tpot: [1], duration: [1], queueWait: [1] }, { defaultMetrics: false });
    metrics.labelRevisions((upstream) => (upstream === 'u0' ? '0.9.1' : 'not-u0'));
    const ledger = new RequestLedger(
      requestInfo({ slo: { ttftMs: 1000, tpotMs: 100, e2eMs: 1000, ttftByPromptLenMs: {} }, promptLenBoundaries: [1024], promptLenClasses: promptLenClasses([1024]) }),
      0,
      { onInterTokenGap: (ms) => metrics.interTokenLatency('m').observe(ms / 1000) },
    );
    const inflightLabel = metrics.requestStarted('m');
    ledger.startAttempt(0, 'u0');
    ledger.responseStarted(1, 200);
    for (const [at, data] of [
      [10, '{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'],
      [20, '{"id":"broken'],
      [30, '{"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}'],
      [30, '{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":3}}}'],
      [31, '[DONE]'],
    ] as const) {
      ledger.streamEvent(at, classifyEventData(data));
    }
    ledger.streamEnded(32, 'eof');
    ledger.clientEnded(31);
    metrics.record(ledger.settle(32), inflightLabel);
    // A client SDK's retry (x-stainless-retry-count 1), cancelled.
    const cancelled = new RequestLedger({ ...ledger.info, clientRetry: 1 }, 0);
    cancelled.clientCancelled(5);
    metrics.record(cancelled.settle(5), undefined);
    const miss = new RequestLedger({ ...ledger.info, stream: false }, 0);
    miss.startAttempt(0, 'u0');
    miss.bodyReceived(1, 200, classifyEventData('{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}'));
    miss.clientEnded(1);
    metrics.record(miss.settle(1), undefined);
    metrics.retryMade('m', 'reset');
    metrics.retryBudgetSpent('m');
    metrics.upstreamEjected('u0', 'consecutive_failures');
    metrics.queueWaited('m', 20);
    metrics.internalError('hook');
    metrics.probeFailed('u0', 'discovery');
    metrics.readStopped('u0', 'discovery', 'too_large');
    metrics.discoveredModelsRefusedBy('pool-a', 2);
    metrics.evaluationSampled('m', 1_700_000_000_500);
    // Evaluator traffic, of its own model so the counts above stay: counted apart, never in the acceptance counters.
    const evaluator = new RequestLedger({ ...ledger.info, model: 'e', stream: false, evaluator: true }, 0);
    evaluator.startAttempt(0, 'u0');
    evaluator.bodyReceived(2, 200, classifyEventData('{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":4}}'));
    evaluator.clientEnded(2);
    metrics.record(evaluator.settle(2), undefined);
    metrics.rateLimited('team-a', 'tokens');
    metrics.limitStoreError('reserve');
    metrics.limitStoreUp('redis', false);
    metrics.backgroundHolding(1);
    metrics.backgroundHoldEnded('ended');
    metrics.configReloaded('ok');
    metrics.configInForce('0123456789ab');
    metrics.turnYielded();
    // A cache_aware pool naming sessions (pools[].routing.session_header): only then are the session series declared.
    metrics.declareRouting({ models: () => ['r'], poolFor: () => ({ config: { name: 'pool-a', routing: { policy: 'cache_aware', sessionHeader: 'x-session-id' } } }) });
    // A routed request of its own model, so the other assertions' counts stay as they are.
    const routed = new RequestLedger({ ...ledger.info, model: 'r', stream: false }, 0);
    routed.startAttempt(0, 'u0');
    routed.bodyReceived(1, 200, classifyEventData('{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":16}}}'));
    routed.clientEnded(1);
    const sessionGap = { gapClass: '10s-1m', gapMs: 12_000 };
    metrics.record({ ...routed.settle(1), routing: { pool: 'pool-a', policy: 'cache_aware', reason: 'prefix', predictedCachedTokens: 32, usageReportsCachedTokens: false, sessionGap } }, undefined);
    metrics.routingDecision('r', 'pool-a', 'cache_aware', 'prefix');
    metrics.sessionGap('r', 'pool-a', sessionGap.gapMs);
    metrics.engineScraped('u0', 'ok');
    metrics.engineRestarted('u0', 'start_time');
    metrics.routeShared('received');
    metrics.observe({
      upstreams: () => [{ name: 'u0', up: true, inflight: 2 }],
      queues: () => [{ model: 'm', depth: 3 }],
      engineSignals: () => [{ name: 'u0', fresh: true, ageSeconds: 0.5 }],
      revisions: () => [{ pool: 'pool-a', upstream: 'u0', revision: '0.9.1' }],
      routingIndexes: () => [{ pool: 'pool-a', entries: 37 }],
    });

    const text = await metrics.registry.metrics();
    for (const spec of Object.values(METRICS)) {
      expect(text, spec.name).toContain(`# HELP ${spec.name} ${spec.help}`);
      expect(text, spec.name).toContain(`# TYPE ${spec.name} ${spec.type}`);
      const series = text
        .split('\n')
        .filter((line) => line.startsWith(`${spec.name}{`) || line.startsWith(`${spec.name} `) || line.startsWith(`${spec.name}_bucket{`));
      expect(series.length, spec.name).toBeGreaterThan(0);
      for (const line of series) {
        const labelText = line.includes('{') ? line.slice(line.indexOf('{') + 1, line.indexOf('}')) : '';
        const labels = [...labelText.matchAll(/(\w+)="/g)].map((m) => m[1]);
        expect(labels.filter((l) => l !== 'le'), line).toEqual([...spec.labels]);
      }
    }
    // Values, not just presence.
    expect(text).toContain('waybill_turn_yields_total 1');
    expect(text).toContain('waybill_requests_total{model="m",tenant="_anonymous",route="chat_completions",stream="true",code="200",outcome="delivered"} 1');
    expect(text).toContain('waybill_requests_total{model="m",tenant="_anonymous",route="chat_completions",stream="true",code="499",outcome="client_cancelled"} 1');
    expect(text).toContain('waybill_stream_anomalies_total{model="m",upstream="u0",kind="malformed_event"} 1');
    expect(text).toContain('waybill_cached_prompt_tokens_total{model="m",tenant="_anonymous"} 3');
    expect(text).toContain('waybill_usage_missing_total{model="m",tenant="_anonymous"} 1');
    // Usage without cached tokens, from no pool that declares them: unknown, not 0.
    expect(text).toContain('waybill_cached_tokens_missing_total{model="e",tenant="_anonymous"} 1');
    expect(text).not.toContain('waybill_cached_prompt_tokens_total{model="e"');
    expect(text).toContain('waybill_evaluator_requests_total{model="e",tenant="_anonymous",outcome="delivered"} 1');
    expect(text).toContain('waybill_evaluator_tokens_total{model="e",kind="prompt"} 11');
    expect(text).toContain('waybill_evaluator_tokens_total{model="e",kind="completion"} 4');
    expect(text).toContain('waybill_evaluator_request_duration_seconds_sum{model="e"} 0.002');
    expect(text).not.toContain('waybill_output_checks_total{model="e"');
    expect(text).not.toContain('waybill_requests_accepted_total{model="e"');
    expect(text).not.toContain('waybill_requests_checked_total{model="e"');
    expect(text).toContain('waybill_requests_checked_total{model="m",tenant="_anonymous",route="chat_completions",stream="true",verdict="accepted"} 1');
    expect(text).toContain('waybill_evaluation_last_sample_timestamp_seconds{model="m"} 1700000000.5');
    expect(text).toContain('waybill_inflight_requests{model="m"} 0');
    expect(text).toContain('waybill_inter_token_latency_seconds_count{model="m"} 1');
    expect(text).toContain('waybill_time_per_output_token_seconds_sum{model="m",revision="0.9.1"} 0.02');
    expect(text).toContain('waybill_upstream_up{upstream="u0"} 1');
    expect(text).toContain('waybill_upstream_inflight{upstream="u0"} 2');
    expect(text).toContain('waybill_queue_depth{model="m"} 3');
    expect(text).toContain('waybill_queue_wait_seconds_sum{model="m"} 0.02');
    expect(text).toContain('waybill_internal_errors_total{component="hook"} 1');
    // Per upstream and prompt-length class (the replica slice); the SLO counter names the last attempt's upstream, and
    // `_none` for a request that made none (the cancelled one, before any attempt).
    expect(text).toContain('waybill_upstream_first_output_seconds_count{model="m",upstream="u0",prompt_len="0-1k"} 1');
    expect(text).toContain('waybill_slo_requests_total{model="m",tenant="_anonymous",prompt_len="0-1k",result="met",upstream="u0",revision="0.9.1"} 1');
    expect(text).toContain('waybill_slo_requests_total{model="m",tenant="_anonymous",prompt_len="unknown",result="excluded",upstream="_none",revision="_none"} 1');
    expect(text).toContain('waybill_build_info{version="unknown",revision="unknown"} 1');
    expect(text).toContain('waybill_internal_errors_total{component="exchange"} 0');
    expect(text).toContain('waybill_upstream_probe_failures_total{upstream="u0",probe="discovery"} 1');
    // Two delivered responses of one choice each, no contract: answer present, finished, format unevaluated; accepted.
    expect(text).toContain('waybill_output_checks_total{model="m",check="answer_present",result="pass",revision="0.9.1"} 2');
    expect(text).toContain('waybill_output_checks_total{model="m",check="not_truncated",result="pass",revision="0.9.1"} 2');
    expect(text).toContain('waybill_output_checks_total{model="m",check="format_valid",result="unevaluated",revision="0.9.1"} 2');
    // The revision of the upstream that answered; a request that reached none (the cancelled one) under _none.
    expect(text).toContain('waybill_choice_finish_reasons_total{model="m",finish_reason="stop",revision="0.9.1"} 2');
    expect(text).toContain('waybill_upstream_revision_info{pool="pool-a",upstream="u0",revision="0.9.1"} 1');
    expect(text).toContain('waybill_routing_index_entries{pool="pool-a"} 37');
    expect(text).toContain('waybill_routing_shared_messages_total{result="received"} 1');
    expect(text).toContain('waybill_requests_accepted_total{model="m",tenant="_anonymous",route="chat_completions",stream="true"} 1');
    expect(text).toContain('waybill_requests_accepted_total{model="m",tenant="_anonymous",route="chat_completions",stream="false"} 1');
    expect(text).toContain('waybill_evaluation_samples_total{model="m"} 1');
    expect(text).toContain('waybill_rate_limited_total{tenant="team-a",limit="tokens"} 1');
    expect(text).toContain('waybill_limit_store_errors_total{op="reserve"} 1');
    expect(text).toContain('waybill_limit_store_up{store="redis"} 0');
    expect(text).toContain('waybill_routing_decisions_total{model="r",pool="pool-a",policy="cache_aware",reason="prefix"} 1');
    expect(text).toContain('waybill_routing_decisions_total{model="r",pool="pool-a",policy="cache_aware",reason="session"} 0');
    expect(text).not.toContain('policy="least_request"');
    expect(text).toContain('waybill_routing_prompt_tokens_total{model="r",pool="pool-a"} 40');
    expect(text).toContain('waybill_routing_predicted_cached_tokens_total{model="r",pool="pool-a"} 32');
    expect(text).toContain('waybill_routing_cached_tokens_total{model="r",pool="pool-a"} 16');
    expect(text).toContain('waybill_routing_session_prompt_tokens_total{model="r",pool="pool-a",gap="10s-1m"} 40');
    expect(text).toContain('waybill_routing_session_cached_tokens_total{model="r",pool="pool-a",gap="first"} 0');
    expect(text).toContain('waybill_routing_session_idle_gap_seconds_bucket{le="30",model="r",pool="pool-a"} 1');
    expect(text).toContain('waybill_upstream_engine_signals_up{upstream="u0"} 1');
    expect(text).toContain('waybill_upstream_engine_signal_age_seconds{upstream="u0"} 0.5');
    expect(text).toContain('waybill_upstream_engine_scrapes_total{upstream="u0",result="ok"} 1');
    expect(text).toContain('waybill_upstream_engine_restarts_total{upstream="u0",cause="start_time"} 1');
  });

  it('counts an absent cached-tokens detail as 0 only where the pool declares its upstreams report them', async () => {
    const metrics = new GatewayMetrics({ ttft: [1], itl: [1], tpot: [1], duration: [1], queueWait: [1] }, { defaultMetrics: false });
    const base = requestInfo({ slo: { ttftMs: 1000, tpotMs: 100, e2eMs: 1000, ttftByPromptLenMs: {} }, promptLenBoundaries: [1024], promptLenClasses: promptLenClasses([1024]), stream: false });
    const settle = (tenant: string) => {
      const ledger = new RequestLedger({ ...base, tenant }, 0);
      ledger.startAttempt(0, 'u0');
      ledger.bodyReceived(1, 200, classifyEventData('{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":1}}'));
      ledger.clientEnded(1);
      return ledger.settle(1);
    };
    const routing = (declared: boolean) => ({ pool: 'p', policy: 'least_request', reason: 'single', predictedCachedTokens: 0, usageReportsCachedTokens: declared });
    metrics.record({ ...settle('declared'), routing: routing(true) }, undefined);
    metrics.record({ ...settle('undeclared'), routing: routing(false) }, undefined);
    const text = await metrics.registry.metrics();
    expect(text).toContain('waybill_cached_prompt_tokens_total{model="m",tenant="declared"} 0');
    expect(text).not.toContain('waybill_cached_tokens_missing_total{model="m",tenant="declared"}');
    expect(text).toContain('waybill_cached_tokens_missing_total{model="m",tenant="undeclared"} 1');
    expect(text).not.toContain('waybill_cached_prompt_tokens_total{model="m",tenant="undeclared"}');
  });

  it('declares the routing series a pool can give, at zero: no session series without a session_header', async () => {
    const metrics = new GatewayMetrics({ ttft: [1], itl: [1], tpot: [1], duration: [1], queueWait: [1] }, { defaultMetrics: false });
    const pools: Record<string, { name: string; routing: { policy: 'cache_aware' | 'least_request' } }> = {
      a: { name: 'pool-a', routing: { policy: 'least_request' } },
      b: { name: 'pool-b', routing: { policy: 'cache_aware' } },
    };
    metrics.declareRouting({ models: () => ['a', 'b'], poolFor: (model) => (pools[model] === undefined ? undefined : { config: pools[model] }) });
    const text = await metrics.registry.metrics();
    const reasons = (model: string) => [...text.matchAll(new RegExp(`waybill_routing_decisions_total\\{model="${model}",[^}]*reason="(\\w+)"\\} 0`, 'g'))].map((m) => m[1]);
    expect(reasons('a')).toEqual(['load', 'single']);
    expect(reasons('b')).toEqual(PICK_REASONS.filter((r) => r !== 'session'));
    expect(text).toContain('waybill_routing_prompt_tokens_total{model="a",pool="pool-a"} 0');
    expect(text).toContain('waybill_routing_cached_tokens_total{model="b",pool="pool-b"} 0');
    expect(text).not.toContain('waybill_routing_session_prompt_tokens_total{');
    expect(text).not.toContain('waybill_routing_session_idle_gap_seconds_bucket{');
  });
});

describe('waybill_inflight_requests takes a request off the series it was counted under', () => {
  it('a name that gets a label while its request is in flight: _other back to 0, the new label never −1', async () => {
    const metrics = new GatewayMetrics({ ttft: [1], itl: [1], tpot: [1], duration: [1], queueWait: [1] }, { defaultMetrics: false });
    const labels = new ModelLabels();
    metrics.labelModels((model) => labels.label(model));
    labels.admit('pool-a', 0, ['late']); // pool A's cap is full: `late` is counted under _other
    const inflightLabel = metrics.requestStarted('late');
    expect(inflightLabel).toBe('_other');
    labels.admit('pool-b', 1, ['late']); // pool B (or a reload) gives it a label of its own meanwhile
    const ledger = new RequestLedger(requestInfo({ model: 'late' }), 0);
    ledger.clientCancelled(5);
    metrics.record(ledger.settle(5), inflightLabel);
    const text = await metrics.registry.metrics();
    const value = (model: string) => text.split('\n').find((line) => line.startsWith(`waybill_inflight_requests{model="${model}"}`))?.split(' ')[1];
    expect(value('_other')).toBe('0');
    expect(value('late') ?? '0').toBe('0');
  });
});
