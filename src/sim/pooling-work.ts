/** What a pooling request costs — usage and the engine's counters — and the score pairs its answer is made of. */
import type { PoolingRequest, Prompt, ScorePair } from './pooling-request.js';

/** What one request costs, for usage and the engine's counters. */
export interface PoolingWork {
  /** usage.prompt_tokens; null for tokenize and detokenize, which carry no usage. */
  readonly promptTokens: number | null;
  /** Tokens the engine computes: each text once (a score query is encoded once, however many documents). */
  readonly engineTokens: number;
  /** Engine requests: one per text (a score is one per query and one per document). */
  readonly engineRequests: number;
}

const sum = (prompts: readonly Prompt[]): number => prompts.reduce((total, p) => total + p.tokens, 0);

/**
 * The bi-encoder's usage counts each pair as query + padding token + document (`BiEncoderIOProcessor._post_process`),
 * so a 1:N query is counted N times.
 */
export function scorePairs(queries: readonly Prompt[], documents: readonly Prompt[]): ScorePair[] {
  return documents.map((document, i) => ({ query: (queries.length === 1 ? queries[0] : queries[i]) ?? document, document }));
}

export function poolingWork(request: PoolingRequest): PoolingWork {
  switch (request.route) {
    case 'embeddings':
    case 'pooling':
    case 'classify': {
      const tokens = sum(request.prompts);
      return { promptTokens: tokens, engineTokens: tokens, engineRequests: request.prompts.length };
    }
    case 'score':
    case 'rerank': {
      const queries = request.route === 'score' ? request.queries : [request.query];
      const pairs = scorePairs(queries, request.documents);
      return {
        promptTokens: pairs.reduce((total, p) => total + p.query.tokens + 1 + p.document.tokens, 0),
        engineTokens: sum(queries) + sum(request.documents),
        engineRequests: queries.length + request.documents.length,
      };
    }
    case 'tokenize':
    case 'detokenize':
      return { promptTokens: null, engineTokens: 0, engineRequests: 0 };
  }
}
