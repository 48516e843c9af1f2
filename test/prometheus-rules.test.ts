/**
 * The Prometheus rules and the Grafana dashboard against the real tool and the metrics contract: promtool checks and
 * unit-tests the rules (deploy/prometheus/tests), parses every dashboard query, and every metric name they use must
 * be one Waybill exports. promtool comes with Debian's `prometheus` package, which .ci/run installs; without it the
 * promtool tests skip (WAYBILL_REQUIRE_TOOLS=1: fail).
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { GatewayMetrics, METRICS } from '../src/telemetry/metrics.js';
import { metricNames, PROMTOOL, runTool, withoutGrafanaVariables } from './helpers/promql.js';
import { describeWithTool } from './helpers/system-tool.js';

const ROOT = join(import.meta.dirname, '..');
const RULES_DIR = join(ROOT, 'deploy', 'prometheus');
const WAYBILL_RULES = join(RULES_DIR, 'waybill-rules.yaml');
const VLLM_RULES = join(RULES_DIR, 'vllm-rules.yaml');
const DASHBOARD = join(ROOT, 'deploy', 'grafana', 'waybill-dashboard.json');
const RUNBOOK = join(ROOT, 'docs', 'runbook.md');

/**
 * vLLM's engine metric names (v1): vLLM source, vllm/v1/metrics/loggers.py (PrometheusStatLogger) for
 * the queue, prefill and decode histograms.
 */
const VLLM_HISTOGRAMS = [
  'vllm:time_to_first_token_seconds',
  'vllm:inter_token_latency_seconds',
  'vllm:request_time_per_output_token_seconds',
  'vllm:e2e_request_latency_seconds',
  'vllm:request_queue_time_seconds',
  'vllm:request_prefill_time_seconds',
  'vllm:request_decode_time_seconds',
  // KV block residency, with --kv-cache-metrics (docs/simulator-metrics.md, loggers.py histogram_kv_block_*).
  'vllm:kv_block_lifetime_seconds',
  'vllm:kv_block_idle_before_evict_seconds',
  'vllm:kv_block_reuse_gap_seconds',
  // Token-count histograms: the cached-prefill rule subtracts their sums (seed 000 §4.3).
  'vllm:request_prompt_tokens',
  'vllm:request_prefill_kv_computed_tokens',
];
/** Not vLLM's names, but about its targets: its process collector's start time, and kube-state-metrics on its pods. */
const ENGINE_SIDE_METRICS = ['process_start_time_seconds', 'kube_pod_container_status_restarts_total', 'kube_pod_created'];
const VLLM_METRICS = new Set([
  'vllm:num_requests_running',
  'vllm:num_requests_waiting',
  'vllm:kv_cache_usage_perc',
  'vllm:prompt_tokens_total',
  'vllm:generation_tokens_total',
  'vllm:request_success_total',
  'vllm:prefix_cache_hits_total',
  'vllm:prefix_cache_queries_total',
  'vllm:num_preemptions_total',
  'vllm:cache_config_info',
  ...VLLM_HISTOGRAMS.flatMap((name) => [name, `${name}_bucket`, `${name}_sum`, `${name}_count`]),
  ...ENGINE_SIDE_METRICS,
]);

/** kube-state-metrics series the dashboard's autoscaling annotation reads, where it is scraped. */
const KUBE_STATE_METRICS = new Set(['kube_horizontalpodautoscaler_status_current_replicas', 'kube_deployment_status_replicas']);

