/**
 * What /v1/responses and /v1/messages share once their request is read: the answer's shape (they run as a chat
 * completion: its timing, token count and finish reason), and the answer itself — the route's named events through the
 * stream engine (event-stream.ts), or its whole body after the stream's time (nonstream.ts).
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

export interface EventAnswer {
  readonly stream: boolean;
  readonly promptTokens: number;
  readonly shape: AnswerShape;
  readonly fault: Fault | null;
  readonly modifiers: Modifiers;
  /** The stream's events. */
  writer(): EventWriter;
  /** The whole-body answer. */
  body(): string;
  readonly failure?: NonStreamPlan['failure'];
}

export function answerEventRoute(ctx: SimContext, ex: Exchange, res: ServerResponse, answer: EventAnswer): void {
  const { shape, fault } = answer;
  const random = ctx.randomOf(ex);
  const finishReasons = (): string[] => [shape.finishReason];
  ctx.store.addPromptTokens(answer.promptTokens);
  ctx.setPhase(ex, 'waiting');
  if (answer.stream) {
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
        framing: answer.modifiers,
        writer: answer.writer(),
      },
      ctx.streamHooks(ex, finishReasons),
    );
  } else {
    ex.control = startNonStream(
      res,
      {
        outputEvents: Math.ceil(shape.tokensPerChoice / shape.tokensPerEvent),
        completionTokens: shape.tokensPerChoice,
        ttftMs: shape.ttftMs,
        itlMs: shape.itlMs,
        jitter: shape.jitter,
        random,
        fault,
        send: () => sendBody(res, 200, answer.body()),
        failure: answer.failure,
      },
      ctx.nonStreamHooks(ex, finishReasons),
    );
  }
  ctx.emitStart(ex);
}
