/**
 * A checked request on its way to an Exchange: its model served and allowed, the tenant's limits asked (and, for a
 * stored response, its home found), then the Exchange built from the request and started — from then on it owns the
 * raw response. Every refusal on the way is answered and counted once, through answers.ts.
 */
import type { Tracer } from '@opentelemetry/api';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { OTHER, type ProxiedRoute } from '../accounting/outcomes.js';
import type { OutputContract, SchemaCompiler } from '../accounting/output-contract.js';
import type { SchemaCache } from '../accounting/schemas.js';
import type { Config } from '../config/load.js';
import { errorBody } from '../delivery/errors.js';
import { Exchange, type CompletionRequest, type ExchangeDeps } from '../proxy/exchange.js';
import { upstreamHeaders } from '../proxy/headers.js';
import { requestInfo } from '../proxy/request-facts.js';
import type { ResponseHomes } from '../proxy/response-homes.js';
import type { ResponseOwners } from '../proxy/response-owners.js';
import { reservedTokens, type Admission, type LimitTicket, type TenantLimiter } from '../proxy/tenant-limits.js';
import type { Upstream, UpstreamRegistry } from '../proxy/upstreams.js';
import { NO_ROUTING_KEY, routingKey, type RoutingKey } from '../routing/router.js';
import { inSample, sampleRate } from '../telemetry/evaluation.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import { NO_TRACE, startRequestTrace } from '../telemetry/request-trace.js';
import { answerRaw, type Answers } from './answers.js';
import { clientRetryOf } from './client-retry.js';
import type { CompletionFields } from './completions.js';
import { readContract } from './contract.js';
import { readMessagesContract, readResponsesContract } from './event-routes.js';
import { notFound } from './stored.js';

export interface RoutesDeps {
  /** The configuration the app started with: its pass-through routes (fastify's routes are fixed once it listens). */
  readonly config: Config;
  readonly tracer: Tracer | undefined;
  readonly guard: ObserverGuard;
  readonly answers: Answers;
  /** Compiled JSON Schemas of output contracts, shared by all requests. */
  readonly schemas: SchemaCache;
  /** Where stored responses live. */
  readonly homes: ResponseHomes;
  /** Whose each stored response is (docs/security.md "tenant model for stored responses"). */
  readonly owners: ResponseOwners;
  /** For the refusals of the tenants' limits (waybill_rate_limited_total). */
  readonly metrics: GatewayMetrics;
}

/** What one request's handling uses: the shared parts, and those of the request's generation (generation.ts). */
export interface RequestDeps extends RoutesDeps {
  readonly upstreams: UpstreamRegistry;
  readonly exchangeDeps: ExchangeDeps;
  /** Called with each exchange that starts (its generation tracks it, as does the lifecycle, for the drain). */
  readonly onExchange: (exchange: Exchange) => void;
  /** Limits per tenant. */
  readonly limiter: TenantLimiter;
}

/** Whether `tenant` may use `model`: unless its `tenants.<name>.models` lists others only. */
export function mayUse(config: Config, tenant: string, model: string): boolean {
  const allowed = config.tenants[tenant]?.models;
  return allowed === undefined || allowed.includes(model);
}

export interface Proxied {
  readonly route: ProxiedRoute;
  /** The upstream path (and query). */
  readonly apiPath: string;
  readonly method?: 'GET' | 'POST' | 'PUT' | 'DELETE';
  readonly pinned?: Upstream;
  /** The stored response the request reads, cancels or continues: forgotten by the homes map if its home answers 404. */
  readonly storedId?: string;
  /**
   * The request goes where this stored response lives: found (a lookup, limited per tenant) once the request is
   * admitted, then pinned there. `modelFromHome`: the request has no model of its own (a read or a cancel).
   */
  readonly stored?: { readonly id: string; readonly modelFromHome: boolean };
  readonly fields: CompletionFields;
  /** The JSON body (for the span and the output contract); {} for a form or no body. */
  readonly json: Record<string, unknown>;
  readonly body: Buffer;
  readonly dropUsageChunk?: boolean;
  /** The upstream request's Content-Type (JSON unless given; null: no body). */
  readonly contentType?: string | null;
}

