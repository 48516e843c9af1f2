/**
 * /v1/messages (Anthropic's Messages API as vLLM serves it) and /v1/messages/count_tokens, which never reaches the
 * engine.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Exchange, SimContext } from '../context.js';
import type { FaultKind } from '../faults.js';
import { createMessagesWriter, messagesBody, messagesFailure, messagesStatusBody, readMessagesRequest } from '../messages.js';
import { sendBody } from '../respond.js';
import { engineErrorInfo } from '../stream-engine.js';
import { answerEventRoute, shapeAsChat } from './event-route.js';
import { answerFaultAtOnce, chooseFault, readJson } from './read.js';

/** count_tokens never reaches the engine: only the faults that answer before it. */
const COUNT_TOKENS_FAULTS = (kind: FaultKind): boolean => kind === 'status' || kind === 'reset_before_response';

export async function serveMessages(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, _route: 'messages', path: string): Promise<void> {
  const read = await readJson(ctx, ex, req, res, path, 'Bad Request');
  if (read === null) return;
  const result = readMessagesRequest(read.body, ctx.opts.models, ex.record, ctx.engineDead);
  if (!result.ok) {
    ctx.refuse(ex, res, result.refusal);
    return;
  }
  const request = result.request;
  ex.record.promptTokens = request.promptTokens;
  const fault = chooseFault(ctx, ex, read, request.stream, true);
  if (answerFaultAtOnce(ctx, ex, req, res, fault, request.model, messagesStatusBody)) return;

  const { modifiers } = read.directives;
  const shape = shapeAsChat(ex, request, modifiers, ctx.opts, Math.floor(Date.now() / 1000));
  const answer = {
    tokens: shape.tokensPerChoice,
    finishReason: shape.finishReason,
    promptTokens: request.promptTokens,
    usage: !modifiers.noUsage,
    id: shape.identity.id,
    model: request.model,
  };
  answerEventRoute(ctx, ex, res, { request, shape, fault, modifiers }, {
    writer: () => createMessagesWriter(answer),
    body: () => messagesBody(answer),
    failure: (code, beforeOutput) => messagesFailure(engineErrorInfo(code, beforeOutput)),
  });
}

/**
 * vLLM's `count_tokens`: /v1/messages' checks and token estimate (its request, without `max_tokens` and `stream`,
 * which count_tokens does not take), answered at once — the renderer runs, the engine does not.
 */
export async function serveCountTokens(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, _route: 'count_tokens', path: string): Promise<void> {
  const read = await readJson(ctx, ex, req, res, path, 'Bad Request');
  if (read === null) return;
  const body = typeof read.body === 'object' && read.body !== null && !Array.isArray(read.body) ? { ...read.body, max_tokens: 1, stream: false } : read.body;
  const result = readMessagesRequest(body, ctx.opts.models, ex.record, ctx.engineDead);
  if (!result.ok) {
    ctx.refuse(ex, res, result.refusal);
    return;
  }
  const tokens = result.request.promptTokens;
  ex.record.promptTokens = tokens;
  const fault = chooseFault(ctx, ex, read, false, false, COUNT_TOKENS_FAULTS);
  if (answerFaultAtOnce(ctx, ex, req, res, fault, result.request.model, messagesStatusBody)) return;
  sendBody(res, 200, `{"input_tokens":${tokens},"context_management":{"original_input_tokens":${tokens}}}`);
  ctx.settle(ex, 'completed', 200);
}
