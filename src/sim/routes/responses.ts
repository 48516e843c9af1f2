/**
 * /v1/responses: a Responses stream or body, stored when asked (with the store on), or — `background: true` — a
 * generation detached from its connection whose events the store keeps for replays (background.ts).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Exchange, SimContext } from '../context.js';
import { appliesToBackground, startBackground, startReplay } from '../background.js';
import type { Fault, Modifiers } from '../faults.js';
import type { AnswerShape } from '../plan.js';
import { sendBody } from '../respond.js';
import { StoredResponse } from '../response-store.js';
import { randomId, readResponsesRequest } from '../responses.js';
import { createResponsesWriter, responsesBody, type FinalResponseHook, type ResponsesAnswer } from '../responses-answer.js';
import { choiceText } from '../wire.js';
import { answerEventRoute, shapeAsChat } from './event-route.js';
import { answerFaultAtOnce, chooseFault, readJson } from './read.js';

export async function serveResponses(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, _route: 'responses', path: string): Promise<void> {
  const read = await readJson(ctx, ex, req, res, path, 'Bad Request');
  if (read === null) return;
  const result = readResponsesRequest(read.body, ctx.opts.models, ex.record, ctx.engineDead, ctx.opts.responsesStore ? ctx.storeLookup : null);
  if (!result.ok) {
    ctx.refuse(ex, res, result.refusal);
    return;
  }
  const request = result.request;
  ex.record.promptTokens = request.promptTokens;
  const fault = chooseFault(ctx, ex, read, request.stream, true, request.background ? appliesToBackground : undefined);
  if (answerFaultAtOnce(ctx, ex, req, res, fault, request.model)) return;

  const { modifiers } = read.directives;
  const createdSeconds = Math.floor(Date.now() / 1000);
  // Responses always reports cached tokens, whatever --prompt-tokens-details says.
  const shape = shapeAsChat(
    ex,
    { model: request.model, stream: request.stream, promptTokens: request.promptTokens, maxTokens: request.maxOutputTokens },
    modifiers,
    { ...ctx.opts, promptTokensDetails: true },
    createdSeconds,
  );
  // X-Request-Id is not used here: the id is the body's request_id, or resp_<16 hex> (the record's id if generated).
  const id = request.requestId ?? `resp_${ex.record.headers['x-request-id'] === undefined ? ex.record.requestId : randomId()}`;
  ex.record.responseId = id;
  const answer: ResponsesAnswer = {
    tokens: shape.tokensPerChoice,
    finishReason: shape.finishReason,
    promptTokens: request.promptTokens,
    usage: !modifiers.noUsage,
    request,
    id,
    createdAt: createdSeconds,
    cachedTokens: shape.usage.cachedTokens ?? 0,
  };
  if (request.background) {
    runBackground(ctx, ex, res, answer, shape, fault, modifiers);
    return;
  }
  // Stored (with the store on and `store`) once the generation ran to its end, as the answer or
  // response.completed carries it; a cut, stalled or abandoned request leaves nothing.
  const onFinal: FinalResponseHook | undefined = request.store
    ? (final, status) => {
        const entry = new StoredResponse(answer, 'queued', null);
        entry.finish(final, status, choiceText(0, 0, answer.tokens).length);
        ctx.responses.put(entry);
      }
    : undefined;
  answerEventRoute(ctx, ex, res, { request, shape, fault, modifiers }, {
    writer: () => createResponsesWriter(answer, onFinal),
    body: () => responsesBody(answer, onFinal),
  });
}

/**
 * `background: true` (with the store on): the response is stored `queued` and answered at once — as JSON, or as a
 * replay of the task's events (`stream`) — while the generation runs detached from the connection. The request's
 * record ends with the generation: `completed`, `fault` (an engine error killed it: the stored status stays
 * `queued`, a replay hangs) or `cancelled`; a stall never ends it unless cancelled.
 */
function runBackground(
  ctx: SimContext,
  ex: Exchange,
  res: ServerResponse,
  answer: ResponsesAnswer,
  shape: AnswerShape,
  fault: Fault | null,
  modifiers: Modifiers,
): void {
  const { store } = ctx;
  const entry = new StoredResponse(answer, 'queued', answer.request.stream ? [] : null);
  ctx.responses.put(entry);
  const outputChars = choiceText(0, 0, answer.tokens).length;
  ex.detached = true;
  store.addPromptTokens(answer.promptTokens);
  ctx.setPhase(ex, 'waiting');
  const run = startBackground(
    {
      tokens: shape.tokensPerChoice,
      tokensPerEvent: shape.tokensPerEvent,
      ttftMs: shape.ttftMs,
      itlMs: shape.itlMs,
      jitter: shape.jitter,
      random: ctx.randomOf(ex),
      fault,
      writer: createResponsesWriter(answer, (final, status) => entry.finish(final, status, outputChars)),
    },
    {
      onEvents: (events) => entry.push(events),
      onFirstToken: () => ctx.setPhase(ex, 'running'),
      onOutput: (tokens) => ctx.countOutput(ex, tokens),
      onEnd: (end) => {
        entry.task = null;
        ctx.backgroundRuns.delete(run);
        if (end === 'completed') store.countSuccess([shape.finishReason]);
        ctx.settle(ex, end === 'completed' && fault === null ? 'completed' : 'fault', 200, false);
      },
    },
  );
  ctx.backgroundRuns.add(run);
  entry.task = {
    cancel: () => {
      run.abort();
      ctx.backgroundRuns.delete(run);
      ctx.settle(ex, 'cancelled', 200, false);
    },
  };
  store.countStatus(200);
  if (answer.request.stream) startReplay(res, entry, 0, modifiers, { onEnd: () => undefined });
  else sendBody(res, 200, entry.body());
  ctx.emitStart(ex);
}