/** Hands a checked request to an Exchange, which owns the raw response from then on. */
export function proxy(deps: RequestDeps, request: FastifyRequest, reply: FastifyReply, p: Proxied): void {
  const { config, upstreams, guard, answers } = deps;
  const { fields, route } = p;
  // A read or cancel of a stored response has its home's model, checked where the home is known (its route, locate).
  const ownModel = p.pinned === undefined && p.stored?.modelFromHome !== true;
  if (ownModel && upstreams.poolFor(fields.model) === undefined) {
    if (upstreams.discoveryPending()) {
      // A pool has not read its model list yet (its upstreams down, or not answering /v1/models): the model may be
      // one it serves. Retry once the next discovery may have succeeded.
      void reply.header('retry-after', String(Math.max(1, Math.ceil(config.discovery.refreshIntervalMs / 1000))));
      answers.reject(request, reply, route, fields.stream, errorBody('model_unavailable', `The model \`${fields.model}\` is not available yet: model discovery has not succeeded. Please retry.`, 'model'), fields.model);
      return;
    }
    answers.reject(request, reply, route, fields.stream, errorBody('model_not_found', `The model \`${fields.model}\` does not exist.`, 'model'));
    return;
  }
  if (p.stored?.modelFromHome !== true && !mayUse(config, request.tenant, fields.model)) {
    answers.reject(request, reply, route, fields.stream, errorBody('model_not_allowed', `Your key may not use the model \`${fields.model}\`.`, 'model'), fields.model);
    return;
  }
  // The tenant's limits: the last check, so only a request that would be sent upstream is counted against them.
  const admission = deps.limiter.admit(request.tenant, reservedTokens(route, p.json, fields, config.limits.defaultMaxTokens));
  if (admission === undefined) {
    dispatch(deps, request, reply, p, undefined);
  } else if (admission instanceof Promise) {
    // A shared store answers later (within limits.redis_timeout); an in-process one at once. The client may leave
    // meanwhile: then nothing is sent upstream, and the request is counted once, here, as cancelled.
    let left = false;
    const onClose = () => (left = true);
    reply.raw.once('close', onClose);
    void admission
      .catch((error: unknown) => {
        // The limiter turns a store's failure into an admission; this is a bug of its own: admitted unlimited.
        guard.report('http', error);
        return undefined;
      })
      .then((admitted) => {
        reply.raw.off('close', onClose);
        if (left || request.raw.socket.destroyed) abandoned(deps, request, reply, p, admitted);
        else if (admitted === undefined) dispatch(deps, request, reply, p, undefined);
        else admitOrRefuse(deps, request, reply, p, admitted);
      });
  } else {
    admitOrRefuse(deps, request, reply, p, admission);
  }
}

/**
 * The client left while its admission was pending: nothing goes upstream. An admitted request gives back its tokens
 * and its slot (it stays counted against requests_per_minute: it was admitted); the request is counted once, as
 * cancelled by its client, whatever the limiter decided.
 */
function abandoned(deps: RequestDeps, request: FastifyRequest, reply: FastifyReply, p: Proxied, admission: Admission | undefined): void {
  if (admission?.admitted === true) deps.guard.run('http', () => admission.ticket.settle(0));
  void reply.hijack();
  reply.raw.destroy();
  deps.answers.record(deps.answers.startOf(request, p.route, p.fields.stream, p.fields.model), 'cancelled');
}