interface Rule {
  record?: string;
  alert?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

interface RuleFile {
  groups: Array<{ name: string; rules: Rule[] }>;
}

interface Target {
  expr: string;
  refId: string;
  exemplar?: boolean;
}

interface Panel {
  id: number;
  type: string;
  title: string;
  datasource?: { type: string; uid: string };
  targets?: Target[];
}

interface Dashboard {
  description: string;
  panels: Panel[];
  templating: { list: Array<{ name: string; type: string; query: unknown }> };
  annotations: { list: Array<{ name: string; expr?: string; datasource?: { type: string; uid: string } }> };
}

function rules(path: string): Rule[] {
  return (parse(readFileSync(path, 'utf8')) as RuleFile).groups.flatMap((g) => g.rules);
}

const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as Dashboard;
const queryPanels = dashboard.panels.filter((p) => p.type !== 'row');
/** Annotation queries: Prometheus ones, with an expression. */
const annotationQueries = dashboard.annotations.list.flatMap((a) => (a.expr !== undefined ? [{ name: a.name, expr: a.expr }] : []));

/** Every name Waybill's /metrics can carry: the contract, its histogram series, prom-client's defaults, and `up`. */
async function exportedNames(): Promise<Set<string>> {
  const names = new Set<string>(['up']);
  for (const spec of Object.values(METRICS)) {
    names.add(spec.name);
    if (spec.type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(spec.name + suffix);
  }
  // The exposition a gateway serves, default metrics included: every family has its TYPE line, samples or not.
  const metrics = new GatewayMetrics(parseConfig({ pools: [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:1' }] }] }, 'test').metrics.buckets);
  for (const [, name = '', type] of (await metrics.registry.metrics()).matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    names.add(name);
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(name + suffix);
  }
  metrics.registry.clear();
  metrics.openMetrics.clear();
  return names;
}

function promtool(...args: string[]): string {
  const { status, output } = runTool(PROMTOOL.command, args);
  expect(status, `promtool ${args.join(' ')}\n${output}`).toBe(0);
  return output;
}

describe('metricNames', () => {
  it('lists selected metrics, not functions, keywords, labels or literals', () => {
    expect(metricNames('sum by (model, le) (rate(a_total{x="y{z}"}[5m])) / on (model) group_left (le) b:c:d > 0.5')).toEqual(['a_total', 'b:c:d']);
    expect(metricNames('histogram_quantile(0.99, sum(rate(h_bucket[1h] offset 5m)) without (pod)) or vector(1e3) and bool up')).toEqual(['h_bucket', 'up']);
    expect(metricNames('absent(vllm:num_requests_running{job="vllm"}) unless on () count(x) > 0')).toEqual(['vllm:num_requests_running', 'x']);
  });
});

describeWithTool(PROMTOOL, 'promtool', () => {
  it('checks both rule files', () => {
    const output = promtool('check', 'rules', WAYBILL_RULES, VLLM_RULES);
    expect(output).toMatch(/SUCCESS/);
  });

  it('passes the rules unit tests: recorded values and alerts, counter resets, idle traffic, no data, day-old baselines', () => {
    const tests = readdirSync(join(RULES_DIR, 'tests')).filter((f) => f.endsWith('.yaml'));
    expect(tests.sort()).toEqual(['vllm-engine.test.yaml', 'vllm-rules.test.yaml', 'waybill-baselines.test.yaml', 'waybill-evaluation.test.yaml', 'waybill-queue.test.yaml', 'waybill-replicas.test.yaml', 'waybill-revisions.test.yaml', 'waybill-rules.test.yaml']);
    const output = promtool('test', 'rules', ...tests.map((f) => join(RULES_DIR, 'tests', f)));
    expect(output).not.toMatch(/FAILED/);
    // promtool evaluates every group at every step: about 15 s on an idle 2-core machine, more on a busy one.
  }, 120_000);

  it("parses every dashboard panel's query", () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-dashboard-'));
    try {
      const recording = [
        ...queryPanels.flatMap((panel) =>
          (panel.targets ?? []).map((t) => ({ record: `dashboard:panel_${panel.id}_${t.refId}`, expr: withoutGrafanaVariables(t.expr) })),
        ),
        ...annotationQueries.map((a, i) => ({ record: `dashboard:annotation_${i}`, expr: withoutGrafanaVariables(a.expr) })),
      ];
      expect(recording.length).toBeGreaterThan(20);
      const file = join(dir, 'dashboard-queries.yaml');
      writeFileSync(file, stringify({ groups: [{ name: 'dashboard', rules: recording }] }));
      expect(promtool('check', 'rules', file)).toContain(`SUCCESS: ${recording.length} rules found`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('Waybill rules', () => {
  const all = rules(WAYBILL_RULES);
  const alerts = all.filter((r) => r.alert !== undefined);

  it('use only metrics Waybill exports (and the rules they record)', async () => {
    const exported = await exportedNames();
    const recorded = new Set(all.flatMap((r) => (r.record !== undefined ? [r.record] : [])));
    for (const rule of all) {
      for (const name of metricNames(rule.expr)) {
        expect(exported.has(name) || recorded.has(name), `${rule.record ?? rule.alert ?? '?'} uses ${name}`).toBe(true);
      }
    }
    for (const name of recorded) expect(name, 'level:metric:operations').toMatch(/^[a-z_]+:waybill_[a-z0-9_]+:[a-z0-9_]+$/);
  });

  it('take every ratio over a positive denominator, so no traffic means no value', () => {
    // A share of a total (an upstream's of its model's attempts) matches many to one: `/ on (…) group_left () (… > 0)`.
    for (const rule of all.filter((r) => r.record?.includes(':ratio_') === true)) {
      expect(rule.expr, rule.record).toMatch(/\/ (?:on \([\w, ]+\) group_left \(\) )?\(.*> 0\)\s*\)?\s*$/s);
    }
  });

  it('aggregate histogram buckets by le before histogram_quantile, rate() inside sum()', () => {
    for (const rule of all.filter((r) => r.expr.includes('histogram_quantile('))) {
      expect(rule.expr).toMatch(/histogram_quantile\([0-9.]+, sum by \(le, model(, (prompt_len|upstream|upstream, prompt_len))?\) \(rate\(waybill_\w+_bucket\[5m\]\)\)\)/);
    }
    for (const rule of all) expect(rule.expr, rule.record ?? rule.alert).not.toMatch(/rate\(\s*sum/);
  });

  it('page and ticket on both SLOs with multiwindow burn rates', () => {
    const byName = new Map(alerts.map((a) => [a.alert, a]));
    for (const [slo, budget] of [['delivery', '0.005'], ['slo', '0.05']] as const) {
      const prefix = slo === 'delivery' ? 'WaybillDeliverySLO' : 'WaybillGoodputSLO';
      const fast = byName.get(`${prefix}FastBurn`);
      const slow = byName.get(`${prefix}SlowBurn`);
      expect(fast?.labels?.severity).toBe('critical');
      expect(slow?.labels?.severity).toBe('warning');
      const errors = `model:waybill_${slo}_errors:ratio_rate`;
      for (const [rule, pairs] of [
        [fast, [['1h', '5m', `14.4 * ${budget}`], ['6h', '30m', `6 * ${budget}`]]],
        [slow, [['1d', '2h', `3 * ${budget}`], ['3d', '6h', budget]]],
      ] as const) {
        for (const [long, short, threshold] of pairs) {
          expect(rule?.expr).toContain(`${errors}${long} > ${threshold.includes('*') ? `(${threshold})` : threshold}`);
          expect(rule?.expr).toContain(`${errors}${short} > ${threshold.includes('*') ? `(${threshold})` : threshold}`);
          // The minimum-traffic guard on the long window.
          expect(rule?.expr).toMatch(new RegExp(`model:waybill_${slo}_valid_requests:rate${long} \\* \\d+ >= 100`));
        }
      }
    }
  });

  it('page per prompt-length class on the per-model burn rates, with a volume floor', () => {
    const expr = alerts.find((a) => a.alert === 'WaybillGoodputSLOPromptLenFastBurn')?.expr ?? '';
    for (const [long, short, threshold, seconds] of [['1h', '5m', '14.4 * 0.05', 3600], ['6h', '30m', '6 * 0.05', 21600]] as const) {
      expect(expr).toContain(`model_prompt_len:waybill_slo_errors:ratio_rate${long} > (${threshold})`);
      expect(expr).toContain(`model_prompt_len:waybill_slo_errors:ratio_rate${short} > (${threshold})`);
      expect(expr).toContain(`model_prompt_len:waybill_slo_valid_requests:rate${long} * ${seconds} >= 50`);
    }
  });

  it('cover the warnings and the absent-data cases the issue lists', () => {
    const exprs = alerts.map((a) => a.expr).join('\n');
    expect(exprs).toMatch(/outcome=~"stream_error\|incomplete"/);
    expect(exprs).toContain('model:waybill_upstream_attempts_per_request:ratio_rate5m');
    expect(exprs).toContain('waybill_retry_budget_exhausted_total');
    expect(exprs).toContain('waybill_requests_total{code="429"}');
    expect(exprs).toContain('waybill_upstream_up');
    expect(exprs).toContain('absent(up{job="waybill"})');
    expect(exprs).toContain('up{job="waybill"} == 0');
    expect(exprs).toContain('absent(waybill_requests_total{job="waybill"})');
  });

  it('record the three levels over one denominator, and each output check over the checks it could judge', () => {
    const byName = new Map(all.flatMap((r) => (r.record !== undefined ? [[r.record, r.expr] as const] : [])));
    for (const level of ['2xx', 'delivered', 'accepted']) {
      expect(byName.get(`model:waybill_requests_${level}:ratio_rate5m`), level).toMatch(/\/ \(model:waybill_requests:rate5m > 0\)\s*$/);
    }
    expect(byName.get('model_check:waybill_output_checks_evaluated:rate5m')).toContain('result=~"pass|fail"');
    expect(byName.get('model_check:waybill_output_checks_failed:ratio_rate5m')).toContain('/ (model_check:waybill_output_checks_evaluated:rate5m > 0)');
  });

  it('alert on a rise only against the same series a day earlier, with enough volume in both windows', () => {
    const byName = new Map(alerts.map((a) => [a.alert, a.expr]));
    for (const [name, volume] of [
      ['WaybillOutputContractRegression', 'model_check:waybill_output_checks_evaluated:rate30m'],
      ['WaybillFinishReasonShareRising', 'model:waybill_choices:rate30m'],
    ] as const) {
      const expr = byName.get(name) ?? '';
      expect(expr, name).toMatch(/> 2 \* \(/);
      expect(expr, name).toMatch(new RegExp(`${volume} \\* 1800 >= \\d+`));
      expect(expr, name).toMatch(new RegExp(`${volume} offset 1d \\* 1800 >= \\d+`));
    }
    expect(byName.get('WaybillUpstreamInflightImbalance')).toMatch(/>= 10\s*$/);
    expect(byName.get('WaybillUpstreamFirstOutputSlow')).toContain('* 300 >= 50');
  });
});

describe('vLLM rules', () => {
  const all = rules(VLLM_RULES);

  it("use only vLLM's own metric names, up, and the rules they record", () => {
    const recorded = new Set(all.flatMap((r) => (r.record !== undefined ? [r.record] : [])));
    for (const rule of all) {
      for (const name of metricNames(rule.expr)) {
        expect(VLLM_METRICS.has(name) || name === 'up' || recorded.has(name), `${rule.record ?? rule.alert ?? '?'} uses ${name}`).toBe(true);
      }
    }
    for (const name of recorded) expect(name, 'level:metric:operations').toMatch(/^[a-z_]+:vllm_[a-z0-9_]+:[a-z0-9_]+$/);
  });

  it('take ratios over a positive denominator, and quantiles of buckets summed by le', () => {
    for (const rule of all.filter((r) => r.record?.includes(':ratio_') === true)) {
      // A share divides by its total over fewer labels: `/ on (…) group_left () (total > 0)`.
      expect(rule.expr, rule.record).toMatch(/\/ (on \([^)]*\) group_left \(\) )?\(.*> 0\)\s*\)?\s*$/s);
    }
    for (const rule of all.filter((r) => r.expr.includes('histogram_quantile('))) {
      // Within one (cluster, namespace): two pools sharing a model_name stay apart (seed 000 §4.1).
      expect(rule.expr).toMatch(/histogram_quantile\([0-9.]+, sum by \(le, cluster, namespace, (job, instance, upstream, )?model_name(, engine)?\) \(rate\(vllm:\w+_bucket\[5m\]\)\)\)/);
    }
  });

  it('record the prefix-cache hit ratio with the query volume it stands on, per engine and per model', () => {
    const recorded = new Set(all.flatMap((r) => (r.record !== undefined ? [r.record] : [])));
    for (const level of ['instance_engine', 'model_name']) {
      expect(recorded.has(`${level}:vllm_prefix_cache_hits:ratio_rate5m`), level).toBe(true);
      expect(recorded.has(`${level}:vllm_prefix_cache_queries:rate5m`), level).toBe(true);
    }
  });
});

describe('alert annotations', () => {
  const runbook = readFileSync(RUNBOOK, 'utf8');
  // GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes.
  const anchors = new Set([...runbook.matchAll(/^## (.+)$/gm)].map((m) => (m[1] ?? '').trim().toLowerCase().replace(/[^\w\- ]/g, '').replace(/ /g, '-')));
  const alerts = [...rules(WAYBILL_RULES), ...rules(VLLM_RULES)].filter((r) => r.alert !== undefined);

  it('give every alert a severity, summary, description and a runbook section of its own', () => {
    expect(alerts.length).toBeGreaterThanOrEqual(15);
    for (const alert of alerts) {
      const name = alert.alert ?? '';
      expect(['critical', 'warning', 'info'], name).toContain(alert.labels?.severity);
      expect(alert.annotations?.summary, name).toBeTruthy();
      expect(alert.annotations?.description, name).toBeTruthy();
      expect(alert.annotations?.runbook_url, name).toBe(`docs/runbook.md#${name.toLowerCase()}`);
      expect(anchors.has(name.toLowerCase()), `docs/runbook.md has a section ## ${name}`).toBe(true);
    }
  });

  it('leave no runbook section without its alert', () => {
    const names = new Set(alerts.map((a) => (a.alert ?? '').toLowerCase()));
    const sections = [...anchors].filter((a) => /^(waybill|vllm)/.test(a));
    for (const section of sections) expect(names.has(section), `runbook section ${section}`).toBe(true);
  });
});

describe('Grafana dashboard', () => {
  it("queries only metrics Waybill or vLLM export, never recording rules (it works without them)", async () => {
    const exported = await exportedNames();
    for (const panel of queryPanels) {
      expect(panel.targets?.length, panel.title).toBeGreaterThan(0);
      for (const target of panel.targets ?? []) {
        for (const name of metricNames(withoutGrafanaVariables(target.expr))) {
          expect(exported.has(name) || VLLM_METRICS.has(name), `panel "${panel.title}" uses ${name}`).toBe(true);
        }
      }
    }
    for (const annotation of annotationQueries) {
      for (const name of metricNames(withoutGrafanaVariables(annotation.expr))) {
        expect(exported.has(name) || KUBE_STATE_METRICS.has(name), `annotation "${annotation.name}" uses ${name}`).toBe(true);
      }
    }
  });

  it('has Prometheus datasource, model and upstream variables, and every query honours them', () => {
    const variables = new Map(dashboard.templating.list.map((v) => [v.name, v]));
    expect(variables.get('datasource')?.type).toBe('datasource');
    expect(variables.get('datasource')?.query).toBe('prometheus');
    expect(variables.get('model')?.type).toBe('query');
    expect(variables.get('upstream')?.type).toBe('query');
    const labelsOf = new Map<string, readonly string[]>();
    for (const spec of Object.values(METRICS)) {
      for (const suffix of spec.type === 'histogram' ? ['_bucket', '_sum', '_count'] : ['']) labelsOf.set(spec.name + suffix, spec.labels);
    }
    for (const panel of queryPanels) {
      expect(panel.datasource?.uid, panel.title).toBe('${datasource}');
      for (const target of panel.targets ?? []) {
        for (const match of target.expr.matchAll(/\b(waybill_\w+)(\{[^}]*\})?/g)) {
          const [, name = '', selector = ''] = match;
          const labels = labelsOf.get(name) ?? [];
          if (labels.includes('model')) expect(selector, `${panel.title}: ${name}`).toContain('model=~"$model"');
          // Per-request ratios (attempts / requests) keep every upstream: a subset over all requests means nothing.
          // The SLO counter is per request too: its `upstream` is the answering one, `_none` for the gateway's own answers.
          const perRequest = target.expr.includes('waybill_requests_total') || name === 'waybill_slo_requests_total';
          if (labels.includes('upstream') && !perRequest) expect(selector, `${panel.title}: ${name}`).toContain('upstream=~"$upstream"');
        }
        // vLLM's series: its scrape job, and the model variable on model_name (vLLM's served model name).
        for (const match of target.expr.matchAll(/(vllm:\w+)(\{[^}]*\})?/g)) {
          const [, name = '', selector = ''] = match;
          expect(selector, `${panel.title}: ${name}`).toContain('job="vllm"');
          // vllm:cache_config_info has no model_name: panels join it to the model's engines instead.
          if (name !== 'vllm:cache_config_info') expect(selector, `${panel.title}: ${name}`).toContain('model_name=~"$model"');
        }
      }
    }
  });

  it('puts customer impact first and shows exemplars on the latency panels', () => {
    const titles = dashboard.panels.map((p) => p.title);
    expect(titles[0]).toBe('Customer impact');
    const impact = titles.slice(1, titles.indexOf('Attempts and retries'));
    expect(impact).toEqual(expect.arrayContaining(['Requests by outcome', 'Delivered vs HTTP 2xx', 'Joint SLO attainment', 'Error budget burn rate (1h)', 'Time to first token', 'Time per output token']));
    for (const panel of queryPanels) {
      for (const target of panel.targets ?? []) {
        if (/waybill_(time_to_first_token|time_per_output_token|request_duration)_seconds_bucket/.test(target.expr)) {
          expect(target.exemplar, `${panel.title} ${target.refId}`).toBe(true);
        }
      }
    }
    const all = queryPanels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)).join('\n');
    for (const name of ['waybill_requests_accepted_total', 'waybill_output_checks_total', 'waybill_upstream_first_output_seconds_bucket', 'vllm:request_queue_time_seconds_bucket', 'vllm:request_prefill_time_seconds_bucket', 'vllm:request_decode_time_seconds_bucket', 'vllm:kv_cache_usage_perc', 'vllm:num_preemptions_total', 'vllm:prefix_cache_queries_total', 'waybill_upstream_attempts_total', 'waybill_stream_anomalies_total', 'waybill_choice_finish_reasons_total', 'waybill_client_cancellations_total', 'waybill_queue_depth', 'waybill_queue_wait_seconds_bucket', 'waybill_upstream_up', 'waybill_upstream_inflight', 'waybill_upstream_ejections_total', 'waybill_cached_prompt_tokens_total', 'nodejs_eventloop_lag_seconds']) {
      expect(all, name).toContain(name);
    }
  });

  it('shows HTTP 2xx, delivered and accepted side by side over one denominator, right after customer impact', () => {
    const rows = dashboard.panels.filter((p) => p.type === 'row').map((p) => p.title);
    expect(rows.slice(0, 2)).toEqual(['Customer impact', 'Delivered and accepted']);
    const funnels = queryPanels.filter((p) => {
      const exprs = (p.targets ?? []).map((t) => t.expr);
      return exprs.some((e) => e.includes('code=~"2.."')) && exprs.some((e) => e.includes('outcome="delivered"')) && exprs.some((e) => e.includes('waybill_requests_accepted_total'));
    });
    expect(funnels.length).toBeGreaterThanOrEqual(2);
    for (const panel of funnels) {
      for (const target of panel.targets ?? []) expect(target.expr, panel.title).toMatch(/\/ \(sum\((rate|increase)\(waybill_requests_total\{model=~"\$model"\}\[[^\]]+\]\)\) > 0\)$/);
    }
  });

  it('shows the engine side: finish reasons of both, the queue signals, prefix-cache states, resets and KV residency', () => {
    const row = dashboard.panels.findIndex((p) => p.type === 'row' && p.title === 'Engine side');
    expect(row).toBeGreaterThan(0);
    const exprs = dashboard.panels
      .slice(row + 1)
      .flatMap((p) => (p.targets ?? []).map((t) => t.expr))
      .join('\n');
    for (const name of [
      'waybill_choice_finish_reasons_total',
      'vllm:request_success_total',
      'waybill_queue_oldest_wait_seconds',
      'waybill_queue_prompt_tokens',
      'vllm:cache_config_info',
      'process_start_time_seconds',
      'kube_pod_container_status_restarts_total',
      'kube_pod_created',
      'waybill_upstream_engine_restarts_total',
      'vllm:kv_block_lifetime_seconds_bucket',
      'vllm:kv_block_idle_before_evict_seconds_bucket',
      'vllm:kv_block_reuse_gap_seconds_bucket',
    ]) {
      expect(exprs, name).toContain(name);
    }
    // Engine shares keep two pools that serve one model_name apart.
    expect(exprs).toContain('sum by (cluster, namespace, model_name, finished_reason) (rate(vllm:request_success_total');
  });

  it('marks deploys from waybill_build_info', () => {
    const deploys = dashboard.annotations.list.filter((a) => a.expr?.includes('waybill_build_info') === true);
    expect(deploys).toHaveLength(1);
    expect(deploys[0]?.datasource?.uid).toBe('${datasource}');
    expect(deploys[0]?.expr).toMatch(/by \(version, revision\)/);
    expect(dashboard.description).toContain('waybill_build_info');
  });

  it('marks vLLM revision changes and autoscaling events, besides Waybill deploys', () => {
    const byName = new Map(dashboard.annotations.list.map((a) => [a.name, a]));
    const revisions = byName.get('vLLM revisions');
    expect(revisions?.expr).toContain('waybill_upstream_revision_info');
    // A new (upstream, revision) pair of an upstream that was there 5 minutes earlier: not every gateway start.
    expect(revisions?.expr).toMatch(/unless count by \(upstream, revision\) \(waybill_upstream_revision_info\{job="waybill"\} offset 5m\) and on \(upstream\)/);
    const scaling = byName.get('Autoscaling (kube-state-metrics)');
    for (const name of KUBE_STATE_METRICS) expect(scaling?.expr).toContain(`changes(${name}[5m])`);
    for (const annotation of [revisions, scaling]) expect(annotation?.datasource?.uid).toBe('${datasource}');
  });

  it('compares revisions in a row of its own: delivered, output checks, finish-reason shares, first output and TPOT p95', () => {
    const start = dashboard.panels.findIndex((p) => p.type === 'row' && p.title === 'Revisions');
    expect(start).toBeGreaterThan(0);
    const end = dashboard.panels.findIndex((p, i) => i > start && p.type === 'row');
    const row = dashboard.panels.slice(start + 1, end === -1 ? undefined : end);
    const exprs = row.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
    for (const expr of exprs) expect(expr).toMatch(/by \((le, )?revision/);
    for (const name of ['waybill_slo_requests_total', 'waybill_output_checks_total', 'waybill_choice_finish_reasons_total', 'waybill_upstream_first_output_seconds_bucket', 'waybill_time_per_output_token_seconds_bucket', 'waybill_upstream_revision_info']) {
      expect(exprs.join('\n'), name).toContain(name);
    }
  });
});
