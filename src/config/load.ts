/**
 * Loading a configuration: YAML read, validated by the schema (schema.ts), resolved and frozen. The resolved
 * configuration has durations in milliseconds, buckets in seconds, keys in camelCase; its type is what `resolve`
 * builds from the schema's output, so a key added to the schema and resolved is typed everywhere without a second,
 * hand-written description of it. What the environment supplies is read in environment.ts; problems are reported
 * all at once (problems.ts); what a reload may change is reload.ts's.
 */
import { readFile } from 'node:fs/promises';
import { parseDocument } from 'yaml';
import { z } from 'zod';
import { promptLenClassNames } from '../telemetry/labels.js';
import { resolveAuth, resolveRedis, resolveRouteSharing, resolveSecret, tenantLimits } from './environment.js';
import { ConfigError, formatPath, issueMessages, removeAt } from './problems.js';
import { configSchema, type ConfigInput, type RawConfig } from './schema.js';

export { ConfigError } from './problems.js';
export type { ClientKey } from './environment.js';

/**
 * A model's SLO thresholds, resolved (`slo.*`, `slo.models.<model>.*`). The same shape as the ledger's SloThresholds
 * (accounting/ledger.ts), which proxy/request-facts.ts hands it as; config/ does not import the core.
 */
export interface SloThresholds {
  readonly ttftMs: number;
  readonly tpotMs: number;
  readonly e2eMs: number;
  /** TTFT threshold per prompt_len class, overriding ttftMs for that class. */
  readonly ttftByPromptLenMs: Readonly<Record<string, number>>;
}

/** Paths Waybill serves itself (API routes, models, operations): never pass-through. */
const RESERVED_PATHS = [
  '/v1/chat/completions',
  '/v1/completions',
  '/v1/responses',
  '/v1/messages',
  '/v1/embeddings',
  '/v1/audio',
  '/v1/models',
  '/pooling',
  '/classify',
  '/score',
  '/v1/score',
  '/rerank',
  '/v1/rerank',
  '/v2/rerank',
  '/tokenize',
  '/detokenize',
  '/metrics',
  '/healthz',
  '/readyz',
  '/status',
  '/status.json',
];

export type Config = DeepReadonly<ReturnType<typeof resolve>>;

/** What deepFreeze makes of a value, as a type (a URL stays a URL). */
type DeepReadonly<T> = T extends URL ? T : T extends object ? { readonly [K in keyof T]: DeepReadonly<T[K]> } : T;
export type PoolConfig = Config['pools'][number];
export type UpstreamConfig = PoolConfig['upstreams'][number];
export type AdmissionConfig = NonNullable<PoolConfig['admission']>;

/**
 * The cross-field problems of an input that failed the schema, so one run reports both kinds: the fields the schema
 * refused are removed (taking their defaults), the rest is validated again and, if it now passes, resolved. Problems
 * that name a removed field anywhere are left out (they would be about the default, not the file). None when the input
 * cannot be made to pass (a required field is missing or wrong).
 */
function crossFieldProblemsDespite(input: unknown, error: z.ZodError, env: NodeJS.ProcessEnv): string[] {
  let pruned: unknown;
  try {
    pruned = structuredClone(input);
  } catch {
    // Not plain data (a caller's function or class instance; a YAML file cannot hold one): schema problems only.
    return [];
  }
  const removed: string[] = [];
  for (const issue of error.issues) {
    const path = issue.code === 'unrecognized_keys' ? [...issue.path, ...issue.keys] : issue.path;
    if (path.length === 0 || !removeAt(pruned, path)) return [];
    removed.push(formatPath(path));
  }
  const retried = configSchema.safeParse(pruned);
  if (!retried.success) return [];
  const problems: string[] = [];
  try {
    resolve(retried.data, problems, env);
  } catch {
    return [];
  }
  // A problem that names a removed field is about its default (or its absence), not about the file.
  return problems.filter((problem) => !removed.some((path) => problem.includes(path)));
}

/** Adds each configured SLO threshold to the histogram's buckets, so attainment can be read from the histogram. */
function withThresholds(buckets: readonly number[], thresholdsMs: readonly number[]): number[] {
  const merged = new Set(buckets);
  for (const ms of thresholdsMs) merged.add(ms / 1000);
  return [...merged].sort((a, b) => a - b);
}

