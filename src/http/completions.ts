/**
 * The gateway's own checks on a completion request, before any upstream is asked: the fields it needs to route
 * and account (model, stream, n, prompt count). Everything else is the upstream's to validate.
 */
import type { GenerationRoute } from '../accounting/outcomes.js';
import { isRecord } from '../util/json.js';
import { errorBody, type ErrorBody, type ErrorCode } from '../delivery/errors.js';
import { memberValueSpan } from './json-bytes.js';

export interface CompletionFields {
  readonly model: string;
  readonly stream: boolean;
  /** Choices the response must finish: n × the number of prompts (legacy completions accept a list). */
  readonly expectedChoices: number;
  readonly clientAskedUsage: boolean;
  /** The prompt's tokens as estimated from the request (see estimatePromptTokens); undefined when it has no prompt text. */
  readonly promptTokensEstimate: number | undefined;
}

export type Checked = { ok: true; fields: CompletionFields } | { ok: false; status: number; body: ErrorBody; stream: boolean };

/** Number of prompts in a legacy completions `prompt`: a string or token list is one; a list of them is several. */
function promptCount(prompt: unknown): number {
  if (!Array.isArray(prompt) || prompt.length === 0) return 1;
  return prompt.every((p) => typeof p === 'number') ? 1 : prompt.length;
}

export function checkCompletion(route: GenerationRoute, json: unknown, maxChoices: number, charsPerToken = 4): Checked {
  const invalid = (message: string, param: string | null, stream = false, code: ErrorCode = 'invalid_request'): Checked => ({
    ok: false,
    status: 400,
    body: errorBody(code, message, param),
    stream,
  });
  if (!isRecord(json)) return invalid('the request body must be a JSON object', null);
  const stream = json['stream'];
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') return invalid('`stream` must be a boolean', 'stream');
  const streaming = stream === true;
  const model = json['model'];
  if (typeof model !== 'string' || model.length === 0) return invalid('you must provide a model parameter', 'model', streaming);
  const n = json['n'] ?? 1;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 128) {
    return invalid('`n` must be an integer between 1 and 128', 'n', streaming);
  }
  if (route === 'chat_completions' && !Array.isArray(json['messages'])) {
    return invalid('`messages` must be a list of messages', 'messages', streaming);
  }
  if (route === 'completions' && json['prompt'] === undefined) return invalid('`prompt` is required', 'prompt', streaming);
  const options = json['stream_options'];
  // Every choice is tracked until it finishes: the product is what the ledger and the metrics will hold.
  const expectedChoices = n * (route === 'completions' ? promptCount(json['prompt']) : 1);
  if (expectedChoices > maxChoices) {
    return invalid(`n × prompts is ${expectedChoices}; at most ${maxChoices} choices per request (server.max_choices)`, 'n', streaming, 'too_many_choices');
  }
  return {
    ok: true,
    fields: {
      model,
      stream: streaming,
      expectedChoices,
      clientAskedUsage: isRecord(options) && options['include_usage'] === true,
      promptTokensEstimate: estimatePromptTokens(route, json, charsPerToken),
    },
  };
}

/**
 * The prompt's length in tokens, estimated before dispatch: token ids are counted exactly, text at `charsPerToken`
 * characters per token (chat: every message's text content; the chat template's few tokens per message are not
 * counted). Legacy completions with several prompts: their sum, as vLLM's usage reports it. Undefined when the
 * request carries no prompt the gateway can read.
 */
export function estimatePromptTokens(route: GenerationRoute, json: Record<string, unknown>, charsPerToken: number): number | undefined {
  let tokens = 0;
  let chars = 0;
  let found = false;
  const text = (value: unknown) => {
    if (typeof value === 'string') {
      chars += value.length;
      found = true;
    }
  };
  if (route === 'completions') {
    const prompt = json['prompt'];
    const one = (p: unknown) => {
      if (Array.isArray(p) && p.every((t) => typeof t === 'number')) {
        tokens += p.length;
        found = true;
      } else text(p);
    };
    if (Array.isArray(prompt) && prompt.length > 0 && !prompt.every((t) => typeof t === 'number')) prompt.forEach(one);
    else one(prompt);
  } else {
    const messages = json['messages'];
    if (Array.isArray(messages)) {
      for (const message of messages) {
        if (!isRecord(message)) continue;
        const content = message['content'];
        if (Array.isArray(content)) for (const part of content) text(isRecord(part) ? part['text'] : undefined);
        else text(content);
      }
    }
  }
  return found ? tokens + Math.ceil(chars / charsPerToken) : undefined;
}

const OPEN_BRACE = 0x7b;
const USAGE_MEMBER = Buffer.from('"stream_options":{"include_usage":true},');

/**
 * The body to send upstream with `stream_options.include_usage` turned on, or undefined when the client's
 * `stream_options` is something other than an object or null (the upstream will reject it; Waybill does not
 * repair requests). Every byte outside `stream_options` stays the client's: a JSON.parse/stringify round trip
 * would change numbers past 2^53 (a large `seed`) and re-serialise whatever the client nested.
 */
export function withUsageRequested(raw: Buffer, json: Record<string, unknown>): Buffer | undefined {
  if (!('stream_options' in json)) {
    const brace = raw.indexOf(OPEN_BRACE);
    // A body that checkCompletion accepted is an object with at least `model`, so a comma after the member is valid.
    return Buffer.concat([raw.subarray(0, brace + 1), USAGE_MEMBER, raw.subarray(brace + 1)]);
  }
  const options = json['stream_options'];
  if (options !== null && !isRecord(options)) return undefined;
  const span = memberValueSpan(raw, 'stream_options');
  if (span === undefined) return undefined;
  // stream_options holds a few flags: re-serialising that one small object is exact.
  const value = Buffer.from(JSON.stringify({ ...options, include_usage: true }));
  return Buffer.concat([raw.subarray(0, span.start), value, raw.subarray(span.end)]);
}
