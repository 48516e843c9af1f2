/**
 * What a `POST /v1/responses` does with the stored responses it names (docs/security.md "tenant model for stored
 * responses"): the response it creates is bound to its tenant — under an id Waybill chooses when the client chose
 * none, spliced into the body as `request_id` — and a client-chosen id that would overwrite another tenant's response
 * is refused; the response it continues (`previous_response_id`) must be the tenant's, and the request goes where it
 * lives (routes.ts, `locate`).
 */
import { errorBody, type ErrorBody } from '../delivery/errors.js';
import { isResponseId } from '../proxy/response-homes.js';
import type { ResponseOwners } from '../proxy/response-owners.js';

export type Bound =
  /** `body`: the request's bytes with Waybill's `request_id`, or undefined (the client's own). `continues`: the id it continues. */
  | { readonly ok: true; readonly body: Buffer | undefined; readonly continues: string | undefined }
  | { readonly ok: false; readonly body: ErrorBody };

/**
 * vLLM's answer for an id its store does not hold — and Waybill's for an id another tenant's request created, so the
 * two cannot be told apart.
 */
export function notFound(id: string): ErrorBody {
  // The id is echoed only when it is a plain token: a 256-character cap, no markup, nothing to reflect.
  return errorBody('not_found', isResponseId(id) ? `Response with id '${id}' not found.` : 'no stored response has this id', 'response_id');
}

const OPEN_BRACE = 0x7b;

export function bindResponse(owners: ResponseOwners, tenant: string, json: Record<string, unknown>, raw: Buffer): Bound {
  const previous = json['previous_response_id'];
  let continues: string | undefined;
  if (typeof previous === 'string') {
    if (!isResponseId(previous) || !owners.mayUse(tenant, previous)) return { ok: false, body: notFound(previous) };
    continues = previous;
  }
  if (!('request_id' in json)) {
    // The object's own brace (only whitespace may come before it), and a comma is valid: `model` is a member.
    const member = Buffer.from(`"request_id":${JSON.stringify(owners.mint(tenant))},`);
    const brace = raw.indexOf(OPEN_BRACE);
    return { ok: true, body: Buffer.concat([raw.subarray(0, brace + 1), member, raw.subarray(brace + 1)]), continues };
  }
  const chosen = json['request_id'];
  // Not a string: vLLM refuses it (a 400 of its own). A string: the id of the response it creates.
  if (typeof chosen === 'string' && (!isResponseId(chosen) || !owners.mayCreate(tenant, chosen))) {
    return {
      ok: false,
      body: errorBody('invalid_request', '`request_id` names a stored response this key may not replace (or is not a plain id of at most 256 `[A-Za-z0-9._:-]`); choose another, or send none and Waybill chooses one', 'request_id'),
    };
  }
  // The id is the tenant's from its admission, not from the answer: another tenant's request racing this one (in
  // this process, or another worker once it is told) is refused instead of overwriting it.
  if (typeof chosen === 'string') owners.bind(chosen, tenant);
  return { ok: true, body: undefined, continues };
}
