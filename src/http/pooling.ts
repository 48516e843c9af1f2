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
 * `model` may be left out, as vLLM allows on these routes: the request then goes to `fallback` (or the one model
 * served), and is refused when there are several (the gateway cannot tell which pool to ask).
 */
function modelOf(named: unknown, servedModels: readonly string[], fallback: string | undefined): { model: string } | { problem: string } {
  if (typeof named === 'string' && named.length > 0) return { model: named };
  if (named !== undefined && named !== null && named !== '') return { problem: '`model` must be a string' };
  const only = fallback ?? (servedModels.length === 1 ? servedModels[0] : undefined);
  return only === undefined ? { problem: 'you must provide a model parameter (several models are served)' } : { model: only };
}

function refused(message: string, param: string | null, stream = false): Checked {
  return { ok: false, status: 400, body: errorBody('invalid_request', message, param), stream };
}

export function checkPooling(route: PoolingRoute, json: unknown, servedModels: readonly string[], charsPerToken = 4): Checked {
  if (!isRecord(json)) return refused('the request body must be a JSON object', null);
  const named = modelOf(json['model'], servedModels, undefined);
  if ('problem' in named) return refused(named.problem, 'model');
  return {
    ok: true,
    fields: { model: named.model, stream: false, expectedChoices: 0, clientAskedUsage: false, promptTokensEstimate: estimateInputTokens(route, json, charsPerToken) },
  };
}

/**
 * A body the gateway only routes (count_tokens, pass-through): any JSON value, by its `model` when it names one
 * served, else `fallback`'s (or the one served model's) pool.
 */
export function checkOpaque(json: unknown, servedModels: readonly string[], fallback: string | undefined): Checked {
  const named = isRecord(json) && typeof json['model'] === 'string' && servedModels.includes(json['model']) ? json['model'] : undefined;
  const routed = modelOf(named, servedModels, fallback ?? servedModels[0]);
  if ('problem' in routed) return refused(routed.problem, 'model');
  return { ok: true, fields: { model: routed.model, stream: false, expectedChoices: 0, clientAskedUsage: false, promptTokensEstimate: undefined } };
}

/** How pydantic reads a form field as a boolean (vLLM's `stream`). */
const TRUE = new Set(['1', 'true', 't', 'yes', 'y', 'on']);
const FALSE = new Set(['0', 'false', 'f', 'no', 'n', 'off']);

/**
 * The speech-to-text routes' form: routed by `model` (optional when one model is served), streamed when `stream` is
 * true; one choice. The audio itself is the upstream's to judge.
 */
export function checkAudio(fields: Readonly<Record<string, string>>, servedModels: readonly string[]): Checked {
  const flag = fields['stream']?.trim().toLowerCase();
  if (flag !== undefined && !TRUE.has(flag) && !FALSE.has(flag)) return refused('`stream` must be a boolean', 'stream');
  const stream = flag !== undefined && TRUE.has(flag);
  const named = modelOf(fields['model'], servedModels, undefined);
  if ('problem' in named) return refused(named.problem, 'model', stream);
  return { ok: true, fields: { model: named.model, stream, expectedChoices: 1, clientAskedUsage: true, promptTokensEstimate: undefined } };
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
