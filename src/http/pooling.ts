/**
 * The gateway's own checks on a request to one of vLLM's non-generation routes (embeddings, pooling, classify,
 * score, rerank, tokenize, detokenize): only what it needs to route and account — a JSON object, and the model.
 * Everything else is the upstream's to validate (docs/routes.md).
 */
import type { PoolingRoute } from '../accounting/outcomes.js';
import { errorBody } from '../delivery/errors.js';
import { isRecord } from '../util/json.js';
import type { Checked } from './completions.js';

/** The fields whose text makes up each route's input, for the prompt-length estimate before dispatch. */
const INPUT_FIELDS: Readonly<Record<PoolingRoute, readonly string[]>> = {
  embeddings: ['input'],
  pooling: ['input'],
  classify: ['input'],
  score: ['queries', 'documents', 'items', 'data_1', 'data_2', 'text_1', 'text_2'],
  rerank: ['query', 'documents'],
  tokenize: ['prompt'],
  detokenize: [],
};

/**
 * `model` may be left out, as vLLM allows on these routes: the request then goes to the one model served, and is
 * refused when there are several (the gateway cannot tell which pool to ask).
 */
export function checkPooling(route: PoolingRoute, json: unknown, servedModels: readonly string[], charsPerToken = 4): Checked {
  if (!isRecord(json)) return { ok: false, status: 400, body: errorBody('invalid_request', 'the request body must be a JSON object', null), stream: false };
  const named = json['model'];
  let model: string;
  if (typeof named === 'string' && named.length > 0) model = named;
  else if (named === undefined || named === null) {
    const only = servedModels.length === 1 ? servedModels[0] : undefined;
    if (only === undefined) {
      return { ok: false, status: 400, body: errorBody('invalid_request', 'you must provide a model parameter (several models are served)', 'model'), stream: false };
    }
    model = only;
  } else {
    return { ok: false, status: 400, body: errorBody('invalid_request', '`model` must be a string', 'model'), stream: false };
  }
  return {
    ok: true,
    fields: { model, stream: false, expectedChoices: 0, clientAskedUsage: false, promptTokensEstimate: estimateInputTokens(route, json, charsPerToken) },
  };
}

/**
 * The input's length in tokens, estimated like a prompt's: token ids counted, text at `charsPerToken`, over the
 * route's input fields (nested lists of either included). Undefined when there is nothing to count.
 */
export function estimateInputTokens(route: PoolingRoute, json: Record<string, unknown>, charsPerToken: number): number | undefined {
  let tokens = 0;
  let chars = 0;
  let found = false;
  const visit = (value: unknown, depth: number): void => {
    if (typeof value === 'string') {
      chars += value.length;
      found = true;
    } else if (typeof value === 'number') {
      tokens += 1;
      found = true;
    } else if (Array.isArray(value) && depth < 3) {
      for (const item of value) visit(item, depth + 1);
    } else if (isRecord(value) && depth < 3 && typeof value['text'] === 'string') {
      visit(value['text'], depth + 1);
    }
  };
  for (const field of INPUT_FIELDS[route]) visit(json[field], 0);
  return found ? tokens + Math.ceil(chars / charsPerToken) : undefined;
}