function admitOrRefuse(deps: RequestDeps, request: FastifyRequest, reply: FastifyReply, p: Proxied, admission: Admission): void {
  if (admission.admitted) {
    dispatch(deps, request, reply, p, admission.ticket);
    return;
  }
  const { fields, route } = p;
  if ('unavailable' in admission) {
    // The shared store did not answer and the limits fail closed (limits.redis_fail_open: false).
    void reply.header('retry-after', '1');
    deps.answers.reject(request, reply, route, fields.stream, errorBody('limits_unavailable', admission.message), fields.model);
    return;
  }
  // Counted here, not by the limiter: a client that left while a shared store decided was not refused (abandoned).
  deps.guard.run('metrics', () => deps.metrics.rateLimited(request.tenant, admission.limit));
  void reply.headers(admission.headers);
  if (admission.retryAfter !== undefined) void reply.header('retry-after', String(admission.retryAfter));
  deps.answers.reject(request, reply, route, fields.stream, errorBody('rate_limited', admission.message), fields.model);
}

/**
 * An admitted request naming a stored response: sent where the response lives, found by a lookup when not
 * remembered (after the admission, so a tenant's lookups count against its limits and its own lookup cap). No home:
 * vLLM's 404; the tenant's lookups at their cap: 429. Either way the admission is given back, and counted once.
 */
async function locate(deps: RequestDeps, request: FastifyRequest, reply: FastifyReply, p: Proxied & { stored: NonNullable<Proxied['stored']> }, limit: LimitTicket | undefined): Promise<void> {
  const { upstreams, answers, guard } = deps;
  const { route, fields, stored } = p;
  let found: Upstream | undefined | 'busy';
  try {
    found = await deps.homes.find(stored.id, upstreams, { tenant: request.tenant });
  } catch (error) {
    guard.report('http', error);
    found = undefined;
  }
  const refuse = (body: ReturnType<typeof errorBody>, model?: string) => {
    if (limit !== undefined) {
      guard.run('http', () => limit.settle(0));
      void reply.headers(limit.headers);
    }
    answers.reject(request, reply, route, fields.stream, body, model ?? (stored.modelFromHome ? undefined : fields.model));
  };
  // (The request stream itself is destroyed once its body is read: its socket tells whether the client left.)
  if (request.raw.socket === null || request.raw.socket.destroyed || reply.raw.destroyed) {
    // The client left during the lookup: nobody to answer, counted once as a cancellation.
    abandoned(deps, request, reply, p, limit === undefined ? undefined : { admitted: true, ticket: limit });
    return;
  }
  if (found === 'busy') {
    void reply.header('retry-after', '1');
    refuse(errorBody('rate_limited', `too many stored-response lookups of this tenant are in flight (responses.max_lookups_per_tenant: ${deps.config.responses.maxLookupsPerTenant}); retry shortly`));
    return;
  }
  if (found === undefined) {
    refuse(notFound(stored.id));
    return;
  }
  let model = fields.model;
  if (stored.modelFromHome) {
    model = modelOf(upstreams, found);
    if (!mayUse(deps.config, request.tenant, model)) {
      refuse(errorBody('model_not_allowed', `Your key may not use the model \`${model}\`.`, 'model'), model);
      return;
    }
  }
  dispatch(deps, request, reply, { ...p, pinned: found, storedId: stored.id, fields: { ...fields, model } }, limit);
}

/** The model label of a request served by `upstream` alone: its pool's first model. */
export function modelOf(upstreams: UpstreamRegistry, upstream: Upstream): string {
  return upstreams.pools.find((pool) => pool.upstreams.includes(upstream))?.models[0] ?? OTHER;
}