function resolveSlo(
  base: { ttft?: number | undefined; tpot?: number | undefined; e2e?: number | undefined; ttft_by_prompt_len?: Record<string, number> | undefined },
  fallback: SloThresholds,
): SloThresholds {
  return {
    ttftMs: base.ttft ?? fallback.ttftMs,
    tpotMs: base.tpot ?? fallback.tpotMs,
    e2eMs: base.e2e ?? fallback.e2eMs,
    ttftByPromptLenMs: { ...fallback.ttftByPromptLenMs, ...base.ttft_by_prompt_len },
  };
}

function resolve(raw: RawConfig, problems: string[], env: NodeJS.ProcessEnv) {
  const classes = promptLenClassNames(raw.metrics.prompt_len_boundaries);
  const upstreamNames = new Map<string, string>();
  const modelPools = new Map<string, string>();
  const poolNames = new Set<string>();

  const pools = raw.pools.map((pool, p) => {
    if (poolNames.has(pool.name)) problems.push(`pools[${p}].name: duplicate pool name "${pool.name}"`);
    poolNames.add(pool.name);
    for (const [m, model] of (pool.models ?? []).entries()) {
      const other = modelPools.get(model);
      if (other !== undefined) problems.push(`pools[${p}].models[${m}]: model "${model}" is already served by pool "${other}"`);
      modelPools.set(model, pool.name);
    }
    const upstreams = pool.upstreams.map((upstream, u) => {
      const url = new URL(upstream.url);
      const name = upstream.name ?? url.host;
      const field = `pools[${p}].upstreams[${u}]`;
      const other = upstreamNames.get(name);
      if (other !== undefined) problems.push(`${field}.name: duplicate upstream name "${name}" (also ${other}); set distinct names`);
      upstreamNames.set(name, field);
      let apiKey = upstream.api_key;
      if (upstream.api_key !== undefined && upstream.api_key_env !== undefined) {
        problems.push(`${field}: set api_key or api_key_env, not both`);
      } else if (upstream.api_key_env !== undefined) {
        apiKey = env[upstream.api_key_env];
        if (apiKey === undefined || apiKey === '') problems.push(`${field}.api_key_env: environment variable ${upstream.api_key_env} is not set`);
      }
      /** apiKey: resolved from api_key or api_key_env; never logged. */
      return Object.freeze({ name, url, weight: upstream.weight, maxInflight: upstream.max_inflight, apiKey, revision: upstream.revision });
    });
    const admission = pool.admission && {
      maxInflight: pool.admission.max_inflight,
      maxQueue: pool.admission.max_queue,
      queueTimeoutMs: pool.admission.queue_timeout,
    };
    const r = pool.routing;
    const routing = Object.freeze({
      policy: r.policy,
      boundedLoad: r.bounded_load,
      minMatchBlocks: r.min_match_blocks,
      balanceAbsThreshold: r.balance_abs_threshold,
      balanceRelThreshold: r.balance_rel_threshold,
      weights: Object.freeze({ ...r.weights }),
      blockChars: r.block_chars,
      blockTokens: r.block_tokens,
      maxBlocks: r.max_blocks,
      indexEntries: r.index_entries,
      /** Lower-cased, as Node keys request headers. */
      sessionHeader: r.session_header?.toLowerCase(),
      usageReportsCachedTokens: r.usage_reports_cached_tokens,
    });
    return Object.freeze({
      name: pool.name,
      /** Served model names; undefined while they are to be discovered from the upstreams. */
      models: pool.models && Object.freeze<string[]>([...pool.models]),
      upstreams: Object.freeze(upstreams),
      admission,
      routing,
    });
  });

  const checkClasses = (field: string, byClass: Record<string, number> | undefined) => {
    for (const key of Object.keys(byClass ?? {})) {
      if (!classes.includes(key) || key === 'unknown') {
        problems.push(`${field}: unknown prompt_len class "${key}" (one of ${classes.filter((c) => c !== 'unknown').join(', ')})`);
      }
    }
  };
  checkClasses('slo.ttft_by_prompt_len', raw.slo.ttft_by_prompt_len);
  for (const model of Object.keys(raw.evaluation.models)) {
    if (pools.every((pool) => pool.models !== undefined) && !modelPools.has(model)) problems.push(`evaluation.models.${model}: no pool serves model "${model}"`);
  }
  const auth = resolveAuth(raw, problems, env);
  for (const [tenant, rules] of Object.entries(raw.tenants)) {
    for (const model of rules.models ?? []) {
      if (pools.every((pool) => pool.models !== undefined) && !modelPools.has(model)) problems.push(`tenants.${tenant}.models: no pool serves model "${model}"`);
    }
  }
  raw.passthrough.paths.forEach((entry, i) => {
    if (entry.model !== undefined && pools.every((pool) => pool.models !== undefined) && !modelPools.has(entry.model)) {
      problems.push(`passthrough.paths.${i}.model: no pool serves model "${entry.model}"`);
    }
    if (RESERVED_PATHS.some((reserved) => entry.path === reserved || entry.path.startsWith(`${reserved}/`))) {
      problems.push(`passthrough.paths.${i}.path: ${entry.path} is one of Waybill's own routes`);
    }
  });
  if (raw.server.admin_port !== undefined && raw.server.admin_port !== 0 && raw.server.admin_port === raw.server.port) {
    problems.push(`server.admin_port: must differ from server.port (${raw.server.port}): the admin listener is a second port`);
  }
  if (raw.server.admin_host !== undefined && raw.server.admin_port === undefined) problems.push('server.admin_host: set server.admin_port too (without it, one port serves everything)');
  if (raw.health.ejection_base > raw.health.ejection_max) problems.push('health.ejection_base: must not exceed health.ejection_max');
  if (raw.retries.backoff_base > raw.retries.backoff_max) problems.push('retries.backoff_base: must not exceed retries.backoff_max');
  if (raw.engine_signals.stale_after <= raw.engine_signals.interval) {
    problems.push('engine_signals.stale_after: must be longer than engine_signals.interval, or every signal is stale between two scrapes');
  }

  const defaults: SloThresholds = {
    ttftMs: raw.slo.ttft,
    tpotMs: raw.slo.tpot,
    e2eMs: raw.slo.e2e,
    ttftByPromptLenMs: raw.slo.ttft_by_prompt_len,
  };
  const allModelsKnown = pools.every((pool) => pool.models !== undefined);
  const models: Record<string, SloThresholds> = {};
  for (const [model, thresholds] of Object.entries(raw.slo.models)) {
    if (allModelsKnown && !modelPools.has(model)) problems.push(`slo.models.${model}: no pool serves model "${model}"`);
    checkClasses(`slo.models.${model}.ttft_by_prompt_len`, thresholds.ttft_by_prompt_len);
    models[model] = Object.freeze(resolveSlo(thresholds, defaults));
  }

  const all = [defaults, ...Object.values(models)];
  const ttftThresholds = all.flatMap((t) => [t.ttftMs, ...Object.values(t.ttftByPromptLenMs)]);
  return {
    server: Object.freeze(raw.server),
    pools: Object.freeze(pools),
    discovery: { refreshIntervalMs: raw.discovery.refresh_interval, maxModelsPerPool: raw.discovery.max_models_per_pool, maxRevisionsPerPool: raw.discovery.max_revisions_per_pool },
    health: {
      intervalMs: raw.health.interval,
      timeoutMs: raw.health.timeout,
      ejectAfterFailures: raw.health.eject_after_failures,
      ejectionBaseMs: raw.health.ejection_base,
      ejectionMaxMs: raw.health.ejection_max,
      maxEjectionPercent: raw.health.max_ejection_percent,
      maxBodyBytes: raw.health.max_body_bytes,
    },
    engineSignals: {
      enabled: raw.engine_signals.enabled,
      intervalMs: raw.engine_signals.interval,
      timeoutMs: raw.engine_signals.timeout,
      staleAfterMs: raw.engine_signals.stale_after,
    },
    routeSharing: resolveRouteSharing(raw, problems, env),
    retries: {
      maxAttempts: raw.retries.max_attempts,
      backoffBaseMs: raw.retries.backoff_base,
      backoffMaxMs: raw.retries.backoff_max,
      retryOn500: raw.retries.retry_on_500,
      retryAfterMaxMs: raw.retries.retry_after_max,
      budget: { ratio: raw.retries.budget.ratio, minPerSecond: raw.retries.budget.min_per_second, windowMs: raw.retries.budget.window },
    },
    shutdown: { graceMs: raw.shutdown.grace, drainTimeoutMs: raw.shutdown.drain_timeout },
    timeouts: {
      connectMs: raw.timeouts.connect,
      firstOutputMs: raw.timeouts.first_output,
      idleMs: raw.timeouts.idle,
      totalMs: raw.timeouts.total,
    },
    streaming: {
      maxEventBytes: raw.streaming.max_event_bytes,
      maxResponseBytes: raw.streaming.max_response_bytes,
      maxErrorBodyBytes: raw.streaming.max_error_body_bytes,
      maxHeldEvents: raw.streaming.max_held_events,
      injectUsage: raw.streaming.inject_usage,
      drainGraceMs: raw.streaming.drain_grace,
      turnBudgetMs: raw.streaming.turn_budget,
    },
    slo: { defaults: Object.freeze(defaults), models: Object.freeze(models) },
    metrics: {
      promptLenBoundaries: Object.freeze([...raw.metrics.prompt_len_boundaries]),
      promptLenClasses: Object.freeze(classes),
      charsPerToken: raw.metrics.chars_per_token,
      buckets: {
        ttft: withThresholds(raw.metrics.buckets.ttft, ttftThresholds),
        itl: [...raw.metrics.buckets.itl],
        tpot: withThresholds(raw.metrics.buckets.tpot, all.map((t) => t.tpotMs)),
        duration: withThresholds(raw.metrics.buckets.duration, all.map((t) => t.e2eMs)),
        queueWait: [...raw.metrics.buckets.queue_wait],
      },
    },
    outputChecks: {
      maxOutputChars: raw.output_checks.max_output_chars,
      schemaCacheSize: raw.output_checks.schema_cache_size,
      maxSchemaChars: raw.output_checks.max_schema_chars,
    },
    evaluation: {
      sampleRate: raw.evaluation.sample_rate,
      models: Object.freeze({ ...raw.evaluation.models }),
      evaluatorHeader: raw.evaluation.evaluator_header?.toLowerCase(),
      captureContent: raw.evaluation.capture_content,
    },
    auth,
    tenants: Object.fromEntries(
      Object.entries(raw.tenants).map(([name, rules]) => [name, { models: rules.models === undefined ? undefined : [...rules.models], limits: tenantLimits(rules.limits) }]),
    ),
    limits: {
      defaultMaxTokens: raw.limits.default_max_tokens,
      anonymous: tenantLimits(raw.limits.anonymous),
      redis: resolveRedis(raw.limits, problems, env),
      background: {
        pollIntervalMs: raw.limits.background_poll_interval,
        maxHoldMs: raw.limits.background_max_hold,
        maxPolls: raw.limits.background_max_polls,
        maxWatched: raw.limits.background_max_watched,
      },
    },
    responses: {
      maxRememberedIds: raw.responses.max_remembered_ids,
      lookupTimeoutMs: raw.responses.lookup_timeout,
      maxLookupsPerTenant: raw.responses.max_lookups_per_tenant,
      negativeCacheTtlMs: raw.responses.negative_cache_ttl,
      /** From id_secret_env; undefined: the built-in key. Never logged. */
      idSecret: resolveSecret(raw.responses.id_secret_env, 'responses.id_secret_env', problems, env),
    },
    status: { enabled: raw.status.enabled, maxClients: raw.status.max_clients },
    passthrough: Object.freeze(raw.passthrough.paths.map((entry) => Object.freeze({ ...entry, methods: [...entry.methods] }))),
    logging: Object.freeze(raw.logging),
    tracing: { endpoint: raw.tracing.endpoint, captureContent: raw.tracing.capture_content },
  };
}

