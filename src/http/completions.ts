/**
 * The gateway's own checks on a completion request, before any upstream is asked: the fields it needs to route
 * and account (model, stream, n, prompt count). Everything else is the upstream's to validate.
 */
import type { Route } from '../accounting/outcomes.js';
import { isRecord } from '../sse/classify.js';
import { errorBody, type ErrorBody } from './errors.js';

export interface CompletionFields {
  readonly model: string;
  readonly stream: boolean;
  /** Choices the response must finish: n × the number of prompts (legacy completions accept a list). */
  readonly expectedChoices: number;
  readonly clientAskedUsage: boolean;
}

export type Checked = { ok: true; fields: CompletionFields } | { ok: false; status: number; body: ErrorBody; stream: boolean };

/** Number of prompts in a legacy completions `prompt`: a string or token list is one; a list of them is several. */
function promptCount(prompt: unknown): number {
  if (!Array.isArray(prompt) || prompt.length === 0) return 1;
  return prompt.every((p) => typeof p === 'number') ? 1 : prompt.length;
}

export function checkCompletion(route: Route, json: unknown): Checked {
  const invalid = (message: string, param: string | null, stream = false): Checked => ({
    ok: false,
    status: 400,
    body: errorBody('invalid_request', message, param),
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
  return {
    ok: true,
    fields: {
      model,
      stream: streaming,
      expectedChoices: n * (route === 'completions' ? promptCount(json['prompt']) : 1),
      clientAskedUsage: isRecord(options) && options['include_usage'] === true,
    },
  };
}

const OPEN_BRACE = 0x7b;
const USAGE_MEMBER = Buffer.from('"stream_options":{"include_usage":true},');

/**
 * The body to send upstream with `stream_options.include_usage` turned on. When the client sent no
 * `stream_options`, the member is spliced in after the opening brace and every other byte stays the client's
 * (a JSON.parse/stringify round trip would change numbers past 2^53, such as a large `seed`). Otherwise the
 * object is merged and re-serialised.
 */
export function withUsageRequested(raw: Buffer, json: Record<string, unknown>): Buffer {
  if (!('stream_options' in json)) {
    const brace = raw.indexOf(OPEN_BRACE);
    // A body that checkCompletion accepted is an object with at least `model`, so a comma after the member is valid.
    return Buffer.concat([raw.subarray(0, brace + 1), USAGE_MEMBER, raw.subarray(brace + 1)]);
  }
  const options = isRecord(json['stream_options']) ? json['stream_options'] : {};
  return Buffer.from(JSON.stringify({ ...json, stream_options: { ...options, include_usage: true } }));
}