/** Starts the Exchange of an admitted request: from here on it owns the raw response. */
function dispatch(deps: RequestDeps, request: FastifyRequest, reply: FastifyReply, p: Proxied, limit: LimitTicket | undefined): void {
  if (p.stored !== undefined && p.pinned === undefined) {
    void locate(deps, request, reply, { ...p, stored: p.stored }, limit);
    return;
  }
  const { config, tracer, guard, answers } = deps;
  const { fields, route } = p;
  const path = request.routeOptions.url ?? p.apiPath;
  const start = { route, path, model: fields.model, stream: fields.stream, requestId: request.id, arrivalAt: request.arrivalAt, body: p.json };
  const evaluation = config.evaluation;
  const evaluatorHeader = evaluation.evaluatorHeader;
  const evaluatorValue = evaluatorHeader === undefined ? undefined : request.headers[evaluatorHeader];
  const evaluator = evaluatorValue !== undefined && evaluatorValue !== '';
  const trace = guard.trace(guard.run('tracing', () => startRequestTrace(tracer, request.headers, start, config.tracing.captureContent), NO_TRACE));
  // The request's facts, built once here: the machine, the ledger and the shell all read these.
  const info = {
    ...requestInfo(config, {
      route,
      tenant: request.tenant,
      model: fields.model,
      stream: fields.stream,
      expectedChoices: fields.expectedChoices,
      promptTokensEstimate: fields.promptTokensEstimate,
      contract: fields.expectedChoices > 0 ? contractOf(route, p.json, deps.schemas.compile) : undefined,
      evaluator,
      // The sample is decided from the request id alone: the same decision the settlement recorder makes (never for
      // evaluator traffic, which is not sampled).
      captureAnswer: !evaluator && evaluation.captureContent && inSample(request.id, sampleRate(evaluation, fields.model)),
      clientRetry: clientRetryOf(request.headers),
      dropUsageChunk: p.dropUsageChunk === true,
    }),
    route,
  };
  const completion: CompletionRequest = {
    info,
    apiPath: p.apiPath,
    ...(p.method !== undefined && { method: p.method }),
    ...(p.pinned !== undefined && { pinned: p.pinned }),
    ...(p.storedId !== undefined && { storedId: p.storedId }),
    body: p.body,
    requestId: request.id,
    ...(limit !== undefined && { limit }),
    ...(route === 'responses' && p.json['background'] === true && { background: true }),
    headers: upstreamHeaders(request.headers, request.id, fields.stream, tracer === undefined, p.contentType === undefined ? 'application/json' : p.contentType),
    arrivalAt: request.arrivalAt,
    trace,
    ...(p.pinned === undefined && { routing: routingKeyOf(deps, request, route, fields.model, p.json, guard) }),
  };
  void reply.hijack();
  // On every response of a limited tenant, the 200s too: Node merges headers set here into the Exchange's writeHead.
  if (limit !== undefined) for (const [name, value] of Object.entries(limit.headers)) reply.raw.setHeader(name, value);
  let exchange: Exchange;
  try {
    exchange = new Exchange(deps.exchangeDeps, completion, reply.raw);
  } catch (error) {
    // Nothing was started: answered and counted here, once. (Once started, the machine guards itself.)
    guard.report('exchange', error);
    limit?.settle(0);
    answerRaw(reply.raw, request.id, 500, errorBody('internal_error', 'internal error'));
    answers.record(answers.startOf(request, route, fields.stream, fields.model), 500);
    return;
  }
  deps.onExchange(exchange);
  exchange.start();
}

/**
 * The request's key for its pool's picking: the prefix blocks of its rendered prompt and its session (pools[].routing,
 * src/routing/router.ts). Bounded work; a throw is reported and the request is picked without a key.
 */
function routingKeyOf(deps: RequestDeps, request: FastifyRequest, route: ProxiedRoute, model: string, json: unknown, guard: RequestDeps['guard']): RoutingKey {
  const settings = deps.upstreams.routingFor(model);
  if (settings === undefined) return NO_ROUTING_KEY;
  const header = settings.sessionHeader === undefined ? undefined : request.headers[settings.sessionHeader];
  const session = Array.isArray(header) ? header[0] : header;
  return guard.run('http', () => routingKey(settings, route, json, session), NO_ROUTING_KEY);
}

/** The output contract the request asks for, read by its route's protocol; pooling routes have none. */
function contractOf(route: ProxiedRoute, json: Record<string, unknown>, compile: SchemaCompiler): OutputContract | undefined {
  if (route === 'chat_completions' || route === 'completions') return readContract(json, compile, route === 'chat_completions');
  if (route === 'responses') return readResponsesContract(json, compile);
  if (route === 'messages') return readMessagesContract(json, compile);
  return undefined;
}
