/**
 * vLLM's operational endpoints — /health, /ping, /v1/models, /metrics, /version, /load — with no record, only a status
 * count; the control plane (/sim/stats, /sim/restart), which counts nothing; and an unknown route, which gets a
 * record (a gateway sending traffic to the wrong path should be visible).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { SimContext } from '../context.js';
import { MAX_MODEL_LEN } from '../request.js';
import { sendBody } from '../respond.js';
import { renderMetrics, type OperationalPath } from '../stats.js';
import { METHOD_NOT_ALLOWED_BODY, modelListBody, NOT_FOUND_BODY, UNAUTHORIZED_BODY } from '../wire.js';

const METRICS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

/** `/ping` takes POST too, as SageMaker's does. */
export function serveOperational(ctx: SimContext, req: IncomingMessage, res: ServerResponse, path: OperationalPath): void {
  req.resume();
  if (!ctx.isAuthorized(req, path)) {
    ctx.respond(res, 401, UNAUTHORIZED_BODY);
    return;
  }
  const methods = path === '/ping' ? ['GET', 'POST'] : ['GET'];
  if (!methods.includes(req.method ?? '')) {
    ctx.respond(res, 405, METHOD_NOT_ALLOWED_BODY, 'application/json', { allow: methods.join(', ') });
    return;
  }
  switch (path) {
    case '/health':
    case '/ping':
      ctx.respond(res, ctx.engineDead ? 503 : 200, '', null);
      return;
    case '/v1/models':
      ctx.respond(res, 200, modelListBody(ctx.opts.models, MAX_MODEL_LEN, Math.floor(Date.now() / 1000)));
      return;
    case '/metrics':
      ctx.respond(res, 200, metricsText(ctx), METRICS_CONTENT_TYPE);
      return;
    case '/version':
      ctx.respond(res, 200, JSON.stringify({ version: ctx.opts.revision }));
      return;
    case '/load':
      // vLLM counts its load only with --enable-server-load-tracking; without it, 0.
      ctx.respond(res, 200, JSON.stringify({ server_load: 0 }));
      return;
  }
}

/** vLLM's /metrics: the engine model's (src/sim/engine/metrics.ts), or the timer's five series. */
function metricsText(ctx: SimContext): string {
  const snapshot = ctx.engine?.snapshot();
  if (ctx.metrics === null || snapshot === undefined) return renderMetrics(ctx.store.engine, ctx.opts.models[0] ?? '');
  return ctx.metrics.render({ running: snapshot.running, waiting: snapshot.waiting, kvUsage: snapshot.kvUsage });
}

interface ControlRoute {
  readonly method: string;
  serve(ctx: SimContext, res: ServerResponse): void;
}

/** The control plane: reading the stats or restarting the engine does not count as a request. */
const CONTROL_ROUTES: ReadonlyMap<string, ControlRoute> = new Map([
  ['/sim/stats', { method: 'GET', serve: (ctx, res) => sendBody(res, 200, JSON.stringify(ctx.store.snapshot())) }],
  [
    '/sim/restart',
    {
      method: 'POST',
      serve: (ctx, res) => {
        ctx.restart();
        sendBody(res, 200, JSON.stringify({ restarted: true }));
      },
    },
  ],
]);

/** A control-plane path answered (true), or not one (false). */
export function serveControl(ctx: SimContext, req: IncomingMessage, res: ServerResponse, path: string): boolean {
  const control = CONTROL_ROUTES.get(path);
  if (control === undefined) return false;
  req.resume();
  if (req.method === control.method) control.serve(ctx, res);
  else sendBody(res, 405, METHOD_NOT_ALLOWED_BODY, 'application/json', { allow: control.method });
  return true;
}

export function serveUnknown(ctx: SimContext, req: IncomingMessage, res: ServerResponse, path: string): void {
  req.resume();
  const ex = ctx.open(req, 'other', path);
  const status = ctx.isAuthorized(req, path) ? 404 : 401;
  sendBody(res, status, status === 404 ? NOT_FOUND_BODY : UNAUTHORIZED_BODY);
  ctx.settle(ex, 'rejected', status);
}
