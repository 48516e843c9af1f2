/**
 * The configuration contract: one strict schema with defaults. Every problem is reported at once, naming the
 * field (`pools[0].upstreams[1].url: ...`); the result is frozen and never re-read. Durations accept a number
 * of seconds or a string with a unit (`250ms`, `5s`, `2m`, `1h`) and are held internally in milliseconds.
 * docs/configuration.md documents every key; test/config.test.ts checks the two agree.
 *
 * Longer than 400 lines on purpose: it is one contract, read top to bottom beside docs/configuration.md, and one
 * zod object whose inferred type is the raw configuration; split, a key's default and its neighbours' would live
 * in different files.
 */
import { z } from 'zod';

const DURATION = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/;
const UNIT_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 } as const;

/** A duration in milliseconds, written as seconds (number) or `<n>(ms|s|m|h)`. */
export const duration = z
  .union([z.number().nonnegative(), z.string()])
  .transform((value, ctx) => {
    if (typeof value === 'number') return value * 1000;
    const match = DURATION.exec(value.trim());
    if (!match) {
      ctx.addIssue({ code: 'custom', message: `invalid duration "${value}" (use e.g. 250ms, 5s, 2m, or a number of seconds)` });
      return z.NEVER;
    }
    return Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS];
  });

const positiveDuration = duration.refine((ms) => ms > 0, 'must be greater than 0');

/** Names that become metric label values must be short, printable and closed-set. */
const labelName = z.string().regex(/^[A-Za-z0-9._:/-]{1,128}$/, 'must be 1-128 characters of [A-Za-z0-9._:/-]');

/** A tenant becomes a label value: like any name, and never one of the reserved `_anonymous`, `_unauthenticated`. */
const tenantName = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$/, 'must be 1-64 characters of [A-Za-z0-9._:-], starting with a letter or digit');

/** A tenant's limits (docs/security.md, "Limits per tenant"); each absent one is no limit. */
const tenantLimitsSchema = z.strictObject({
  /** Requests admitted per fixed 60 s window. */
  requests_per_minute: z.number().int().positive().optional(),
  /** Prompt + completion tokens per fixed 60 s window: reserved from an estimate at admission, settled from usage. */
  tokens_per_minute: z.number().int().positive().optional(),
  /** Requests in flight at once. */
  max_concurrent: z.number().int().positive().optional(),
});

/** A Redis URL: redis:// or rediss:// (TLS), with an optional user, password and database number (`/2`). */
const redisUrl = z.string().refine((value) => {
  try {
    const url = new URL(value);
    return (url.protocol === 'redis:' || url.protocol === 'rediss:') && url.hostname !== '' && url.search === '' && url.hash === '' && /^\/?\d*$/.test(url.pathname);
  } catch {
    return false;
  }
}, 'must be a redis:// or rediss:// URL without query or fragment, e.g. redis://10.0.0.7:6379 or redis://10.0.0.7:6379/2');

const httpUrl = z.string().refine((value) => {
  try {
    const url = new URL(value);
    return (url.protocol === 'http:' || url.protocol === 'https:') && url.search === '' && url.hash === '';
  } catch {
    return false;
  }
}, 'must be an http(s) URL without query or fragment, e.g. http://10.0.0.5:8000');

const upstreamSchema = z.strictObject({
  /** Label value for `upstream`; defaults to host:port of the URL. */
  name: labelName.optional(),
  url: httpUrl,
  weight: z.number().positive().default(1),
  /** Requests this upstream may have in flight; absent: no limit of its own. */
  max_inflight: z.number().int().positive().optional(),
  /** Sent upstream as `Authorization: Bearer` (vLLM's --api-key). Prefer api_key_env. */
  api_key: z.string().min(1).optional(),
  /** Name of an environment variable holding the upstream API key. */
  api_key_env: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name').optional(),
  /**
   * The `revision` label of this upstream's requests (a canary's track or build: `stable`, `canary`, `0.9.1`).
   * Absent: read from its GET /version (vLLM's release), refreshed every discovery.refresh_interval.
   */
  revision: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._+:-]{0,63}$/, 'must be 1-64 characters of [A-Za-z0-9._+:-], starting with a letter or digit')
    .optional(),
});

const admissionSchema = z.strictObject({
  /** Requests per model in flight to the pool; more wait in the queue. */
  max_inflight: z.number().int().positive(),
  max_queue: z.number().int().nonnegative().default(64),
  queue_timeout: positiveDuration.prefault(30),
});

