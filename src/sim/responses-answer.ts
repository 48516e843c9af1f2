/**
 * The answer of `POST /v1/responses` (responses.ts reads the request): the response object (`ResponsesResponse`, every
 * key, nulls included, in declaration order) and the stream's events (`event: <type>` + compact JSON with gapless
 * `sequence_number`s). Sources: `vllm/entrypoints/openai/responses/{serving,protocol,streaming_events}.py`.
 */
import type { EventWriter, NamedEvent } from './event-stream.js';
import { MAX_MODEL_LEN } from './request.js';
import { json, randomId, type ResponsesRequest } from './responses.js';
import { choiceTextJsonInner } from './wire.js';


export interface ResponsesAnswer {
  readonly request: ResponsesRequest;
  /** `resp_<16 hex>`, or the body's `request_id`. */
  readonly id: string;
  readonly createdAt: number;
  readonly tokens: number;
  /** The engine's finish reason: `length` makes the response `incomplete`, anything else `completed`. */
  readonly finishReason: string;
  readonly promptTokens: number;
  readonly cachedTokens: number;
  /** `no_usage`: `"usage": null` where vLLM always sends it. */
  readonly usage: boolean;
}

/** ResponseStatus as vLLM sets it (`in_progress` only inside streamed events; `failed` never in the simulator). */
export type ResponseStatus = 'queued' | 'in_progress' | 'completed' | 'incomplete' | 'cancelled';

/** The final response, as the answer or `response.completed` carries it: the JSON and its status. */
export type FinalResponseHook = (body: string, status: 'completed' | 'incomplete') => void;

/** ResponseUsage on the simple path: the per-turn lists are empty, reasoning and tool-output tokens 0. */
function usageJson(promptTokens: number, cachedTokens: number, outputTokens: number): string {
  return (
    `{"input_tokens":${promptTokens},"input_tokens_details":{"cached_tokens":${cachedTokens},"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},` +
    `"output_tokens":${outputTokens},"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},` +
    `"total_tokens":${promptTokens + outputTokens}}`
  );
}

/** ResponseOutputText; `logprobs` is `[]` when a part is announced, null once it is done. */
function outputTextPart(textInner: string, logprobs: '[]' | 'null'): string {
  return `{"annotations":[],"text":"${textInner}","type":"output_text","logprobs":${logprobs}}`;
}

/** ResponsesResponse, every key in declaration order; `output` and `usage` are JSON. */
function responseObject(answer: ResponsesAnswer, status: ResponseStatus, output: string, usage: string): string {
  const { echo } = answer.request;
  const incomplete = status === 'incomplete' ? '{"reason":"max_output_tokens"}' : 'null';
  const maxOutputTokens = Math.min(answer.request.maxOutputTokens ?? Number.MAX_SAFE_INTEGER, MAX_MODEL_LEN - answer.promptTokens);
  return (
    `{"id":${json(answer.id)},"created_at":${answer.createdAt},"incomplete_details":${incomplete},"instructions":${echo.instructions},` +
    `"metadata":${echo.metadata},"model":${json(answer.request.model)},"object":"response","output":${output},` +
    `"parallel_tool_calls":${echo.parallelToolCalls},"temperature":${echo.temperature},"tool_choice":${echo.toolChoice},"tools":${echo.tools},` +
    `"top_p":${echo.topP},"background":${answer.request.background},"max_output_tokens":${maxOutputTokens},"max_tool_calls":${echo.maxToolCalls},` +
    `"previous_response_id":${json(answer.request.previousResponseId)},"prompt":null,"reasoning":${echo.reasoning},"service_tier":${echo.serviceTier},"status":"${status}",` +
    `"text":${echo.text},"top_logprobs":${echo.topLogprobs},"truncation":${echo.truncation},"usage":${usage},"user":${echo.user},` +
    `"presence_penalty":${echo.presencePenalty},"frequency_penalty":${echo.frequencyPenalty},"kv_transfer_params":null,` +
    `"input_messages":null,"output_messages":null}`
  );
}

function finalStatus(answer: ResponsesAnswer): 'completed' | 'incomplete' {
  return answer.finishReason === 'length' ? 'incomplete' : 'completed';
}

