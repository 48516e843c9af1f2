/**
 * /v1/audio/transcriptions and /v1/audio/translations: the chat route's checks, timing, faults and stream engine over a
 * multipart form (src/sim/audio.ts) — method, auth, the fault header (`reset_before_response` before the body is
 * read), the form (the file part counted, not kept), then vLLM's refusals, then the answer: a `transcription.chunk` /
 * `translation.chunk` stream or one JSON body.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { audioBody, audioResponseId, createAudioSerializer, FORM_PARSE_ERROR_BODY, readAudioRequest, type AudioRoute } from '../audio.js';
import { readAudioForm } from '../audio-form.js';
import type { Exchange, SimContext } from '../context.js';
import { sendBody } from '../respond.js';
import { startStream } from '../stream.js';
import { answerWholeBody, shapeAsChat } from './event-route.js';
import { answerFaultAtOnce, checkPost, chooseFault, faultHeaderError } from './read.js';

export async function serveAudio(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, route: AudioRoute, path: string): Promise<void> {
  const checked = checkPost(ctx, ex, req, res, path);
  if (checked === null) return;
  const { parsed } = checked;
  const form = await readAudioForm(req);
  if (ex.settled || form.kind === 'gone') return; // the client left; the close handler recorded it
  if (!parsed.ok) {
    ctx.reject(ex, res, 400, faultHeaderError(parsed.message));
    return;
  }
  if (form.kind === 'malformed') {
    ctx.reject(ex, res, 400, FORM_PARSE_ERROR_BODY);
    return;
  }
  const result = readAudioRequest(route, form.values, ctx.opts.models, ex.record, ctx.engineDead);
  if (!result.ok) {
    ctx.refuse(ex, res, result.refusal);
    return;
  }
  const request = result.request;
  ex.record.promptTokens = request.promptTokens;
  const fault = chooseFault(ctx, ex, { hasHeader: checked.hasHeader, directives: parsed.directives }, request.stream);
  if (answerFaultAtOnce(ctx, ex, req, res, fault, request.model)) return;

  // Timing, token count and finish reason are the chat route's; audio usage never carries cached tokens.
  const { cachedTokens: _cached, ...modifiers } = parsed.directives.modifiers;
  const createdSeconds = Math.floor(Date.now() / 1000);
  const shape = shapeAsChat(ex, request, modifiers, { ...ctx.opts, promptTokensDetails: false }, createdSeconds);
  const identity = { id: audioResponseId(route, ex.record.requestId), created: createdSeconds, model: request.model };
  const random = ctx.randomOf(ex);
  const finishReasons = (): string[] => [shape.finishReason];
  ctx.store.addPromptTokens(request.promptTokens);
  ctx.setPhase(ex, 'waiting');
  if (request.stream) {
    let sent = 0;
    const continuous = shape.sendsUsage && request.continuousUsage
      ? () => ({ promptTokens: request.promptTokens, completionTokens: sent, cachedTokens: null })
      : null;
    const plan = {
      choiceCount: 1,
      tokensPerChoice: shape.tokensPerChoice,
      tokensPerEvent: shape.tokensPerEvent,
      finishReason: shape.finishReason,
      usage: shape.sendsUsage ? shape.usage : null,
      ttftMs: shape.ttftMs,
      itlMs: shape.itlMs,
      jitter: shape.jitter,
      random,
      fault,
      serializer: createAudioSerializer(route, identity, continuous),
      framing: modifiers,
    };
    ex.control = startStream(res, plan, ctx.streamHooks(ex, finishReasons, (tokens) => { sent += tokens; }));
  } else {
    ex.control = answerWholeBody(ctx, ex, res, shape, fault, random, () => sendBody(res, 200, audioBody(request, shape.tokensPerChoice, !modifiers.noUsage)));
  }
  ctx.emitStart(ex);
}