/** How a pool picks an upstream for each request (docs/routing.md). */
const routingSchema = z.strictObject({
  /** cache_aware: where the prompt's prefix is likely cached, unless that upstream is overloaded; least_request: power of two choices on in-flight. */
  policy: z.enum(['cache_aware', 'least_request']).default('cache_aware'),
  /** Never send to an upstream whose load would exceed this × the pool's mean load (consistent hashing with bounded loads). */
  bounded_load: z.number().min(1).max(100).default(1.5),
  /** Fewer matched prefix blocks than this is no prefix win. */
  min_match_blocks: z.number().int().min(1).max(65_536).default(1),
  /** The pool is imbalanced (prefix affinity yields to load) when max − min load exceeds this… */
  balance_abs_threshold: z.number().nonnegative().max(1_000_000).default(8),
  /** …and max load exceeds this × min load. */
  balance_rel_threshold: z.number().min(1).max(1_000_000).default(1.5),
  /** The weighted score's terms, when no prefix wins. */
  weights: z
    .strictObject({
      prefix: z.number().nonnegative().max(1000).default(3),
      queue: z.number().nonnegative().max(1000).default(2),
      kv: z.number().nonnegative().max(1000).default(2),
      inflight: z.number().nonnegative().max(1000).default(1),
    })
    .prefault({}),
  /** Characters of the rendered prompt per prefix block: 64 ≈ one 16-token vLLM block at 4 characters a token. */
  block_chars: z.number().int().min(1).max(65_536).default(64),
  /** Tokens a block stands for (vLLM's --block-size): predicted cached tokens = matched blocks × this. */
  block_tokens: z.number().int().min(1).max(4096).default(16),
  /** Prefix blocks hashed per request at most: bounded work on a huge prompt (its start is the key). */
  max_blocks: z.number().int().min(1).max(65_536).default(256),
  /** (block, upstream) entries the pool's prefix index keeps, least recently used evicted first. */
  index_entries: z.number().int().min(1).max(10_000_000).default(200_000),
  /** A request header naming a session: its requests stay on one upstream while it is within the bound, and its idle gaps are measured. */
  session_header: z.string().regex(/^[A-Za-z0-9-]+$/, 'must be an HTTP header name').optional(),
  /**
   * The upstreams run with --enable-prompt-tokens-details: a usage without prompt_tokens_details then means 0 cached
   * tokens (vLLM omits a 0), in the prediction check and in waybill_cached_prompt_tokens_total. Off: absent is unknown
   * (counted in waybill_cached_tokens_missing_total); only usages that carry cached_tokens are counted.
   */
  usage_reports_cached_tokens: z.boolean().default(false),
});

const poolSchema = z.strictObject({
  name: labelName,
  /** Served model names. Absent: discovered from the upstreams' GET /v1/models. */
  models: z.array(labelName).min(1).optional(),
  upstreams: z.array(upstreamSchema).min(1),
  /** Admission control per model of this pool; absent: no limit (vLLM queues without one). */
  admission: admissionSchema.optional(),
  routing: routingSchema.prefault({}),
});

const sloThresholds = z.strictObject({
  ttft: positiveDuration.optional(),
  tpot: positiveDuration.optional(),
  e2e: positiveDuration.optional(),
  /** TTFT thresholds per prompt-length class (label values of `prompt_len`). */
  ttft_by_prompt_len: z.record(z.string(), positiveDuration).optional(),
});

const bucketList = z
  .array(z.number().positive())
  .min(1)
  .refine((list) => list.every((value, i) => i === 0 || value > (list[i - 1] ?? 0)), 'must be strictly increasing');

