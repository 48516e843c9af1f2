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
