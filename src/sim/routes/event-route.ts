/**
 * What the one-choice routes — /v1/responses, /v1/messages, and audio — share once their request is read: the answer's
 * shape (they run as a chat completion: its timing, token count and finish reason), and the answer itself — the
 * route's named events through the stream engine (event-stream.ts), or its whole body after the stream's time
 * (nonstream.ts).
 */
import type { ServerResponse } from 'node:http';
import type { Exchange, SimContext } from '../context.js';
import { startEventStream, type EventWriter } from '../event-stream.js';
import type { Fault, Modifiers } from '../faults.js';
import { startNonStream, type NonStreamPlan } from '../nonstream.js';
import type { SimOptions } from '../options.js';
import { shapeAnswer, type AnswerShape } from '../plan.js';
import type { GenerationRequest } from '../request.js';
import { sendBody } from '../respond.js';
import type { StreamControl } from '../stream-engine.js';
import type { Random } from '../../util/prng.js';

/** The fields of a non-chat request that decide its answer's shape as a chat completion would have it. */
export interface ChatLike {
  readonly model: string;
  readonly stream: boolean;
  readonly promptTokens: number;
  /** The output cap, or null. */
  readonly maxTokens: number | null;
  readonly includeUsage?: boolean | null;
}

/** The shape of `request`'s answer as a one-choice chat completion of one prompt (nothing for the engine to render). */
export function shapeAsChat(ex: Exchange, request: ChatLike, modifiers: Modifiers, opts: Readonly<SimOptions>, createdSeconds: number): AnswerShape {
  const chat: GenerationRequest = {
    route: 'chat_completions',
    model: request.model,
    stream: request.stream,
    n: 1,
    includeUsage: request.includeUsage ?? null,
    maxTokens: request.maxTokens,
    promptTokens: request.promptTokens,
    prompts: 1,
    promptInputs: [],
    cacheSalt: null,
  };
  return shapeAnswer(chat, modifiers, opts, ex.record.requestId, createdSeconds);
}

/** The answer of an event route: its named events, or its whole body. */
export interface EventAnswer {
  /** The stream's events. */
  writer(): EventWriter;
  /** The whole-body answer. */
  body(): string;
  readonly failure?: NonStreamPlan['failure'];
}

/** What the answer of a one-choice generation is made of, once its request is read and its fault chosen. */
export interface OneChoice {
  readonly request: { readonly stream: boolean; readonly promptTokens: number };
  readonly shape: AnswerShape;
  readonly fault: Fault | null;
  readonly modifiers: Modifiers;
}

export function answerEventRoute(ctx: SimContext, ex: Exchange, res: ServerResponse, { request, shape, fault, modifiers }: OneChoice, answer: EventAnswer): void {
  const random = ctx.randomOf(ex);
  ctx.store.addPromptTokens(request.promptTokens);
  ctx.setPhase(ex, 'waiting');
  if (request.stream) {
    ex.control = startEventStream(
      res,
      {
        tokens: shape.tokensPerChoice,
        tokensPerEvent: shape.tokensPerEvent,
        ttftMs: shape.ttftMs,
        itlMs: shape.itlMs,
        jitter: shape.jitter,
        random,
        fault,
        framing: modifiers,
        writer: answer.writer(),
      },
      ctx.streamHooks(ex, () => [shape.finishReason]),
    );
  } else {
    ex.control = answerWholeBody(ctx, ex, res, shape, fault, random, () => sendBody(res, 200, answer.body()), answer.failure);
  }
  ctx.emitStart(ex);
}

/** A one-choice generation's whole body (`send`), after the time its stream would have taken. */
export function answerWholeBody(
  ctx: SimContext,
  ex: Exchange,
  res: ServerResponse,
  shape: AnswerShape,
  fault: Fault | null,
  random: Random,
  send: () => void,
  failure?: NonStreamPlan['failure'],
): StreamControl {
  return startNonStream(
    res,
    {
      outputEvents: Math.ceil(shape.tokensPerChoice / shape.tokensPerEvent),
      completionTokens: shape.tokensPerChoice,
      ttftMs: shape.ttftMs,
      itlMs: shape.itlMs,
      jitter: shape.jitter,
      random,
      fault,
      send,
      failure,
    },
    ctx.nonStreamHooks(ex, () => [shape.finishReason]),
  );
}
