/**
 * The configuration contract: one strict schema with defaults. Every problem is reported at once, naming the
 * field (`pools[0].upstreams[1].url: ...`); the result is frozen and never re-read. Durations accept a number
 * of seconds or a string with a unit (`250ms`, `5s`, `2m`, `1h`) and are held internally in milliseconds.
 * docs/configuration.md documents every key; test/config.test.ts checks the two agree.
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
});

const poolSchema = z.strictObject({
  name: labelName,
  /** Served model names. Absent: discovered from the upstreams' GET /v1/models. */
  models: z.array(labelName).min(1).optional(),
  upstreams: z.array(upstreamSchema).min(1),
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
      body_limit_bytes: z.number().int().positive().default(16 * 1024 * 1024),
    })
    .prefault({}),
  pools: z.array(poolSchema).min(1),
  discovery: z
    .strictObject({
      refresh_interval: positiveDuration.prefault(30),
    })
    .prefault({}),
  health: z
    .strictObject({
      interval: positiveDuration.prefault(5),
      timeout: positiveDuration.prefault(2),
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
      /** Ask upstreams for usage when the client did not, and drop the usage-only chunk before the client. */
      inject_usage: z.boolean().default(true),
      /** After an upstream error event or [DONE], how long to keep reading the upstream for accounting. */
      drain_grace: duration.prefault(1),
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
      buckets: z
        .strictObject({
          ttft: bucketList.default([0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60]),
          itl: bucketList.default([0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5]),
          tpot: bucketList.default([0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1]),
          duration: bucketList.default([0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]),
        })
        .prefault({}),
    })
    .prefault({}),
  logging: z
    .strictObject({
      level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    })
    .prefault({}),
});

export type ConfigInput = z.input<typeof configSchema>;
export type RawConfig = z.output<typeof configSchema>;