/** Validates a configuration object (parsed YAML, or built from CLI flags); throws ConfigError with every problem. */
export function parseConfig(input: unknown, source = 'configuration', env: NodeJS.ProcessEnv = process.env): Config {
  const parsed = configSchema.safeParse(input ?? {});
  if (!parsed.success) throw new ConfigError(source, [...issueMessages(parsed.error), ...crossFieldProblemsDespite(input ?? {}, parsed.error, env)]);
  const problems: string[] = [];
  const config = resolve(parsed.data, problems, env);
  if (problems.length > 0) throw new ConfigError(source, problems);
  return deepFreeze(config);
}

/** Reads and validates a YAML configuration file. */
export async function loadConfigFile(
  path: string,
  overrides: (input: ConfigInput) => ConfigInput = (c) => c,
  env: NodeJS.ProcessEnv = process.env,
): Promise<Config> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new ConfigError(path, [`cannot read file: ${(err as Error).message}`]);
  }
  const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true });
  if (doc.errors.length > 0) throw new ConfigError(path, doc.errors.map((e) => `YAML: ${e.message.split('\n')[0] ?? ''}`));
  return parseConfig(overrides((doc.toJS() ?? {}) as ConfigInput), path, env);
}

function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object' && !(value instanceof URL) && !Object.isFrozen(value)) {
    for (const child of Object.values(value)) deepFreeze(child);
    Object.freeze(value);
  }
  return value;
}
