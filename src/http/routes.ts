/**
 * The API routes: each request is checked by its route's protocol (completions.ts, event-routes.ts, pooling.ts),
 * refused there if it must be, and otherwise handed on (dispatch.ts) to an Exchange (proxy/) that owns the raw
 * response from then on. No accounting happens here.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { isGenerationRoute, OTHER, type PoolingRoute } from '../accounting/outcomes.js';
import { errorBody } from '../delivery/errors.js';
import { isResponseId } from '../proxy/response-homes.js';
import { isRecord } from '../util/json.js';
import { API_PATHS, FORM_PATHS } from './answers.js';
import type { ParsedBody } from './body.js';
import { checkCompletion, withUsageRequested } from './completions.js';
import { mayUse, modelOf, proxy, type RequestDeps, type RoutesDeps } from './dispatch.js';
import { checkMessages, checkResponses } from './event-routes.js';
import { checkAudio, checkOpaque, checkPooling } from './pooling.js';
import { bindResponse, notFound } from './stored.js';


/**
 * A request's deps, the same for every request of a generation: built once per generation (a reload makes a new
 * one), not once per request — an object spread per request showed in the per-request profile
 * (docs/performance.md).
 */
function requestDepsOf(shared: RoutesDeps): (request: FastifyRequest) => RequestDeps {
  const byGeneration = new WeakMap<FastifyRequest['generation'], RequestDeps>();
  return (request) => {
    const generation = request.generation;
    let deps = byGeneration.get(generation);
    if (deps === undefined) {
      deps = {
        ...shared,
        config: generation.config,
        upstreams: generation.upstreams,
        exchangeDeps: generation.exchangeDeps,
        limiter: generation.limiter,
        onExchange: (exchange) => generation.track(exchange),
      };
      byGeneration.set(generation, deps);
    }
    return deps;
  };
}

