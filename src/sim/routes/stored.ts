/**
 * GET /v1/responses/{id} and POST /v1/responses/{id}/cancel: the stored-response routes, which never reach the engine —
 * method, auth, the fault header (only `status` and `reset_before_response`), then vLLM's `retrieve_responses` /
 * `cancel_responses` over the store.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { startReplay } from '../background.js';
import { headerValue, type Exchange, type SimContext } from '../context.js';
import { NO_DIRECTIVES, parseFaultHeader } from '../faults.js';
import { badRequestBody } from '../pooling-request.js';
import { sendBody } from '../respond.js';
import { CANNOT_CANCEL_BODY, responseNotFoundBody, retrieveQuery, storedResponseId, type StoredRoute } from '../stored-routes.js';
import { METHOD_NOT_ALLOWED_BODY, statusBody, UNAUTHORIZED_BODY } from '../wire.js';
import { faultHeaderError } from './read.js';

export function serveStored(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, route: StoredRoute, path: string): Promise<void> {
  serve(ctx, ex, req, res, route, path);
  return Promise.resolve();
}

function serve(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, route: StoredRoute, path: string): void {
  req.resume();
  const method = route === 'responses_retrieve' ? 'GET' : 'POST';
  if (req.method !== method) {
    ctx.reject(ex, res, 405, METHOD_NOT_ALLOWED_BODY, { allow: method });
    return;
  }
  if (!ctx.isAuthorized(req, path)) {
    ctx.reject(ex, res, 401, UNAUTHORIZED_BODY);
    return;
  }
  const id = storedResponseId(path);
  ex.record.responseId = id;
  const header = headerValue(req, 'x-sim-fault');
  if (header !== undefined) {
    const parsed = parseFaultHeader(header);
    if (!parsed.ok) {
      ctx.reject(ex, res, 400, faultHeaderError(parsed.message));
      return;
    }
    const fault = parsed.directives.fault;
    if (fault?.kind === 'status' || fault?.kind === 'reset_before_response') {
      ctx.applyFault(ex, fault);
      if (fault.kind === 'reset_before_response') {
        ctx.settle(ex, 'fault', 0);
        req.socket.resetAndDestroy();
      } else {
        const body = fault.status === 404 ? responseNotFoundBody(id) : statusBody(fault.status, ctx.opts.models[0] ?? '');
        sendBody(res, fault.status, body);
        ctx.settle(ex, 'fault', fault.status);
      }
      return;
    }
  }
  if (route === 'responses_cancel') {
    const entry = ctx.responses.get(id);
    if (entry === undefined) ctx.reject(ex, res, 404, responseNotFoundBody(id));
    else if (!entry.cancel()) ctx.reject(ex, res, 400, CANNOT_CANCEL_BODY);
    else {
      sendBody(res, 200, entry.body());
      ctx.settle(ex, 'completed', 200);
    }
    return;
  }
  const query = retrieveQuery(req.url ?? '');
  if (!query.ok) {
    ctx.reject(ex, res, 400, badRequestBody(query.message));
    return;
  }
  ex.record.stream = query.stream;
  const entry = ctx.responses.get(id);
  if (entry === undefined) {
    ctx.reject(ex, res, 404, responseNotFoundBody(id));
    return;
  }
  if (!query.stream) {
    sendBody(res, 200, entry.body());
    ctx.settle(ex, 'completed', 200);
    return;
  }
  const start = query.startingAfter === null ? 0 : query.startingAfter + 1;
  startReplay(res, entry, start, NO_DIRECTIVES.modifiers, {
    onEnd: (end) => ctx.settle(ex, end === 'completed' ? 'completed' : 'rejected', 200),
  });
}