/** The final response: status, the output rebuilt (its own `msg_` id, as vLLM's _make_response_output_items), usage. */
function finalResponse(answer: ResponsesAnswer, textInner: string, outputTokens: number): string {
  const content = textInner === '' ? '[]' : `[${outputTextPart(textInner, 'null')}]`;
  const output = `[{"id":"msg_${randomId()}","content":${content},"role":"assistant","status":"completed","type":"message","phase":null}]`;
  const usage = answer.usage ? usageJson(answer.promptTokens, answer.cachedTokens, outputTokens) : 'null';
  return responseObject(answer, finalStatus(answer), output, usage);
}

/**
 * The non-streaming 200 body (Starlette's JSONResponse of the same model: compact, raw UTF-8). `onFinal` sees the same
 * string (the store keeps what was sent: each call draws a new output item id).
 */
export function responsesBody(answer: ResponsesAnswer, onFinal?: FinalResponseHook): string {
  const body = finalResponse(answer, choiceTextJsonInner(0, 0, answer.tokens), answer.tokens);
  onFinal?.(body, finalStatus(answer));
  return body;
}

/**
 * A stored response with nothing generated yet: `queued` (what a background request answers at once, and what the
 * store holds until the task ends) or `cancelled` (the same, after /cancel): `output: []`, `usage: null`.
 */
export function pendingResponseBody(answer: ResponsesAnswer, status: 'queued' | 'cancelled'): string {
  return responseObject(answer, status, '[]', 'null');
}

/**
 * The stream's events. An engine error is never an event here: vLLM's attempt to send one fails its own validation
 * and the exception cuts the connection (`failure` returns null). `onFinal` sees the final response once the
 * generation ran to its end (what vLLM stores, if `store`), whether or not `response.completed` is then written.
 */
export function createResponsesWriter(answer: ResponsesAnswer, onFinal?: FinalResponseHook): EventWriter {
  let sequence = 0;
  let text = '';
  let outputTokens = 0;
  /** The streamed item's id: a bare random_uuid() on the simple path. */
  const itemId = randomId();
  const event = (type: string, body: string): NamedEvent => ({ name: type, data: `{${body}"sequence_number":${sequence++},"type":"${type}"}` });
  const deltaBody = (inner: string): string => `"content_index":0,"delta":"${inner}","item_id":"${itemId}","logprobs":[],"output_index":0,`;
  const delta = (inner: string): NamedEvent => event('response.output_text.delta', deltaBody(inner));
  const initial = (): string => responseObject(answer, 'in_progress', '[]', 'null');
  return {
    opening: () => [event('response.created', `"response":${initial()},`), event('response.in_progress', `"response":${initial()},`)],
    first: () => [
      event(
        'response.output_item.added',
        `"item":{"id":"${itemId}","content":[],"role":"assistant","status":"in_progress","type":"message","phase":null},"output_index":0,`,
      ),
      event('response.content_part.added', `"content_index":0,"item_id":"${itemId}","output_index":0,"part":${outputTextPart('', '[]')},`),
    ],
    output: (start, count) => {
      const inner = choiceTextJsonInner(0, start, count);
      text += inner;
      outputTokens += count;
      return delta(inner);
    },
    oversized: (bytes) => {
      const base = Buffer.byteLength(`{${deltaBody('')}"sequence_number":${sequence},"type":"response.output_text.delta"}`);
      const padding = 'x'.repeat(Math.max(0, bytes - base));
      text += padding;
      return delta(padding);
    },
    malformedName: 'response.output_text.delta',
    finish: ({ dropFinish, noTerminal }) => {
      const events: NamedEvent[] = [];
      if (!dropFinish) {
        const part = outputTextPart(text, 'null');
        events.push(
          event('response.output_text.done', `"content_index":0,"item_id":"${itemId}","logprobs":[],"output_index":0,"text":"${text}",`),
          event('response.content_part.done', `"content_index":0,"item_id":"${itemId}","output_index":0,"part":${part},`),
          // vLLM passes `summary=[]` to ResponseOutputMessage; openai's models keep extra keys, so it is dumped.
          event(
            'response.output_item.done',
            `"item":{"id":"${itemId}","content":[${part}],"role":"assistant","status":"completed","type":"message","phase":null,"summary":[]},"output_index":0,`,
          ),
        );
      }
      const final = finalResponse(answer, text, outputTokens);
      onFinal?.(final, finalStatus(answer));
      if (!noTerminal) events.push(event('response.completed', `"response":${final},`));
      return events;
    },
    late: (start) => delta(choiceTextJsonInner(0, start, 1)),
    failure: () => null,
  };
}
