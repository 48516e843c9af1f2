/**
 * The API routes: each completion request is checked, counted if the gateway answers it itself, and otherwise handed
 * to an Exchange (proxy/) that owns the raw response from then on. No accounting happens here.
 */
import type { Tracer } from '@opentelemetry/api';
import type { FastifyInstance } from 'fastify';
import type { Config } from '../config/load.js';
import { errorBody } from '../delivery/errors.js';
import { Exchange, type CompletionRequest, type ExchangeDeps } from '../proxy/exchange.js';
import { upstreamHeaders } from '../proxy/headers.js';
import type { UpstreamRegistry } from '../proxy/upstreams.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import { NO_TRACE, startRequestTrace } from '../telemetry/request-trace.js';
import { isGenerationRoute } from '../accounting/outcomes.js';
import { answerRaw, API_PATHS, type Answers } from './answers.js';
import type { ParsedBody } from './body.js';
import { checkCompletion, withUsageRequested } from './completions.js';
import { readContract } from './contract.js';
import { checkMessages, checkResponses, readMessagesContract, readResponsesContract } from './event-routes.js';
import { checkPooling } from './pooling.js';
import type { OutputContract, SchemaCompiler } from '../accounting/output-contract.js';
import type { ProxiedRoute } from '../accounting/outcomes.js';
import type { SchemaCache } from '../accounting/schemas.js';
import { inSample, sampleRate } from '../telemetry/evaluation.js';

export interface RoutesDeps {
  readonly config: Config;
  readonly upstreams: UpstreamRegistry;
  readonly tracer: Tracer | undefined;
  readonly guard: ObserverGuard;
  readonly answers: Answers;
  readonly exchangeDeps: ExchangeDeps;
  /** Called with each exchange that starts (the lifecycle tracks them for the drain). */
  readonly onExchange: (exchange: Exchange) => void;
  /** Compiled JSON Schemas of output contracts, shared by all requests. */
  readonly schemas: SchemaCache;
}

export function registerApiRoutes(app: FastifyInstance, deps: RoutesDeps): void {
  const { config, upstreams, tracer, guard, answers } = deps;

  for (const [apiPath, route] of API_PATHS) {
    app.post(apiPath, (request, reply) => {
      const parsed = request.body as ParsedBody | undefined;
      if (parsed === undefined) {
        answers.reject(request, reply, route, false, errorBody('unsupported_media_type', 'send the request as application/json'));
        return;
      }
      const charsPerToken = config.metrics.charsPerToken;
      const checked = isGenerationRoute(route)
        ? checkCompletion(route, parsed.json, config.server.max_choices, charsPerToken)
        : route === 'responses'
          ? checkResponses(parsed.json, charsPerToken)
          : route === 'messages'
            ? checkMessages(parsed.json, charsPerToken)
            : checkPooling(route, parsed.json, upstreams.models(), charsPerToken);
      if (!checked.ok) {
        answers.reject(request, reply, route, checked.stream, checked.body, (parsed.json as { model?: unknown } | null)?.model);
        return;
      }
      const fields = checked.fields;
      if (upstreams.poolFor(fields.model) === undefined) {
        answers.reject(request, reply, route, fields.stream, errorBody('model_not_found', `The model \`${fields.model}\` does not exist.`, 'model'));
        return;
      }
      const json = parsed.json as Record<string, unknown>;
      const withUsage = fields.stream && config.streaming.injectUsage && !fields.clientAskedUsage ? withUsageRequested(parsed.raw, json) : undefined;
      const start = { route, path: apiPath, model: fields.model, stream: fields.stream, requestId: request.id, arrivalAt: request.arrivalAt, body: json };
      const evaluation = config.evaluation;
      const evaluatorHeader = evaluation.evaluatorHeader;
      const evaluatorValue = evaluatorHeader === undefined ? undefined : request.headers[evaluatorHeader];
      const trace = guard.trace(guard.run('tracing', () => startRequestTrace(tracer, request.headers, start, config.tracing.captureContent), NO_TRACE));
      const completion: CompletionRequest = {
        route,
        apiPath,
        model: fields.model,
        stream: fields.stream,
        body: withUsage ?? parsed.raw,
        expectedChoices: fields.expectedChoices,
        promptTokensEstimate: fields.promptTokensEstimate,
        contract: contractOf(route, json, deps.schemas.compile),
        evaluator: evaluatorValue !== undefined && evaluatorValue !== '',
        // The sample is decided from the request id alone: the same decision the settlement recorder makes.
        captureAnswer: evaluation.captureContent && inSample(request.id, sampleRate(evaluation, fields.model)),
        dropUsageChunk: withUsage !== undefined,
        requestId: request.id,
        headers: upstreamHeaders(request.headers, request.id, fields.stream, tracer === undefined),
        arrivalAt: request.arrivalAt,
        trace,
      };
      void reply.hijack();
      let exchange: Exchange;
      try {
        exchange = new Exchange(deps.exchangeDeps, completion, reply.raw);
      } catch (error) {
        // Nothing was started: answered and counted here, once. (Once started, the machine guards itself.)
        guard.report('exchange', error);
        answerRaw(reply.raw, request.id, 500, errorBody('internal_error', 'internal error'));
        answers.record(answers.startOf(request, route, fields.stream, fields.model), 500);
        return;
      }
      deps.onExchange(exchange);
      exchange.start();
    });
  }

  app.get('/v1/models', (_request, reply) => {
    const created = Math.floor(Date.now() / 1000);
    void reply.send({
      object: 'list',
      data: upstreams.models().map((id) => ({ id, object: 'model', created, owned_by: 'waybill' })),
    });
  });
}

/** The output contract the request asks for, read by its route's protocol; pooling routes have none. */
function contractOf(route: ProxiedRoute, json: Record<string, unknown>, compile: SchemaCompiler): OutputContract | undefined {
  if (route === 'chat_completions' || route === 'completions') return readContract(json, compile, route === 'chat_completions');
  if (route === 'responses') return readResponsesContract(json, compile);
  if (route === 'messages') return readMessagesContract(json, compile);
  return undefined;
}
