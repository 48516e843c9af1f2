/**
 * Who is calling: the client key of a request, matched against the configured keys' SHA-256 digests in constant
 * time, names its tenant (docs/security.md). Keys are read from `Authorization: Bearer`, `x-api-key` (the Anthropic
 * SDK) or `api-key` (Azure-style clients); they are never forwarded upstream (proxy/headers.ts) and never logged.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { ANONYMOUS, UNAUTHENTICATED } from '../accounting/outcomes.js';
import type { ClientKey } from '../config/load.js';

export type Identity = { readonly ok: true; readonly tenant: string } | { readonly ok: false; readonly tenant: typeof UNAUTHENTICATED; readonly message: string };

export interface AuthSettings {
  readonly keys: readonly ClientKey[];
  readonly required: boolean;
}

export type Authenticate = (headers: IncomingHttpHeaders) => Identity;

/** The key a request presents, if any: Authorization's Bearer token, else x-api-key, else api-key. */
export function presentedKey(headers: IncomingHttpHeaders): string | undefined {
  const authorization = headers.authorization;
  const bearer = authorization === undefined ? undefined : /^bearer[ \t]+(.+)$/i.exec(authorization.trim())?.[1]?.trim();
  if (bearer !== undefined) return bearer;
  for (const name of ['x-api-key', 'api-key']) {
    const value = headers[name];
    if (typeof value === 'string') return value.trim();
  }
  // An Authorization header of another scheme (Basic, or a bare key) is a key that cannot match: refused, not ignored.
  return authorization === undefined ? undefined : '';
}

/**
 * Who may read the operational endpoints that name tenants and request ids (/metrics, /status, /status.json,
 * /status/events) on the API port: `allowed` without client keys (the quick start), or for a key with `admin: true`;
 * `missing` for no key or one that matches none (401); `denied` for a client key without admin (403).
 */
export type OpsAccess = 'allowed' | 'missing' | 'denied';
export type CheckOpsAccess = (headers: IncomingHttpHeaders) => OpsAccess;

/** The key of an operational request: as for the API, or HTTP Basic's password (a browser prompts for it). */
function presentedOpsKey(headers: IncomingHttpHeaders): string | undefined {
  const basic = headers.authorization === undefined ? undefined : /^basic[ \t]+([A-Za-z0-9+/=]+)$/i.exec(headers.authorization.trim())?.[1];
  if (basic !== undefined) {
    const decoded = Buffer.from(basic, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    // user:password, the key as the password (any user), or as the user with no password.
    return colon < 0 ? decoded : decoded.slice(colon + 1) === '' ? decoded.slice(0, colon) : decoded.slice(colon + 1);
  }
  return presentedKey(headers);
}

export function createOpsAccess(settings: AuthSettings): CheckOpsAccess {
  if (settings.keys.length === 0) return () => 'allowed';
  const digests = settings.keys.map((key) => ({ admin: key.admin, digest: Buffer.from(key.sha256, 'hex') }));
  return (headers) => {
    const key = presentedOpsKey(headers);
    if (key === undefined || key === '') return 'missing';
    const presented = createHash('sha256').update(key).digest();
    let found: boolean | undefined;
    for (const candidate of digests) {
      if (timingSafeEqual(presented, candidate.digest) && found === undefined) found = candidate.admin;
    }
    return found === undefined ? 'missing' : found ? 'allowed' : 'denied';
  };
}

export function createAuthenticator(settings: AuthSettings): Authenticate {
  const digests = settings.keys.map((key) => ({ tenant: key.tenant, digest: Buffer.from(key.sha256, 'hex') }));
  const anonymous: Identity = { ok: true, tenant: ANONYMOUS };
  if (digests.length === 0) return () => anonymous;
  return (headers) => {
    const key = presentedKey(headers);
    if (key === undefined || key === '') {
      return settings.required ? { ok: false, tenant: UNAUTHENTICATED, message: 'a client key is required: send it as Authorization: Bearer <key>' } : anonymous;
    }
    const presented = createHash('sha256').update(key).digest();
    // Every configured digest is compared, whichever matches: the time taken does not depend on which one did.
    let tenant: string | undefined;
    for (const candidate of digests) {
      if (timingSafeEqual(presented, candidate.digest) && tenant === undefined) tenant = candidate.tenant;
    }
    // A key that matches none is refused even where keys are optional: its holder believes it is identified.
    return tenant === undefined ? { ok: false, tenant: UNAUTHENTICATED, message: 'the client key is not valid' } : { ok: true, tenant };
  };
}
