/**
 * /v1/chat/completions and /v1/completions: the checks, the fault, then the answer — a chunk stream (stream.ts) or
 * one body after the stream's time (nonstream.ts) — timed by the engine model when it runs, else by the timer.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Exchange, SimContext } from '../context.js';
import type { Directives, Fault, Modifiers } from '../faults.js';
import { startNonStream } from '../nonstream.js';
import { shapeAnswer, type AnswerShape } from '../plan.js';
import { readGenerationRequest, type GenerationRequest } from '../request.js';
import { sendBody } from '../respond.js';
import { engineFinishReason } from '../stats.js';
import { startStream } from '../stream.js';
import { peakBlocks } from '../engine/core.js';
import type { EngineJob, SequenceInput } from '../engine/runtime.js';
import { choiceText, completionBody, createChunkSerializer, errorBody, errorInfo, ENGINE_DEAD_MESSAGE, type GenerationRoute, type Usage } from '../wire.js';
import { answerFaultAtOnce, chooseFault, readJson, withLengthRate } from './read.js';

export const ENGINE_DEAD_BODY = errorBody(errorInfo(500, ENGINE_DEAD_MESSAGE));

export async function serveGeneration(
  ctx: SimContext,
  ex: Exchange,
  req: IncomingMessage,
  res: ServerResponse,
  route: GenerationRoute,
  path: string,
): Promise<void> {
  const read = await readJson(ctx, ex, req, res, path, 'BadRequestError');
  if (read === null) return;
  const result = readGenerationRequest(route, read.body, ctx.opts.models, ex.record);
  if (!result.ok) {
    ctx.reject(ex, res, result.status, result.body);
    return;
  }
  if (ctx.engineDead) {
    ctx.reject(ex, res, 500, ENGINE_DEAD_BODY);
    return;
  }

  const request = result.request;
  ex.record.promptTokens = request.promptTokens;
  const fault = chooseFault(ctx, ex, read, request.stream);
  if (answerFaultAtOnce(ctx, ex, req, res, fault, request.model)) return;
  generate(ctx, ex, res, request, fault, withLengthRate(ctx, read, fault));
}

function generate(ctx: SimContext, ex: Exchange, res: ServerResponse, request: GenerationRequest, fault: Fault | null, directives: Directives): void {
  const { store, opts } = ctx;
  const shape = shapeAnswer(request, directives.modifiers, opts, ex.record.requestId, Math.floor(Date.now() / 1000));
  const job = submitToEngine(ctx, request, shape, directives.modifiers);
  if (job === 'too_long') {
    ctx.reject(ex, res, 400, errorBody(errorInfo(400, `The prompt needs more KV cache blocks than this engine has (--kv-blocks ${opts.kvBlocks} of ${opts.blockSize} tokens).`, 'input_tokens')));
    return;
  }
  const usage = job === null ? shape.usage : engineUsage(ctx, shape, job, directives.modifiers);
  const common = {
    choiceCount: shape.choiceCount,
    tokensPerChoice: shape.tokensPerChoice,
    tokensPerEvent: shape.tokensPerEvent,
    finishReason: shape.finishReason,
    usage: shape.sendsUsage ? usage : null,
    ttftMs: shape.ttftMs,
    itlMs: shape.itlMs,
    jitter: shape.jitter,
    random: ctx.randomOf(ex),
    fault,
    pacer: job === null || ctx.engine === null ? undefined : ctx.engine.pacer(job, shape.tokensPerEvent),
  };
  if (job !== null) {
    ex.job = job;
    ex.res = res;
    ctx.engineExchanges.add(ex);
  }
  const finishReasons = (): string[] => new Array<string>(shape.choiceCount).fill(shape.finishReason);

  store.addPromptTokens(request.promptTokens);
  ctx.setPhase(ex, 'waiting');
  if (request.stream) {
    const plan = { ...common, serializer: createChunkSerializer(request.route, shape.identity), framing: directives.modifiers };
    ex.control = startStream(res, plan, ctx.streamHooks(ex, finishReasons));
    ctx.emitStart(ex);
    return;
  }
  const plan = {
    outputEvents: shape.choiceCount * Math.ceil(shape.tokensPerChoice / shape.tokensPerEvent),
    completionTokens: shape.choiceCount * shape.tokensPerChoice,
    ttftMs: common.ttftMs,
    itlMs: common.itlMs,
    jitter: common.jitter,
    random: common.random,
    fault,
    pacer: common.pacer,
    send: (): void => {
      const choices = Array.from({ length: shape.choiceCount }, (_, index) => ({
        text: choiceText(index, 0, shape.tokensPerChoice),
        finishReason: shape.finishReason,
      }));
      sendBody(res, 200, completionBody(request.route, shape.identity, choices, common.usage));
    },
  };
  ex.control = startNonStream(res, plan, ctx.nonStreamHooks(ex, finishReasons));
  ctx.emitStart(ex);
}

/**
 * The request's sequences in the engine model: one per choice of each prompt, in the order of the answer's choice
 * indices (choice + prompt × n). Null when there is no engine, nothing to tokenize (routes whose prompt the model does
 * not render), or the x-sim-fault header sets a timing, which then holds for that request alone.
 */
function submitToEngine(ctx: SimContext, request: GenerationRequest, shape: AnswerShape, modifiers: Modifiers): EngineJob | null | 'too_long' {
  const { engine, opts } = ctx;
  if (engine === null || request.promptInputs.length === 0) return null;
  if (modifiers.ttftMs !== undefined || modifiers.itlMs !== undefined || modifiers.prefillMsPer1kTokens !== undefined) return null;
  const inputs: SequenceInput[] = [];
  const finishedReason = engineFinishReason(shape.finishReason);
  for (const prompt of request.promptInputs) {
    const promptTokenIds = typeof prompt === 'string' ? ctx.tokenizer.encode(prompt) : prompt;
    // What the core will hold at the sequence's longest (prompt and answer): every prompt is checked before any is added.
    if (peakBlocks(promptTokenIds.length, Math.max(1, shape.tokensPerChoice), opts.blockSize) > opts.kvBlocks) return 'too_long';
    for (let choice = 0; choice < request.n; choice++) {
      inputs.push({
        promptTokenIds,
        outputTokens: shape.tokensPerChoice,
        finishedReason,
        // One prompt's hit counts once: its other choices hit the blocks the first just allocated (vLLM reports the
        // request's num_cached_tokens, not a sum over its child requests).
        countsCached: choice === 0,
        ...(request.cacheSalt !== null ? { cacheSalt: request.cacheSalt } : {}),
      });
    }
  }
  return engine.submit(inputs);
}

/**
 * Usage whose cached_tokens is the engine's prefix-cache hit, read when the usage goes out (the hit is known once the
 * engine first schedules the request). Reported as vLLM does: with --enable-prompt-tokens-details, and only when not
 * 0; an x-sim-fault `cached_tokens` still wins.
 */
function engineUsage(ctx: SimContext, shape: AnswerShape, job: EngineJob, modifiers: Modifiers): Usage {
  const { promptTokens, completionTokens } = shape.usage;
  const details = ctx.opts.promptTokensDetails;
  const forced = modifiers.cachedTokens;
  return {
    promptTokens,
    completionTokens,
    get cachedTokens(): number | null {
      if (forced !== undefined) return forced > 0 ? Math.min(forced, promptTokens) : null;
      const hit = job.cachedTokens ?? 0;
      return details && hit > 0 ? Math.min(hit, promptTokens) : null;
    },
  };
}
