/**
 * The 200 answers of the non-generation routes, in vLLM@52a31cce's shapes: each body is a pydantic `model_dump()`
 * (every field, nulls included, in declaration order) written by Starlette's JSONResponse — compact, raw UTF-8,
 * floats as Python's repr — and the raw-bytes answers as its StreamingResponse (chunked, one chunk per item).
 */
import type { PoolingRequest, PoolingRoute, Prompt } from './pooling-request.js';
import { scorePairs, type PoolingWork } from './pooling-work.js';
import { MAX_MODEL_LEN } from './request.js';
import type { SimTokenizer } from './tokens.js';
import { argmax, classProbs, CLASS_LABELS, cosine, embedding, encodeValues, pythonFloat, pythonFloatArray } from './vectors.js';
import { pythonJsonDumps, type ResponseIdentity } from './wire.js';

/** `request_id_prefix` of each serving class (rerank is served by ServingScores, hence `score-`). */
const ID_PREFIX: Readonly<Record<Exclude<PoolingRoute, 'tokenize' | 'detokenize'>, string>> = {
  embeddings: 'embd',
  pooling: 'pooling',
  classify: 'classify',
  score: 'score',
  rerank: 'score',
};

/** `<prefix>-<X-Request-Id | 16 hex>`; tokenize and detokenize answers carry no id (null). */
export function poolingResponseId(route: PoolingRoute, requestId: string): string | null {
  return route === 'tokenize' || route === 'detokenize' ? null : `${ID_PREFIX[route]}-${requestId}`;
}

export type PoolingAnswer =
  | { readonly kind: 'json'; readonly body: string }
  /** `metadata`: the response header's JSON (`bytes`), or null (`bytes_only`: no header). */
  | { readonly kind: 'bytes'; readonly chunks: readonly Buffer[]; readonly metadata: string | null };

export interface AnswerContext {
  readonly seed: number;
  /** The embedding model's native dimension. */
  readonly dimensions: number;
  readonly tokenizer: SimTokenizer;
}

/** UsageInfo().model_dump(): prompt only, and `prompt_tokens_details` null rather than absent. */
function usageInfo(promptTokens: number): string {
  return `{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens},"completion_tokens":0,"prompt_tokens_details":null}`;
}

function head(identity: ResponseIdentity): string {
  return `"id":${JSON.stringify(identity.id)},"object":"list","created":${identity.created},"model":${JSON.stringify(identity.model)}`;
}

/** embeddings and pooling: float arrays, base64 strings, or raw bytes with their metadata header. */
function vectorsAnswer(
  object: 'embedding' | 'pooling',
  vectors: readonly number[][],
  request: Extract<PoolingRequest, { route: 'embeddings' | 'pooling' }>,
  identity: ResponseIdentity,
  promptTokens: number,
): PoolingAnswer {
  const { format, dtype, endianness } = request.encoding;
  if (format === 'bytes' || format === 'bytes_only') {
    const chunks = vectors.map((v) => encodeValues(v, dtype, endianness));
    let offset = 0;
    const data = chunks.map((chunk, index) => {
      const item = { index, embed_dtype: dtype, endianness, start: offset, end: offset + chunk.length, shape: [vectors[index]?.length ?? 0] };
      offset += chunk.length;
      return item;
    });
    // json.dumps with its default separators, as build_pooling_bytes_streaming_response writes the header.
    const metadata = format === 'bytes'
      ? pythonJsonDumps({ id: identity.id, created: identity.created, model: identity.model, data, usage: { prompt_tokens: promptTokens, total_tokens: promptTokens } })
      : null;
    return { kind: 'bytes', chunks, metadata };
  }
  const field = object === 'embedding' ? 'embedding' : 'data';
  const items = vectors.map((v, index) => {
    const value = format === 'base64' ? JSON.stringify(encodeValues(v, dtype, endianness).toString('base64')) : pythonFloatArray(v);
    return `{"index":${index},"object":"${object}","${field}":${value}}`;
  });
  return { kind: 'json', body: `{${head(identity)},"data":[${items.join(',')}],"usage":${usageInfo(promptTokens)}}` };
}

/** The answer to an accepted request; `identity.id` is unused by tokenize and detokenize. */
export function renderPoolingAnswer(request: PoolingRequest, work: PoolingWork, identity: ResponseIdentity, ctx: AnswerContext): PoolingAnswer {
  const promptTokens = work.promptTokens ?? 0;
  const embed = (p: Prompt, dimensions: number | null = null, normalize = true): number[] =>
    embedding(ctx.seed, p.key, ctx.dimensions, dimensions, normalize);
  switch (request.route) {
    case 'embeddings':
      return vectorsAnswer('embedding', request.prompts.map((p) => embed(p, request.dimensions, request.normalize)), request, identity, promptTokens);
    case 'pooling': {
      const vectors = request.prompts.map((p) => (request.task === 'classify' ? classProbs(ctx.seed, p.key) : embed(p, null, request.normalize)));
      return vectorsAnswer('pooling', vectors, request, identity, promptTokens);
    }
    case 'classify': {
      const items = request.prompts.map((p, index) => {
        const probs = classProbs(ctx.seed, p.key);
        const label = CLASS_LABELS[argmax(probs)] ?? null;
        return `{"index":${index},"label":${JSON.stringify(label)},"probs":${pythonFloatArray(probs)},"num_classes":${probs.length}}`;
      });
      return { kind: 'json', body: `{${head(identity)},"data":[${items.join(',')}],"usage":${usageInfo(promptTokens)}}` };
    }
    case 'score': {
      const items = scorePairs(request.queries, request.documents).map(
        (pair, index) => `{"index":${index},"object":"score","score":${pythonFloat(cosine(embed(pair.query), embed(pair.document)))}}`,
      );
      return { kind: 'json', body: `{${head(identity)},"data":[${items.join(',')}],"usage":${usageInfo(promptTokens)}}` };
    }
    case 'rerank': {
      const query = embed(request.query);
      const results = request.documents.map((document, index) => ({ index, score: cosine(query, embed(document)) }));
      // Python's sort is stable: equal scores keep document order. top_n ≤ 0 means all.
      results.sort((a, b) => b.score - a.score);
      const kept = request.topN > 0 ? results.slice(0, request.topN) : results;
      const items = kept.map(
        (r) =>
          `{"index":${r.index},"document":{"text":${JSON.stringify(request.texts[r.index] ?? '')},"multi_modal":null},"relevance_score":${pythonFloat(r.score)}}`,
      );
      return {
        kind: 'json',
        body: `{"id":${JSON.stringify(identity.id)},"model":${JSON.stringify(identity.model)},"usage":{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens}},"results":[${items.join(',')}]}`,
      };
    }
    case 'tokenize': {
      const ids = ctx.tokenizer.encode(request.text);
      const strs = request.returnTokenStrs ? JSON.stringify(ctx.tokenizer.tokenStrings(ids)) : 'null';
      return { kind: 'json', body: `{"count":${ids.length},"max_model_len":${MAX_MODEL_LEN},"tokens":[${ids.join(',')}],"token_strs":${strs}}` };
    }
    case 'detokenize':
      return { kind: 'json', body: JSON.stringify({ prompt: ctx.tokenizer.decode(request.ids) }) };
  }
}
