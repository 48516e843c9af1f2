/**
 * The parts of a configuration read from outside the file: client keys (by value from the environment, or by hash),
 * the limits' shared Redis and route sharing's, and the other secrets named by `*_env` keys. Each problem is pushed
 * onto `problems`, naming its field; a secret's value is never part of one, nor of a log line.
 */
import { createHash } from 'node:crypto';
import { ANONYMOUS_TENANT } from '../telemetry/labels.js';
import type { RawConfig } from './schema.js';

/** A client key as the gateway keeps it: the SHA-256 of its value, never the value. */
export interface ClientKey {
  readonly tenant: string;
  /** 64 hex digits. */
  readonly sha256: string;
  /** May read /metrics and the status page on the API port (auth.keys[].admin). */
  readonly admin: boolean;
}

export function resolveAuth(raw: RawConfig, problems: string[], env: NodeJS.ProcessEnv) {
  const keys: ClientKey[] = [];
  raw.auth.keys.forEach((key, i) => {
    if (key.key_sha256 !== undefined) {
      keys.push({ tenant: key.tenant, sha256: key.key_sha256.toLowerCase(), admin: key.admin });
      return;
    }
    const value = env[key.key_env ?? ''];
    if (value === undefined || value === '') problems.push(`auth.keys.${i}.key_env: environment variable ${key.key_env ?? ''} is not set`);
    else keys.push({ tenant: key.tenant, sha256: createHash('sha256').update(value).digest('hex'), admin: key.admin });
  });
  const seen = new Set<string>();
  for (const key of keys) {
    if (seen.has(key.sha256)) problems.push(`auth.keys: the same key is configured twice (tenant ${key.tenant})`);
    seen.add(key.sha256);
  }
  const required = raw.auth.required ?? raw.auth.keys.length > 0;
  if (required && raw.auth.keys.length === 0) problems.push('auth.required: true, but no auth.keys are configured: every request would be refused');
  // The tenant label's values: configured tenants, plus `_anonymous` where a request may come without a key.
  const named = [...new Set([...raw.auth.keys.map((key) => key.tenant), ...Object.keys(raw.tenants)])];
  return { keys, required, servedTenants: required ? named : [...named, ANONYMOUS_TENANT] };
}

/** A tenant's limits in camelCase; undefined when none is set. */
export function tenantLimits(raw: RawConfig['limits']['anonymous'] | undefined) {
  if (raw === undefined || (raw.requests_per_minute === undefined && raw.tokens_per_minute === undefined && raw.max_concurrent === undefined)) return undefined;
  return { requestsPerMinute: raw.requests_per_minute, tokensPerMinute: raw.tokens_per_minute, maxConcurrent: raw.max_concurrent };
}

/**
 * The shared store of the limits (`limits.redis_*`); undefined without `limits.redis_url` (counts in each process).
 * The password comes from the URL or from `redis_password_env`, never both, and is never logged.
 */
export function resolveRedis(raw: RawConfig['limits'], problems: string[], env: NodeJS.ProcessEnv) {
  if (raw.redis_url === undefined) {
    if (raw.redis_password_env !== undefined) problems.push('limits.redis_password_env: set limits.redis_url too');
    return undefined;
  }
  let password: string | undefined;
  if (raw.redis_password_env !== undefined) {
    password = env[raw.redis_password_env];
    if (new URL(raw.redis_url).password !== '') problems.push('limits.redis_password_env: redis_url already has a password; give it in one place');
    else if (password === undefined || password === '') problems.push(`limits.redis_password_env: environment variable ${raw.redis_password_env} is not set`);
  }
  return {
    url: raw.redis_url,
    /** From redis_password_env; undefined: the URL's own (or none). */
    password,
    failOpen: raw.redis_fail_open,
    timeoutMs: raw.redis_timeout,
    keyPrefix: raw.redis_key_prefix,
    slotLeaseMs: raw.redis_slot_lease,
  };
}

/**
 * Route sharing between replicas (`route_sharing.*`): undefined when off. Its Redis is its own `redis_url` or, absent,
 * `limits.redis_url`'s (with that password); enabled with neither is a problem.
 */
export function resolveRouteSharing(raw: RawConfig, problems: string[], env: NodeJS.ProcessEnv) {
  const share = raw.route_sharing;
  if (share.redis_url === undefined && share.redis_password_env !== undefined) problems.push('route_sharing.redis_password_env: set route_sharing.redis_url too');
  if (!share.enabled) return undefined;
  if (share.redis_url === undefined) {
    if (raw.limits.redis_url === undefined) {
      problems.push('route_sharing.enabled: needs a Redis: set route_sharing.redis_url or limits.redis_url');
      return undefined;
    }
    return { url: raw.limits.redis_url, password: raw.limits.redis_password_env === undefined ? undefined : env[raw.limits.redis_password_env], channel: share.channel };
  }
  let password: string | undefined;
  if (share.redis_password_env !== undefined) {
    password = env[share.redis_password_env];
    if (new URL(share.redis_url).password !== '') problems.push('route_sharing.redis_password_env: redis_url already has a password; give it in one place');
    else if (password === undefined || password === '') problems.push(`route_sharing.redis_password_env: environment variable ${share.redis_password_env} is not set`);
  }
  return { url: share.redis_url, password, channel: share.channel };
}

/** An optional secret read from the environment variable `name`: it must be set when `name` is. */
export function resolveSecret(name: string | undefined, field: string, problems: string[], env: NodeJS.ProcessEnv): string | undefined {
  if (name === undefined) return undefined;
  const value = env[name];
  if (value === undefined || value === '') problems.push(`${field}: environment variable ${name} is not set`);
  return value;
}
