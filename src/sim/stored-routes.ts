/**
 * The HTTP side of vLLM's stored-response routes — `GET /v1/responses/{response_id}` and
 * `POST /v1/responses/{response_id}/cancel` (`openai/responses/api_router.py`): matching the path, reading the query
 * as FastAPI does, and the bodies vLLM answers with. The store itself is response-store.ts.
 */
import { errorBody } from './wire.js';

/** FastAPI's `{response_id}`: one non-empty path segment. */
const STORED_PATH = /^\/v1\/responses\/([^/]+)(\/cancel)?$/;

export type StoredRoute = 'responses_retrieve' | 'responses_cancel';

export function storedRouteOf(path: string): StoredRoute | undefined {
  const match = STORED_PATH.exec(path);
  if (match === null) return undefined;
  return match[2] === undefined ? 'responses_retrieve' : 'responses_cancel';
}

/** The response id a stored-response path names, percent-decoded as Starlette decodes path parameters. */
export function storedResponseId(path: string): string {
  const segment = STORED_PATH.exec(path)?.[1] ?? '';
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

/** vLLM's `_make_not_found_error`: an ErrorResponse the handler returns (the connection stays open). */
export function responseNotFoundBody(id: string): string {
  return errorBody({ message: `Response with id '${id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 });
}

/** `cancel_responses` on anything but a queued (or in-progress) response; vLLM's wording, whatever the response was. */
export const CANNOT_CANCEL_BODY = errorBody({
  message: 'Cannot cancel a synchronous response.',
  type: 'invalid_request_error',
  param: 'response_id',
  code: 400,
});

/** The query of GET /v1/responses/{id}: FastAPI's `stream: bool | None = False`, `starting_after: int | None = None`. */
export type RetrieveQuery =
  | { readonly ok: true; readonly stream: boolean; readonly startingAfter: number | null }
  | { readonly ok: false; readonly message: string };

/** The strings pydantic reads as a boolean (case-insensitive). */
const TRUE_WORDS = new Set(['1', 'true', 't', 'yes', 'y', 'on']);
const FALSE_WORDS = new Set(['0', 'false', 'f', 'no', 'n', 'off']);
const INTEGER = /^[+-]?\d{1,15}$/;

/** Read the query of `url`; a value pydantic would refuse is a message for vLLM's 400 `Bad Request`. */
export function retrieveQuery(url: string): RetrieveQuery {
  const query = url.indexOf('?');
  const params = new URLSearchParams(query < 0 ? '' : url.slice(query + 1));
  // A repeated scalar parameter: FastAPI reads the last value.
  const streamRaw = params.getAll('stream').at(-1);
  const afterRaw = params.getAll('starting_after').at(-1);
  let stream = false;
  if (streamRaw !== undefined) {
    const word = streamRaw.trim().toLowerCase();
    if (TRUE_WORDS.has(word)) stream = true;
    else if (!FALSE_WORDS.has(word)) return { ok: false, message: 'stream: Input should be a valid boolean, unable to interpret input' };
  }
  let startingAfter: number | null = null;
  if (afterRaw !== undefined) {
    const trimmed = afterRaw.trim();
    if (!INTEGER.test(trimmed)) return { ok: false, message: 'starting_after: Input should be a valid integer, unable to parse string as an integer' };
    startingAfter = Number(trimmed);
  }
  return { ok: true, stream, startingAfter };
}
