import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { RequestLedger } from '../src/accounting/ledger.js';
import {
  ANOMALY_KINDS,
  ATTEMPT_RESULTS,
  CANCEL_PHASES,
  CHECK_RESULTS,
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
import { CONFIG_RELOAD_RESULTS, GatewayMetrics, METRICS, REQUEST_ATTEMPTS_BUCKETS } from '../src/telemetry/metrics.js';
import { LIMIT_NAMES } from '../src/proxy/tenant-limits.js';
import { LIMIT_STORE_OPS } from '../src/proxy/redis-limit-store.js';

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
    const ledger = new RequestLedger(
      requestInfo({ slo: { ttftMs: 1000, tpotMs: 100, e2eMs: 1000, ttftByPromptLenMs: {} }, promptLenBoundaries: [1024], promptLenClasses: promptLenClasses([1024]) }),
      0,
      { onInterTokenGap: (ms) => metrics.interTokenLatency('m').observe(ms / 1000) },
    );
    metrics.requestStarted('m');
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
    metrics.record(ledger.settle(32), true);
    // A client SDK's retry (x-stainless-retry-count 1), cancelled.
    const cancelled = new RequestLedger({ ...ledger.info, clientRetry: 1 }, 0);
    cancelled.clientCancelled(5);
    metrics.record(cancelled.settle(5), false);
    const miss = new RequestLedger({ ...ledger.info, stream: false }, 0);
    miss.startAttempt(0, 'u0');
    miss.bodyReceived(1, 200, classifyEventData('{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}'));
    miss.clientEnded(1);
    metrics.record(miss.settle(1), false);
    metrics.retryMade('m', 'reset');
    metrics.retryBudgetSpent('m');
    metrics.upstreamEjected('u0', 'consecutive_failures');
    metrics.queueWaited('m', 20);
    metrics.internalError('hook');
    metrics.probeFailed('u0', 'discovery');
    metrics.readStopped('u0', 'discovery', 'too_large');
    metrics.discoveredModelsRefusedBy('pool-a', 2);
    metrics.evaluationSampled('m');
    metrics.rateLimited('team-a', 'tokens');
    metrics.limitStoreError('reserve');
    metrics.limitStoreUp('redis', false);
    metrics.backgroundHolding(1);
    metrics.backgroundHoldEnded('ended');
    metrics.configReloaded('ok');
    metrics.configInForce('0123456789ab');
    metrics.turnYielded();
    metrics.observe({
      upstreams: () => [{ name: 'u0', up: true, inflight: 2 }],
      queues: () => [{ model: 'm', depth: 3 }],
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
    expect(text).toContain('waybill_usage_missing_total{model="m"} 1');
    expect(text).toContain('waybill_inflight_requests{model="m"} 0');
    expect(text).toContain('waybill_inter_token_latency_seconds_count{model="m"} 1');
    expect(text).toContain('waybill_time_per_output_token_seconds_sum{model="m"} 0.02');
    expect(text).toContain('waybill_upstream_up{upstream="u0"} 1');
    expect(text).toContain('waybill_upstream_inflight{upstream="u0"} 2');
    expect(text).toContain('waybill_queue_depth{model="m"} 3');
    expect(text).toContain('waybill_queue_wait_seconds_sum{model="m"} 0.02');
    expect(text).toContain('waybill_internal_errors_total{component="hook"} 1');
    expect(text).toContain('waybill_upstream_first_output_seconds_count{model="m",upstream="u0"} 1');
    expect(text).toContain('waybill_build_info{version="unknown",revision="unknown"} 1');
    expect(text).toContain('waybill_internal_errors_total{component="exchange"} 0');
    expect(text).toContain('waybill_upstream_probe_failures_total{upstream="u0",probe="discovery"} 1');
    // Two delivered responses of one choice each, no contract: answer present, finished, format unevaluated; accepted.
    expect(text).toContain('waybill_output_checks_total{model="m",check="answer_present",result="pass"} 2');
    expect(text).toContain('waybill_output_checks_total{model="m",check="not_truncated",result="pass"} 2');
    expect(text).toContain('waybill_output_checks_total{model="m",check="format_valid",result="unevaluated"} 2');
    expect(text).toContain('waybill_requests_accepted_total{model="m",tenant="_anonymous",route="chat_completions",stream="true"} 1');
    expect(text).toContain('waybill_requests_accepted_total{model="m",tenant="_anonymous",route="chat_completions",stream="false"} 1');
    expect(text).toContain('waybill_evaluation_samples_total{model="m"} 1');
    expect(text).toContain('waybill_rate_limited_total{tenant="team-a",limit="tokens"} 1');
    expect(text).toContain('waybill_limit_store_errors_total{op="reserve"} 1');
    expect(text).toContain('waybill_limit_store_up{store="redis"} 0');
  });
});