export const configSchema = z.strictObject({
  server: z
    .strictObject({
      host: z.string().min(1).default('0.0.0.0'),
      port: z.number().int().min(0).max(65535).default(8080),
      /**
       * A second listener for /metrics, /healthz and /readyz; when set, the port above serves only the API (those
       * paths answer 404 there). Absent: one port serves everything. 0: an ephemeral port.
       */
      admin_port: z.number().int().min(0).max(65535).optional(),
      /** The admin listener's address. Absent: `host`, so kubelet probes and Prometheus reach it as they reach the API. */
      admin_host: z.string().min(1).optional(),
      /**
       * Processes serving the API (`waybill serve`): `auto` is the cores this process may use (its CPU affinity and
       * cgroup quota). With more than one, a primary process forks them and they share the ports (docs/operations.md,
       * "Workers").
       */
      workers: z.union([z.literal('auto'), z.number().int().min(1).max(256)]).default('auto'),
      /**
       * V8's helper threads (garbage collection, compilation) beside each serving thread: `yield` lowers them to nice
       * 19 once the gateway listens, so they run in the serving thread's idle time instead of preempting it for tens of
       * ms; `share` leaves them as they are; `auto` yields when the serving processes have every core this process may
       * run on (CPU affinity ≤ workers). Linux only (docs/operations.md, "Helper threads").
       */
      helper_threads: z.enum(['auto', 'yield', 'share']).default('auto'),
      body_limit_bytes: z.number().int().positive().default(16 * 1024 * 1024),
      /** Arrival → the whole request body received; slower clients get 408 and their connection closed. */
      read_timeout: positiveDuration.prefault(30),
      /** Connection (or the previous response) → the request's complete headers; Node answers 408 past it. */
      headers_timeout: positiveDuration.prefault(10),
      /** Request line and headers together; larger get 431. */
      max_header_bytes: z.number().int().min(1024).default(16 * 1024),
      /** Open client connections; a request on a connection past the limit gets 503 and the connection is closed. */
      max_connections: z.number().int().positive().default(4096),
      /** Nesting depth of a JSON body (objects and arrays); deeper gets 400 json_too_deep. */
      max_json_depth: z.number().int().min(2).max(1000).default(128),
      /** Choices one request may ask for: n × the number of prompts; more gets 400 too_many_choices. */
      max_choices: z.number().int().positive().max(100_000).default(128),
      /** A multipart (audio) request body; larger gets 413. vLLM's own audio limit is 25 MB. */
      max_upload_bytes: z.number().int().positive().default(26 * 1024 * 1024),
    })
    .prefault({}),
  responses: z
    .strictObject({
      /**
       * Stored responses (`GET /v1/responses/{id}`, `/cancel`) live in one vLLM process: Waybill remembers which
       * upstream answered each response id, at most this many (least recent forgotten), and asks every upstream
       * for an id it does not know.
       */
      max_remembered_ids: z.number().int().min(0).default(100_000),
      /** How long asking the upstreams for an unknown response id may take. */
      lookup_timeout: positiveDuration.prefault(2),
      /**
       * Lookups of unknown ids (a GET to every upstream each) one tenant may have in flight at once; past it the
       * tenant's request gets 429 `rate_limited` (docs/security.md "tenant model for stored responses").
       */
      max_lookups_per_tenant: z.number().int().positive().max(1024).default(4),
      /** How long a lookup that found an id nowhere is remembered (0: not at all); at most 10,000 ids are. */
      negative_cache_ttl: duration.prefault('1s'),
      /**
       * The environment variable holding the secret Waybill signs the response ids it chooses with (the tenant
       * binding, docs/security.md); unset: a built-in key, which binds as well but lets anyone holding an id test
       * which tenant name created it. Give every replica the same secret.
       */
      id_secret_env: z.string().min(1).optional(),
    })
    .prefault({}),
  auth: z
    .strictObject({
      /**
       * Client keys, each naming its tenant. A key is given as the SHA-256 (hex) of its value, or read from an
       * environment variable (`key_env`) at start-up; keys themselves never appear in the file.
       */
      keys: z
        .array(
          z
            .strictObject({
              tenant: tenantName,
              key_sha256: z.string().regex(/^[0-9a-fA-F]{64}$/, 'must be 64 hex digits (the SHA-256 of the key)').optional(),
              key_env: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name').optional(),
              /**
               * The key may also read the operational endpoints that list tenants and request ids (/metrics,
               * /status, /status.json, /status/events) where they are served on the API port (no server.admin_port).
               */
              admin: z.boolean().default(false),
            })
            .refine((key) => (key.key_sha256 === undefined) !== (key.key_env === undefined), 'give exactly one of key_sha256 and key_env'),
        )
        .default([]),
      /** Refuse requests without a valid key (401). Null (the default): true as soon as any key is configured. */
      required: z.boolean().nullable().default(null),
    })
    .prefault({}),
  /** Per-tenant rules; a tenant with keys but no entry here may use every model. */
  tenants: z
    .record(
      tenantName,
      z.strictObject({
        /** The served models this tenant may use; others get 403 model_not_allowed. Absent: all. */
        models: z.array(z.string().min(1)).optional(),
        /** Requests and tokens per minute, requests in flight; absent: not limited. */
        limits: tenantLimitsSchema.optional(),
      }),
    )
    .default({}),
  limits: z
    .strictObject({
      /** Output tokens reserved for a generating request whose body sets no max_tokens (or its route's equivalent). */
      default_max_tokens: z.number().int().positive().default(1024),
      /** The limits of requests served without a key (`_anonymous`): `tenants` cannot name it. */
      anonymous: tenantLimitsSchema.prefault({}),
      /** Where the counts live when several replicas share the limits: a Redis (`redis://` or `rediss://`). Absent: in each process. */
      redis_url: redisUrl.optional(),
      /** Name of an environment variable holding the Redis password (instead of one in redis_url). */
      redis_password_env: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name').optional(),
      /** Redis unreachable or slow: admit requests unlimited (true) or refuse them with 503 limits_unavailable (false). */
      redis_fail_open: z.boolean().default(true),
      /** The longest a request waits for Redis (connecting included) before the failure rule applies. */
      redis_timeout: positiveDuration.prefault('250ms'),
      /**
       * How long a `max_concurrent` slot in Redis lives unless the process holding it renews it (every third of
       * this while its request runs): a replica or worker that dies gives its slots back within this.
       */
      redis_slot_lease: positiveDuration.refine((ms) => ms >= 1000, 'must be at least 1s').prefault('10s'),
      /** Prefix of the keys in Redis: gateways that share one Redis but not their limits need different ones. */
      redis_key_prefix: z
        .string()
        .regex(/^[A-Za-z0-9._:-]{1,64}$/, 'must be 1-64 characters of [A-Za-z0-9._:-]')
        .default('waybill:limits'),
      /**
       * A background response (`background: true`) of a limited tenant holds its slot and reservation until it ends:
       * how often its home upstream is asked whether it has (GET /v1/responses/{id}).
       */
      background_poll_interval: positiveDuration.prefault('2s'),
      /**
       * The longest a background response holds its slot: past it the slot is released and the reservation stands.
       * With redis_url a slot also expires with its in-flight TTL (timeouts.total + drain grace + a margin), whichever is first.
       */
      background_max_hold: positiveDuration.prefault('10m'),
      /** Polls of background responses in flight at once, across the process; the others wait for the next interval. */
      background_max_polls: z.number().int().positive().default(8),
      /** Background responses watched at once; past it one is settled at its acknowledgement (reservation kept, slot freed). */
      background_max_watched: z.number().int().positive().default(1024),
    })
    .prefault({}),
  passthrough: z
    .strictObject({
      /**
       * Paths proxied as they are (JSON or empty bodies, answered as one body, counted under route="passthrough"),
       * e.g. vLLM's /v2/embed or /invocations. Anything not listed, and not an API route, is 404.
       */
      paths: z
        .array(
          z.strictObject({
            path: z.string().regex(/^\/[A-Za-z0-9._~/-]*$/, 'must be an absolute path without parameters'),
            methods: z.array(z.enum(['GET', 'POST', 'PUT', 'DELETE'])).min(1).default(['POST']),
            /** Where a request without a served `model` in its body goes: this model's pool. Default: the first model served. */
            model: z.string().min(1).optional(),
          }),
        )
        .default([]),
    })
    .prefault({}),
  pools: z.array(poolSchema).min(1),
  discovery: z
    .strictObject({
      refresh_interval: positiveDuration.prefault(30),
      /**
       * Discovered model names that get a metric label of their own, per pool, for the life of the process; later
       * names are still served but counted under `_other` (waybill_discovered_models_refused_total).
       */
      max_models_per_pool: z.number().int().min(1).max(10_000).default(64),
      /**
       * Revisions read from upstreams' GET /version that get a `revision` label of their own, per pool, for the life
       * of the process (configured revisions are not counted); later ones are counted under `_other`.
       */
      max_revisions_per_pool: z.number().int().min(1).max(64).default(8),
    })
    .prefault({}),
  health: z
    .strictObject({
      interval: positiveDuration.prefault(5),
      timeout: positiveDuration.prefault(2),
      /** Consecutive failed requests that eject an upstream (passive health). */
      eject_after_failures: z.number().int().positive().default(3),
      /** First ejection; each consecutive one doubles, up to ejection_max. */
      ejection_base: positiveDuration.prefault(5),
      ejection_max: positiveDuration.prefault(120),
      /**
       * Most of a pool's upstreams passive health may hold ejected at once, in percent (rounded down), like Envoy's
       * max_ejection_percent; whatever the share, the last upstream of a pool that takes traffic is never ejected.
       */
      max_ejection_percent: z.number().int().min(0).max(100).default(100),
      /** Largest body Waybill reads from an upstream for itself (health check, model discovery, stored-response lookup). */
      max_body_bytes: z.number().int().positive().default(1024 * 1024),
    })
    .prefault({}),
  /** Each upstream's own /metrics, scraped for its queue and KV use (docs/routing.md, "Engine signals"). */
  engine_signals: z
    .strictObject({
      enabled: z.boolean().default(true),
      interval: positiveDuration.prefault(1),
      /** Deadline of one scrape (the body is read up to health.max_body_bytes). */
      timeout: positiveDuration.prefault(0.5),
      /** A signal older than this is stale: picking falls back to the gateway's own in-flight count for that upstream. */
      stale_after: positiveDuration.prefault(5),
    })
    .prefault({}),
  /**
   * Gateway replicas share their cache_aware picks through Redis pub/sub (docs/routing.md, "Across replicas"), so a
   * prefix one replica placed or spilled is found by the others; lost or late messages only make an index less
   * complete (fail open to the local index).
   */
  route_sharing: z
    .strictObject({
      enabled: z.boolean().default(false),
      /** Its own Redis; absent: the one of limits.redis_url (with limits.redis_password_env). */
      redis_url: redisUrl.optional(),
      /** Name of an environment variable holding the password of route_sharing.redis_url. */
      redis_password_env: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name').optional(),
      /** The pub/sub channel: replicas of one fleet use the same, another fleet on the same Redis another. */
      channel: z.string().min(1).max(128).default('waybill:routes'),
    })
    .prefault({}),
  retries: z
    .strictObject({
      /** Attempts per logical request, the first included. */
      max_attempts: z.number().int().min(1).max(10).default(3),
      backoff_base: positiveDuration.prefault(0.025),
      backoff_max: positiveDuration.prefault(1),
      /** Also retry an upstream HTTP 500, or an error event with code 500 before any output (vLLM answers 500 when its engine died). */
      retry_on_500: z.boolean().default(false),
      /** Longest Retry-After of a 429/408 that is honoured; longer fails the request. */
      retry_after_max: positiveDuration.prefault(5),
      budget: z
        .strictObject({
          /** Retries may add at most this share of the model's recent requests. */
          ratio: z.number().min(0).max(1).default(0.2),
          /** Floor, so low traffic can still retry. */
          min_per_second: z.number().nonnegative().default(3),
          window: positiveDuration.prefault(10),
        })
        .prefault({}),
    })
    .prefault({}),
  shutdown: z
    .strictObject({
      /** After SIGTERM, /readyz answers 503 this long before new connections are refused (load-balancer deregistration). */
      grace: duration.prefault(5),
      /** In-flight requests may run this long after the grace; what is left is ended and counted. */
      drain_timeout: positiveDuration.prefault(30),
    })
    .prefault({}),
  timeouts: z
    .strictObject({
      connect: positiveDuration.prefault(5),
      /** Request sent → first output-bearing event (stream) or complete body (non-stream). */
      first_output: positiveDuration.prefault(120),
      /** Gap between upstream events after commit. */
      idle: positiveDuration.prefault(30),
      /** Arrival → end of the logical request. */
      total: positiveDuration.prefault(600),
    })
    .prefault({}),
  streaming: z
    .strictObject({
      max_event_bytes: z.number().int().positive().default(1024 * 1024),
      max_response_bytes: z.number().int().positive().default(64 * 1024 * 1024),
      /** An upstream error body (non-2xx) is read up to this many bytes; its message is relayed from that part. */
      max_error_body_bytes: z.number().int().positive().default(64 * 1024),
      /** Events and comments held before the first output beyond one per expected choice (max_event_bytes bounds their bytes). */
      max_held_events: z.number().int().positive().default(64),
      /** Ask upstreams for usage when the client did not, and drop the usage-only chunk before the client. */
      inject_usage: z.boolean().default(true),
      /** After an upstream error event or [DONE], how long to keep reading the upstream for accounting. */
      drain_grace: duration.prefault(1),
      /**
       * Time per event-loop turn that streams already answering may spend reading before they yield, so streams that
       * have not answered yet get their turns (proxy/read-turns.ts); 0: never yield.
       */
      turn_budget: duration.prefault('2ms'),
    })
    .prefault({}),
  slo: z
    .strictObject({
      ttft: positiveDuration.prefault(2),
      tpot: positiveDuration.prefault(0.1),
      e2e: positiveDuration.prefault(60),
      ttft_by_prompt_len: z.record(z.string(), positiveDuration).default({}),
      models: z.record(z.string(), sloThresholds).default({}),
    })
    .prefault({}),
  metrics: z
    .strictObject({
      /** Prompt-token boundaries of the `prompt_len` classes. */
      prompt_len_boundaries: bucketList.default([1024, 4096, 16384, 65536]),
      /** Characters per token for estimating a text prompt's length before usage arrives, and the output a request relayed without usage. */
      chars_per_token: z.number().positive().max(100).default(4),
      buckets: z
        .strictObject({
          ttft: bucketList.default([0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60]),
          itl: bucketList.default([0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5]),
          tpot: bucketList.default([0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1]),
          duration: bucketList.default([0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]),
          queue_wait: bucketList.default([0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]),
        })
        .prefault({}),
    })
    .prefault({}),
  status: z
    .strictObject({
      /** The live status page (/status, /status.json, /status/events) where /metrics is served; false: 404 there. */
      enabled: z.boolean().default(true),
      /** Status pages following the live event stream at once; more get 503 too_many_connections. */
      max_clients: z.number().int().positive().max(1024).default(16),
    })
    .prefault({}),
  output_checks: z
    .strictObject({
      /** Characters of answer text (content and tool-call arguments, all choices) kept per response for format_valid; past it, unevaluated. */
      max_output_chars: z.number().int().positive().default(1024 * 1024),
      /** Distinct JSON Schemas kept compiled (least recently used dropped first). */
      schema_cache_size: z.number().int().positive().default(256),
      /** Largest schema compiled, in characters of its JSON text; a larger one leaves format_valid unevaluated. */
      max_schema_chars: z.number().int().positive().default(64 * 1024),
    })
    .prefault({}),
  evaluation: z
    .strictObject({
      /** Share of delivered responses sampled for external evaluation, decided from the request id (0: off). */
      sample_rate: z.number().min(0).max(1).default(0),
      /** Per-model sample rates, overriding sample_rate. */
      models: z.record(z.string(), z.number().min(0).max(1)).default({}),
      /**
       * A request carrying this header (any non-empty value) is evaluator traffic: SLO result `excluded`, never sampled,
       * out of the acceptance counters and counted apart (docs/output-contract.md). Unset: none is.
       */
      evaluator_header: z.string().regex(/^[A-Za-z0-9-]+$/, 'must be an HTTP header name').optional(),
      /** Put each sampled response's answer text (capped by output_checks.max_output_chars) in its sample record. */
      capture_content: z.boolean().default(false),
    })
    .prefault({}),
  logging: z
    .strictObject({
      level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
      /** json: one JSON object per line (for collectors); pretty: aligned text for a terminal. */
      format: z.enum(['json', 'pretty']).default('json'),
      /** One wide log line per logical request when it ends. */
      requests: z.boolean().default(true),
      /**
       * JSON lines held in memory while stdout does not take them (a stalled pipe); a line past it is dropped and
       * counted in waybill_log_lines_dropped_total (telemetry/log-destination.ts).
       */
      buffer_bytes: z.number().int().min(64 * 1024).default(16 * 1024 * 1024),
    })
    .prefault({}),
  tracing: z
    .strictObject({
      /**
       * OTLP/HTTP traces URL, e.g. http://otel-collector:4318/v1/traces. Absent: the standard environment variables
       * decide (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT); with neither, tracing is off.
       */
      endpoint: httpUrl.optional(),
      /** Record upstream error messages in spans. Prompts and completions are never recorded. */
      capture_content: z.boolean().default(false),
    })
    .prefault({}),
});

export type ConfigInput = z.input<typeof configSchema>;
export type RawConfig = z.output<typeof configSchema>;