export function registerApiRoutes(app: FastifyInstance, shared: RoutesDeps): void {
  const requestDeps = requestDepsOf(shared);
  for (const [apiPath, route] of API_PATHS) {
    app.post(apiPath, { config: { waybillRoute: route } }, (request, reply) => {
      const deps = requestDeps(request);
      const { config, upstreams, answers } = deps;
      const charsPerToken = config.metrics.charsPerToken;
      const parsed = request.body as ParsedBody | undefined;
      if (parsed === undefined || parsed.form === true) {
        answers.reject(request, reply, route, false, errorBody('unsupported_media_type', 'send the request as application/json'));
        return;
      }
      const checked = isGenerationRoute(route)
        ? checkCompletion(route, parsed.json, config.server.max_choices, charsPerToken)
        : route === 'responses'
          ? checkResponses(parsed.json, charsPerToken)
          : route === 'messages'
            ? checkMessages(parsed.json, charsPerToken)
            : route === 'count_tokens'
              ? checkOpaque(parsed.json, upstreams.models(), undefined)
              : checkPooling(route as PoolingRoute, parsed.json, upstreams.models(), charsPerToken);
      if (!checked.ok) {
        answers.reject(request, reply, route, checked.stream, checked.body, (parsed.json as { model?: unknown } | null)?.model);
        return;
      }
      const json = parsed.json as Record<string, unknown>;
      const fields = checked.fields;
      // Its response is bound to the tenant, and a continuation goes where the response it continues lives.
      const bound = route === 'responses' ? bindResponse(deps.owners, request.tenant, json, parsed.raw) : undefined;
      if (bound?.ok === false) {
        answers.reject(request, reply, route, fields.stream, bound.body, fields.model);
        return;
      }
      const withUsage = fields.stream && config.streaming.injectUsage && !fields.clientAskedUsage ? withUsageRequested(parsed.raw, json) : undefined;
      const body = bound?.body ?? withUsage ?? parsed.raw;
      const stored = bound?.continues === undefined ? undefined : { id: bound.continues, modelFromHome: false };
      proxy(deps, request, reply, { route, apiPath, fields, json, body, dropUsageChunk: withUsage !== undefined, ...(stored !== undefined && { stored }) });
    });
  }

  for (const [apiPath, route] of FORM_PATHS) {
    app.post(apiPath, { config: { waybillRoute: route } }, (request, reply) => {
      const deps = requestDeps(request);
      const { upstreams, answers } = deps;
      const parsed = request.body as ParsedBody | undefined;
      if (parsed?.form !== true) {
        answers.reject(request, reply, route, false, errorBody('unsupported_media_type', 'send the request as multipart/form-data'));
        return;
      }
      const checked = checkAudio(parsed.json as Record<string, string>, upstreams.models());
      if (!checked.ok) {
        answers.reject(request, reply, route, checked.stream, checked.body, (parsed.json as { model?: unknown }).model);
        return;
      }
      proxy(deps, request, reply, {
        route,
        apiPath,
        fields: checked.fields,
        json: {},
        body: parsed.raw,
        contentType: request.headers['content-type'] ?? null,
      });
    });
  }

  // Stored responses: read and cancelled where they live (proxy/response-homes.ts).
  const storeRoute = (route: 'responses_retrieve' | 'responses_cancel', method: 'GET' | 'POST', suffix: string) => {
    app.route({
      method,
      url: `/v1/responses/:id${suffix}`,
      config: { waybillRoute: route },
      handler: (request, reply) => {
        const deps = requestDeps(request);
        const { upstreams, answers } = deps;
        const id = (request.params as { id: string }).id;
        const query = request.url.indexOf('?');
        const search = query < 0 ? '' : request.url.slice(query);
        // FastAPI's reading of `stream`: the last value, as a pydantic boolean (vLLM answers a value it cannot read).
        const stream = route === 'responses_retrieve' && queryFlag(search, 'stream') === true;
        // Another tenant's id is answered as an id nobody holds: the same 404, and no upstream asked.
        if (!isResponseId(id) || !deps.owners.mayUse(request.tenant, id)) {
          answers.reject(request, reply, route, stream, notFound(id));
          return;
        }
        // Known home: its model is checked before anything else; unknown: after the lookup (which is limited).
        const known = deps.homes.known(id, upstreams);
        const model = known === undefined ? OTHER : modelOf(upstreams, known);
        if (known !== undefined && !mayUse(deps.config, request.tenant, model)) {
          answers.reject(request, reply, route, stream, errorBody('model_not_allowed', `Your key may not use the model \`${model}\`.`, 'model'), model);
          return;
        }
        proxy(deps, request, reply, {
          route,
          apiPath: `/v1/responses/${encodeURIComponent(id)}${suffix}${search}`,
          method,
          stored: { id, modelFromHome: true },
          fields: { model, stream, expectedChoices: stream ? 1 : 0, clientAskedUsage: true, promptTokensEstimate: undefined },
          json: {},
          body: EMPTY,
          contentType: null,
        });
      },
    });
  };
  storeRoute('responses_retrieve', 'GET', '');
  storeRoute('responses_cancel', 'POST', '/cancel');

  // The operator's pass-through allow-list: proxied as they are, answered as one body.
  for (const entry of shared.config.passthrough) {
    app.route({
      method: [...entry.methods],
      url: entry.path,
      config: { waybillRoute: 'passthrough' },
      handler: (request, reply) => {
        const deps = requestDeps(request);
        const { upstreams, answers } = deps;
        const parsed = request.body as ParsedBody | undefined;
        if (parsed?.form === true) {
          answers.reject(request, reply, 'passthrough', false, errorBody('unsupported_media_type', 'send the request as application/json'));
          return;
        }
        const checked = checkOpaque(parsed?.json ?? {}, upstreams.models(), entry.model);
        if (!checked.ok) {
          answers.reject(request, reply, 'passthrough', false, checked.body);
          return;
        }
        const query = request.url.indexOf('?');
        proxy(deps, request, reply, {
          route: 'passthrough',
          apiPath: `${entry.path}${query < 0 ? '' : request.url.slice(query)}`,
          method: request.method as 'GET' | 'POST' | 'PUT' | 'DELETE',
          fields: checked.fields,
          json: isRecord(parsed?.json) ? parsed.json : {},
          body: parsed?.raw ?? EMPTY,
          contentType: parsed === undefined || parsed.raw.length === 0 ? null : 'application/json',
        });
      },
    });
  }

  // Served models, as far as the caller's tenant may use them.
  app.get('/v1/models', (request, reply) => {
    const { config, upstreams } = request.generation;
    const created = Math.floor(Date.now() / 1000);
    void reply.send({
      object: 'list',
      data: upstreams
        .models()
        .filter((id) => mayUse(config, request.tenant, id))
        .map((id) => ({ id, object: 'model', created, owned_by: 'waybill' })),
    });
  });
}

const EMPTY = Buffer.alloc(0);

const TRUE = new Set(['1', 'true', 't', 'yes', 'y', 'on']);
const FALSE = new Set(['0', 'false', 'f', 'no', 'n', 'off']);

/** A query flag as FastAPI reads it: its last value, as a pydantic boolean; undefined when absent or unreadable. */
function queryFlag(search: string, name: string): boolean | undefined {
  const value = new URLSearchParams(search).getAll(name).at(-1)?.trim().toLowerCase();
  if (value === undefined) return undefined;
  return TRUE.has(value) ? true : FALSE.has(value) ? false : undefined;
}

