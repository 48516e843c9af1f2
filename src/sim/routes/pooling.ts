/**
 * The pooling routes — embeddings, pooling, classify, score, rerank — and tokenize / detokenize, which never reach the
 * engine: the checks, the fault, then after the engine's time one answer (src/sim/pooling-answer.ts).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Exchange, SimContext } from '../context.js';
import type { Directives, Fault } from '../faults.js';
import { startNonStream, type NonStreamHooks } from '../nonstream.js';
import { prefillDelayMs } from '../plan.js';
import { poolingResponseId, renderPoolingAnswer, type PoolingAnswer } from '../pooling-answer.js';
import { readPoolingRequest, usesEngine, type PoolingRequest, type PoolingRoute } from '../pooling-request.js';
import { poolingWork, type PoolingWork } from '../pooling-work.js';
import { sendBody } from '../respond.js';
import { ENGINE_DEAD_BODY } from './generation.js';
import { answerFaultAtOnce, chooseFault, readJson } from './read.js';

export async function servePooling(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, route: PoolingRoute, path: string): Promise<void> {
  const read = await readJson(ctx, ex, req, res, path, 'Bad Request');
  if (read === null) return;
  const result = readPoolingRequest(route, read.body, ctx.opts.models, ex.record);
  if (!result.ok) {
    ctx.refuse(ex, res, result.refusal);
    return;
  }
  const engine = usesEngine(route);
  if (engine && ctx.engineDead) {
    ctx.reject(ex, res, 500, ENGINE_DEAD_BODY);
    return;
  }

  const request = result.request;
  const work = poolingWork(request);
  ex.record.promptTokens = work.promptTokens;
  // Tokenize and detokenize never reach the engine: no random engine faults for them, only the header's.
  const fault = chooseFault(ctx, ex, read, false, engine);
  if (answerFaultAtOnce(ctx, ex, req, res, fault, request.model)) return;
  answerPooling(ctx, ex, res, request, work, fault, read.directives);
}

/**
 * After the engine's time (pooling routes: the base TTFT plus the prefill of every text it encodes; tokenize and
 * detokenize: none, unless `ttft_ms` asks for it), the answer, or the fault's error, reset or stall.
 */
function answerPooling(ctx: SimContext, ex: Exchange, res: ServerResponse, request: PoolingRequest, work: PoolingWork, fault: Fault | null, directives: Directives): void {
  const { store, opts } = ctx;
  const { modifiers } = directives;
  const engine = usesEngine(request.route);
  const identity = {
    id: poolingResponseId(request.route, ex.record.requestId) ?? '',
    created: Math.floor(Date.now() / 1000),
    model: request.model,
  };
  const prefillMs = engine
    ? prefillDelayMs({ promptTokens: work.engineTokens, completionTokens: 0, cachedTokens: null }, modifiers.prefillMsPer1kTokens ?? opts.prefillMsPer1kTokens)
    : 0;
  const ttftMs = (modifiers.ttftMs ?? (engine ? opts.ttftMs : 0)) + prefillMs;
  const context = { seed: opts.seed, dimensions: opts.embeddingDimensions, tokenizer: ctx.tokenizer };
  const plan = {
    outputEvents: 0,
    completionTokens: 0,
    ttftMs,
    itlMs: modifiers.itlMs ?? opts.itlMs,
    jitter: opts.jitter,
    random: ctx.randomOf(ex),
    fault,
    send: (): void => sendPoolingAnswer(res, renderPoolingAnswer(request, work, identity, context)),
  };
  const hooks: NonStreamHooks = {
    onFirstToken: () => {
      if (engine) ctx.setPhase(ex, 'running');
    },
    onEnd: ({ end, status, generationComplete }) => {
      if (engine && generationComplete) store.countSuccess(new Array<string>(work.engineRequests).fill('stop'));
      ctx.settle(ex, end, status);
    },
  };
  if (engine) {
    store.addPromptTokens(work.promptTokens ?? 0, work.engineTokens);
    ctx.setPhase(ex, 'waiting');
  }
  ex.control = startNonStream(res, plan, hooks);
  ctx.emitStart(ex);
}

/** JSON as Starlette's JSONResponse (content-length); raw bytes as its StreamingResponse (chunked, one write per item). */
function sendPoolingAnswer(res: ServerResponse, answer: PoolingAnswer): void {
  if (answer.kind === 'json') {
    sendBody(res, 200, answer.body);
    return;
  }
  res.writeHead(200, { 'content-type': 'application/octet-stream', ...(answer.metadata === null ? {} : { metadata: answer.metadata }) });
  for (const chunk of answer.chunks) res.write(chunk);
  res.end();
}
