/**
 * What a configuration reload (SIGHUP) may change: everything a request reads when it arrives — client keys, tenants,
 * limits, SLOs, pools and upstreams, timeouts, retries, health checks — but not what the process built once at
 * start-up (its listeners and their limits, the pass-through routes, logging, tracing, the histograms' buckets, the
 * output checks' schema cache, the evaluation sampler, the stored-response homes). A reload that changes any of those
 * is refused whole (`restart_required`), naming the keys; the configuration in force stays.
 */
import { createHash } from 'node:crypto';
import type { Config } from './load.js';

/** The resolved sections only a restart applies, by the name the configuration file gives them. */
const RESTART_SECTIONS: ReadonlyArray<readonly [key: keyof Config, name: string]> = [
  ['passthrough', 'passthrough'],
  ['logging', 'logging'],
  ['tracing', 'tracing'],
  ['outputChecks', 'output_checks'],
  ['evaluation', 'evaluation'],
  ['responses', 'responses'],
  // One Redis subscription per process, made at start.
  ['routeSharing', 'route_sharing'],
];

/** A value as canonical JSON's model: object keys sorted, URLs as their href, undefined members left out. */
function canonical(value: unknown): unknown {
  if (value instanceof URL) return value.href;
  if (Array.isArray(value)) return value.map(canonical);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const member = (value as Record<string, unknown>)[key];
      if (member !== undefined) out[key] = canonical(member);
    }
    return out;
  }
  return value;
}

export function canonicalJson(value: unknown): string {
  return JSON.stringify(canonical(value));
}

/** The first 12 hex digits of the SHA-256 of the configuration's canonical JSON (waybill_config_hash{hash}). */
export function configHash(config: Config): string {
  return createHash('sha256').update(canonicalJson(config)).digest('hex').slice(0, 12);
}

/** The keys whose change only a restart applies, as the configuration file names them (e.g. `server.port`). */
export function restartRequiredKeys(current: Config, next: Config): string[] {
  const keys: string[] = [];
  const server = new Set([...Object.keys(current.server), ...Object.keys(next.server)]);
  for (const key of [...server].sort()) {
    const was = (current.server as Record<string, unknown>)[key];
    const now = (next.server as Record<string, unknown>)[key];
    if (canonicalJson(was) !== canonicalJson(now)) keys.push(`server.${key}`);
  }
  for (const [key, name] of RESTART_SECTIONS) {
    if (canonicalJson(current[key]) !== canonicalJson(next[key])) keys.push(name);
  }
  // The histograms' buckets are left out: they change with the SLO thresholds too (each is a bucket boundary), and
  // an SLO change must not need a restart. They stay as built (bucketsKept says so).
  const { buckets: _was, ...metricsWas } = current.metrics;
  const { buckets: _now, ...metricsNow } = next.metrics;
  for (const key of Object.keys(metricsWas).sort()) {
    if (canonicalJson(metricsWas[key as keyof typeof metricsWas]) !== canonicalJson(metricsNow[key as keyof typeof metricsNow])) keys.push(`metrics.${snake(key)}`);
  }
  return keys;
}

/**
 * Whether the next configuration's histogram buckets (metrics.buckets, with the SLO thresholds added as boundaries)
 * differ from those in force: the histograms keep theirs until a restart; the SLO counter does not depend on them.
 */
export function bucketsKept(current: Config, next: Config): boolean {
  return canonicalJson(current.metrics.buckets) !== canonicalJson(next.metrics.buckets);
}

function snake(key: string): string {
  return key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}
