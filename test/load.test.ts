import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AnswerObserver, judgeTranscript, statusOutcome, type RequestResult } from '../load/client.js';
import { readerOf } from '../load/load-routes.js';
import { measureTaken, workloadKeys, type RunHeader } from '../load/header.js';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { parseMetrics, reconcile } from '../load/reconcile.js';
import { htmlReport } from '../load/report.js';
import { createEventReader, readEvent } from '../load/sse.js';
import { sloCandidates, summarize } from '../load/stats.js';
import { chatShareMix, parseRouteMix, planRequest, seededRandom, type LoadRoute, type PlannedRequest, type Workload } from '../load/workload.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';

const WORKLOAD: Workload = {
  model: undefined,
  promptTokens: { min: 10, max: 100 },
  outputTokens: { min: 8, max: 16 },
  streamShare: 0.5,
  routeShares: chatShareMix(0.5),
  n: { min: 1, max: 2 },
  usageShare: 0.5,
  cancelShare: 0.1,
  cancelAfterFirstTokenShare: 0.5,
  faultShare: 0.2,
  faultKinds: ['status', 'error_after', 'no_done'],
  slowShare: 0.05,
};

describe('load options', () => {
  it('reports every problem at once, naming the flag', async () => {
    const result = await parseLoadArgs(['--concurrency', '0', '--stream-share', '2', '--fault-kinds', 'status,bogus', '--duration', 'soon']);
    expect('problems' in result && [...result.problems].sort()).toEqual([
      '--concurrency: "0" must be a positive number',
      '--duration: "soon" is not a duration (e.g. 250ms, 30s, 2m)',
      '--fault-kinds: unknown kind "bogus" (one of status, error_before_output, error_after, reset_after, reset_before_response, stall_after, end_after, no_done, drop_finish, malformed_after, oversized_after, data_after_done)',
      '--stream-share: "2" is not a share between 0 and 1',
      '--url: required',
    ]);
  });
});

describe('workload', () => {
  it('is the same for the same seed, and never combines a fault, a cancellation and slow timing', () => {
    const plans = (seed: number) => {
      const random = seededRandom(seed);
      return Array.from({ length: 500 }, (_, i) => planRequest(WORKLOAD, random, i, true));
    };
    expect(plans(3)).toEqual(plans(3));
    expect(plans(3)).not.toEqual(plans(4));
    for (const plan of plans(3)) {
      expect([plan.fault, plan.cancel, plan.slow].filter((x) => x !== undefined).length).toBeLessThanOrEqual(1);
      if (plan.cancel !== undefined) expect(plan.stream).toBe(true);
      if (plan.fault !== undefined && !plan.stream) expect(['status', 'reset_after', 'reset_before_response', 'stall_after']).toContain(plan.fault);
      if (plan.cancel?.phase === 'streaming') expect(plan.cancel.afterEvents).toBeLessThanOrEqual(plan.maxTokens / 2);
    }
  });
});

describe('client-side outcomes', () => {
  it('tells Waybill\'s own 504 (a deadline: timeout) from an upstream error event with code 504 (failed)', () => {
    expect(statusOutcome(504, '{"error":{"message":"m","type":"timeout_error","param":null,"code":"upstream_timeout"}}')).toBe('timeout');
    expect(statusOutcome(504, '{"error":{"message":"m","type":"GatewayTimeout","param":null,"code":504}}')).toBe('failed');
    expect(statusOutcome(502, '')).toBe('failed');
    expect(statusOutcome(429, '')).toBe('rejected');
  });
});

describe('the client reads responses on its own', () => {
  it('cuts events however the bytes are chunked (inside a UTF-8 character, between CR and LF)', () => {
    const text = [
      ': keep-alive',
      'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
      '',
      'data: {"choices":[{"index":0,"delta":{"content":"héllo"},"finish_reason":null}]}',
      '',
      'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}',
      '',
      'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}',
      '',
      'data: [DONE]',
      '',
      '',
    ].join('\r\n');
    const bytes = Buffer.from(text);
    const expected = [
      { kind: 'chunk', output: [], finishes: [], usage: undefined },
      // The text of choice 0 is read too (a multi-turn session sends it back), whole however the bytes were cut.
      { kind: 'chunk', output: [0], finishes: [], usage: undefined, text: 'héllo' },
      { kind: 'chunk', output: [], finishes: [[0, 'length']], usage: undefined },
      { kind: 'chunk', output: [], finishes: [], usage: { promptTokens: 7, completionTokens: 3, cachedTokens: 2 } },
      { kind: 'done' },
    ];
    for (let cut = 1; cut < bytes.length; cut++) {
      const events: unknown[] = [];
      const reader = createEventReader((data) => events.push(readEvent(data)), () => events.push('oversized'));
      reader.feed(bytes.subarray(0, cut));
      reader.feed(bytes.subarray(cut));
      reader.end();
      expect(events, `cut at ${cut}`).toEqual(expected);
    }
  });

  it('tells Waybill\'s own error events by their string code, and counts only countable usage', () => {
    expect(readEvent('{"error":{"message":"m","type":"timeout_error","param":null,"code":"stream_timeout"}}')).toEqual({ kind: 'error', outcome: 'timeout' });
    expect(readEvent('{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}')).toEqual({ kind: 'error', outcome: 'stream_error' });
    expect(readEvent('{"id":"broken')).toEqual({ kind: 'malformed' });
    expect(readEvent('[1]')).toEqual({ kind: 'malformed' });
    const usage = (u: string) => (readEvent(`{"choices":[],"usage":${u}}`) as { usage: unknown }).usage;
    expect(usage('{"prompt_tokens":1e308,"completion_tokens":1}')).toBeUndefined();
    expect(usage('{"prompt_tokens":2,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}}')).toBeUndefined();
    expect(usage('{"prompt_tokens":2,"completion_tokens":null}')).toEqual({ promptTokens: 2, completionTokens: undefined, cachedTokens: undefined });
    const output = (choice: string) => (readEvent(`{"choices":[${choice}]}`) as { output: readonly number[] }).output;
    expect(output('{"index":1,"delta":{"tool_calls":[{"index":0}]}}')).toEqual([1]);
    expect(output('{"index":0,"delta":{"reasoning_content":"x"}}')).toEqual([0]);
    expect(output('{"index":0,"delta":{"content":null}}')).toEqual([]);
  });
});

describe('the route mix', () => {
  it('reads route=share pairs or a mapping, in route order, and names every problem', () => {
    expect(parseRouteMix('embeddings=0.1, chat=0.6,responses=0.2,messages=0.1')).toEqual([
      ['chat_completions', 0.6],
      ['responses', 0.2],
      ['messages', 0.1],
      ['embeddings', 0.1],
    ]);
    expect(parseRouteMix({ tokenize: 0.5, rerank: 0.25, completions: '0.25' })).toEqual([
      ['completions', 0.25],
      ['rerank', 0.25],
      ['tokenize', 0.5],
    ]);
    expect(parseRouteMix('chat=0.6,audio=0.4')).toEqual({ problems: ['unknown route "audio" (one of chat, chat_completions, completions, responses, messages, embeddings, rerank, tokenize)'] });
    expect(parseRouteMix('chat=0.6,responses=0.3')).toEqual({ problems: ['the shares sum to 0.9, not 1'] });
    expect(parseRouteMix('chat=0.5,chat_completions=0.5')).toEqual({ problems: ['route "chat_completions" given twice'] });
    expect(parseRouteMix('chat=2')).toEqual({ problems: ['"chat": "2" is not a share between 0 and 1'] });
  });

  it('is a flag or a YAML key, and not given with --chat-share', async () => {
    const both = await parseLoadArgs(['--url', 'http://x', '--concurrency', '1', '--requests', '1', '--chat-share', '0.5', '--route-mix', 'chat=1']);
    expect('problems' in both && both.problems).toEqual(['--route-mix / --chat-share: give one (a mix names the chat share itself)']);
    const dir = mkdtempSync(join(tmpdir(), 'waybill-load-'));
    writeFileSync(join(dir, 'w.yaml'), 'route_shares: { chat_completions: 0.5, responses: 0.25, embeddings: 0.25 }\n');
    const file = await parseLoadArgs(['--url', 'http://x', '--concurrency', '1', '--requests', '1', '--workload', join(dir, 'w.yaml')]);
    if ('problems' in file) throw new Error(file.problems.join('\n'));
    expect(file.workload.routeShares).toEqual([['chat_completions', 0.5], ['responses', 0.25], ['embeddings', 0.25]]);
    const bad = await parseLoadArgs(['--url', 'http://x', '--concurrency', '1', '--requests', '1', '--route-mix', 'chat=0.5']);
    expect('problems' in bad && bad.problems).toEqual(['--route-mix: the shares sum to 0.5, not 1']);
  });

  const MIXED: Workload = {
    ...WORKLOAD,
    streamShare: 0.7,
    routeShares: [['chat_completions', 0.3], ['completions', 0.1], ['responses', 0.2], ['messages', 0.2], ['embeddings', 0.1], ['rerank', 0.05], ['tokenize', 0.05]],
    faultKinds: ['status', 'error_after', 'no_done', 'reset_after', 'stall_after', 'end_after'],
  };
  const plans = (workload: Workload, seed: number, count = 4000) => {
    const random = seededRandom(seed);
    return Array.from({ length: count }, (_, i) => planRequest(workload, random, i, true));
  };

  it('draws each route in its share, the same for the same seed; only streaming routes stream, are cancelled or slowed', () => {
    expect(plans(MIXED, 3)).toEqual(plans(MIXED, 3));
    expect(plans(MIXED, 3)).not.toEqual(plans(MIXED, 4));
    const drawn = plans(MIXED, 3);
    for (const [route, share] of MIXED.routeShares) {
      const seen = drawn.filter((p) => p.route === route).length / drawn.length;
      expect(Math.abs(seen - share), route).toBeLessThan(0.03);
    }
    for (const plan of drawn) {
      const generation = plan.route === 'chat_completions' || plan.route === 'completions';
      expect(plan.n, plan.route).toBe(generation ? plan.n : plan.route === 'responses' || plan.route === 'messages' ? 1 : 0);
      if (!generation) expect(plan.includeUsage).toBe(false);
      if (['embeddings', 'rerank', 'tokenize'].includes(plan.route)) {
        expect(plan.stream).toBe(false);
        expect(plan.cancel).toBeUndefined();
        expect(plan.slow).toBeUndefined();
      }
      if (plan.fault !== undefined && !plan.stream) expect(['status', 'reset_after', 'reset_before_response', 'stall_after']).toContain(plan.fault);
      expect([plan.fault, plan.cancel, plan.slow].filter((x) => x !== undefined).length).toBeLessThanOrEqual(1);
    }
    for (const route of ['responses', 'messages'] as const) {
      expect(drawn.some((p) => p.route === route && p.stream && p.cancel?.phase === 'streaming')).toBe(true);
      expect(drawn.some((p) => p.route === route && !p.stream)).toBe(true);
    }
  });

  it('without a mix, chat_share plans what the same mix of chat and legacy completions plans', () => {
    const asMix = { ...WORKLOAD, routeShares: parseRouteMix('chat=0.5,completions=0.5') as Workload['routeShares'] };
    expect(plans(WORKLOAD, 9, 500)).toEqual(plans(asMix, 9, 500));
    const chatOnly = plans({ ...WORKLOAD, routeShares: chatShareMix(1) }, 9, 500);
    expect(chatOnly.every((p) => p.route === 'chat_completions')).toBe(true);
  });
});

/** A plan for judging a transcript: one request on `route`, nothing injected. */
function planFor(route: LoadRoute, stream: boolean, n = 1): PlannedRequest {
  return { index: 0, route, stream, n, promptTokens: 10, maxTokens: 8, includeUsage: stream, simHeader: undefined, fault: undefined, cancel: undefined, slow: undefined };
}

/** An event stream from [event name or undefined, data] pairs, as the wire carries it. */
const sse = (...events: Array<readonly [string | undefined, string]>) =>
  events.map(([name, data]) => `${name === undefined ? '' : `event: ${name}\n`}data: ${data}\n\n`).join('');

describe('judging a Responses answer (docs/routes.md)', () => {
  const created = (seq: number) => ['response.created', `{"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null},"sequence_number":${seq},"type":"response.created"}`] as const;
  const inProgress = (seq: number) => ['response.in_progress', `{"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null},"sequence_number":${seq},"type":"response.in_progress"}`] as const;
  const added = (seq: number) => ['response.output_item.added', `{"item":{"id":"i1","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":${seq},"type":"response.output_item.added"}`] as const;
  const delta = (seq: number, text: string) => ['response.output_text.delta', `{"content_index":0,"delta":${JSON.stringify(text)},"item_id":"i1","logprobs":[],"output_index":0,"sequence_number":${seq},"type":"response.output_text.delta"}`] as const;
  const completed = (seq: number, response: string) => ['response.completed', `{"response":${response},"sequence_number":${seq},"type":"response.completed"}`] as const;
  const USAGE = '"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":4},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":14}';
  const message = '{"id":"msg_1","content":[{"annotations":[],"text":"Hi there","type":"output_text"}],"role":"assistant","status":"completed","type":"message"}';

  it('is delivered when response.completed arrives: its status is the finish reason, its usage counted', () => {
    const stream = (status: string, output: string, extra = '') =>
      judgeTranscript(planFor('responses', true), 200, 'text/event-stream; charset=utf-8', sse(
        created(0), inProgress(1), added(2), delta(3, ''), delta(4, 'Hi'), delta(5, ' there'),
        ['response.output_text.done', '{"content_index":0,"item_id":"i1","output_index":0,"text":"Hi there","sequence_number":6,"type":"response.output_text.done"}'],
        completed(7, `{"id":"resp_1","object":"response","status":"${status}",${extra}"output":${output},${USAGE}}`),
      ));
    expect(stream('completed', `[${message}]`)).toEqual({
      outcome: 'delivered', code: 200, cancelPhase: undefined, finishReasons: ['stop'], cancelRacedEnd: false, anomaly: undefined,
      usage: { promptTokens: 12, completionTokens: 2, cachedTokens: 4 }, outputEvents: 2,
    });
    expect(stream('incomplete', `[${message}]`, '"incomplete_details":{"reason":"max_output_tokens"},').finishReasons).toEqual(['length']);
    expect(stream('incomplete', `[${message}]`, '"incomplete_details":{"reason":"content_filter"},').finishReasons).toEqual(['content_filter']);
    expect(stream('completed', `[${message},{"type":"function_call","name":"f","arguments":"{}","call_id":"c"}]`).finishReasons).toEqual(['tool_calls']);
    expect(stream('cancelled', `[${message}]`).finishReasons).toEqual(['abort']);
  });

  it('tells Waybill\'s own error event (its string code, the next sequence_number) from a failure event; a clean end is incomplete', () => {
    const head = [created(0), inProgress(1), added(2), delta(3, 'Hi')] as const;
    const own = (code: string, seq: number) =>
      ['error', `{"type":"error","error":{"message":"m","type":"upstream_error","param":null,"code":"${code}"},"code":"${code}","message":"m","param":null,"sequence_number":${seq}}`] as const;
    const judge = (...events: Array<readonly [string | undefined, string]>) => judgeTranscript(planFor('responses', true), 200, 'text/event-stream', sse(...head, ...events));
    expect(judge(own('stream_truncated', 4))).toMatchObject({ outcome: 'incomplete', finishReasons: ['none'], anomaly: undefined, usage: undefined, outputEvents: 1 });
    expect(judge(own('stream_timeout', 4))).toMatchObject({ outcome: 'timeout', anomaly: undefined });
    expect(judge(own('stream_truncated', 9))).toMatchObject({ outcome: 'incomplete', anomaly: 'a Responses sequence_number out of order reached the client' });
    expect(judge(['response.failed', '{"response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"m"}},"sequence_number":4,"type":"response.failed"}'])).toMatchObject({ outcome: 'stream_error', anomaly: undefined });
    expect(judge(['error', '{"type":"error","code":"server_error","message":"m","param":null,"sequence_number":4}'])).toMatchObject({ outcome: 'stream_error' });
    expect(judge()).toMatchObject({ outcome: 'incomplete', anomaly: 'the stream ended with neither response.completed nor an error event' });
    // A malformed event is Waybill's to drop.
    expect(judge(['response.output_text.delta', '{"id":"broken'], own('stream_truncated', 4))).toMatchObject({ anomaly: 'malformed event reached the client' });
  });

  it('takes a non-stream answer whole: a length cap is still delivered', () => {
    const body = `{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[${message}],${USAGE}}`;
    expect(judgeTranscript(planFor('responses', false), 200, 'application/json', body)).toMatchObject({
      outcome: 'delivered', finishReasons: ['length'], usage: { promptTokens: 12, completionTokens: 2, cachedTokens: 4 }, outputEvents: 1,
    });
    const refused = '{"error":{"message":"input: Field required","type":"Bad Request","param":null,"code":400}}';
    expect(judgeTranscript(planFor('responses', false), 400, 'application/json', refused)).toMatchObject({ outcome: 'rejected', code: 400, finishReasons: [] });
  });

  it('clocks TTFT on the first output delta, not on the events announced at once', () => {
    const observer = new AnswerObserver(planFor('responses', true));
    let clock = 0;
    const reader = observer.streamReader(() => clock);
    for (const [at, event] of [[1, created(0)], [2, inProgress(1)], [30, added(2)], [31, delta(3, '')], [32, delta(4, 'Hi')], [40, delta(5, '!')]] as const) {
      clock = at;
      reader.feed(Buffer.from(sse(event)));
    }
    expect([observer.firstOutputAt, observer.outputEvents, observer.itl]).toEqual([32, 2, [8]]);
  });
});

describe('judging a Messages answer (docs/routes.md, docs/errors.md)', () => {
  const start = ['message_start', '{"type":"message_start","message":{"id":"chatcmpl-1","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":0}}}'] as const;
  const blockStart = ['content_block_start', '{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}'] as const;
  const text = (t: string) => ['content_block_delta', `{"type":"content_block_delta","delta":{"type":"text_delta","text":${JSON.stringify(t)}},"index":0}`] as const;
  const blockStop = ['content_block_stop', '{"type":"content_block_stop","index":0}'] as const;
  const messageDelta = (reason: string) => ['message_delta', `{"type":"message_delta","delta":{"stop_reason":${reason}},"usage":{"input_tokens":9,"output_tokens":2}}`] as const;
  const stop = ['message_stop', '{"type":"message_stop"}'] as const;
  const judge = (...events: Array<readonly [string | undefined, string]>) => judgeTranscript(planFor('messages', true), 200, 'text/event-stream; charset=utf-8', sse(...events));

  it('is delivered when message_stop follows a stop reason; stop reasons map onto finish reasons; usage from message_delta', () => {
    const reasons: Array<[string, string]> = [['"end_turn"', 'stop'], ['"stop_sequence"', 'stop'], ['"max_tokens"', 'length'], ['"tool_use"', 'tool_calls'], ['null', 'none']];
    for (const [reason, label] of reasons) {
      expect(judge(start, blockStart, text('Hi'), text(' there'), blockStop, messageDelta(reason), stop), reason).toEqual({
        outcome: 'delivered', code: 200, cancelPhase: undefined, finishReasons: [label], cancelRacedEnd: false, anomaly: undefined,
        usage: { promptTokens: 9, completionTokens: 2, cachedTokens: undefined }, outputEvents: 2,
      });
    }
    // message_stop without a stop reason: Waybill must not pass it on as complete.
    expect(judge(start, blockStart, text('Hi'), stop)).toMatchObject({ outcome: 'delivered', anomaly: 'message_stop arrived without a finish reason for every choice' });
  });

  it('counts an upstream error event as stream_error and Waybill\'s own (api_error, timeout_error) as it counts them; message_start\'s usage is not the answer\'s', () => {
    const upstream = ['error', '{"type":"error","error":{"type":"internal_error","message":"2 validation errors for ChatCompletionStreamResponse"}}'] as const;
    expect(judge(start, blockStart, text('Hi'), upstream)).toEqual({
      outcome: 'stream_error', code: 200, cancelPhase: undefined, finishReasons: ['none'], cancelRacedEnd: false, anomaly: undefined, usage: undefined, outputEvents: 1,
    });
    const own = (type: string) => ['error', `{"type":"error","error":{"type":"${type}","message":"the upstream ended the stream before it was complete"}}`] as const;
    expect(judge(start, blockStart, text('Hi'), own('api_error'))).toMatchObject({ outcome: 'incomplete', finishReasons: ['none'], usage: undefined });
    expect(judge(start, blockStart, text('Hi'), own('timeout_error'))).toMatchObject({ outcome: 'timeout' });
    // A clean end without message_stop, or an error after message_delta: usage as message_delta said.
    expect(judge(start, blockStart, text('Hi'), blockStop, messageDelta('"end_turn"'))).toMatchObject({
      outcome: 'incomplete', anomaly: 'the stream ended with neither message_stop nor an error event', usage: { promptTokens: 9, completionTokens: 2 },
    });
  });

  it('clocks TTFT on the first content delta (or tool_use block), not on message_start', () => {
    const observer = new AnswerObserver(planFor('messages', true));
    let clock = 0;
    const reader = observer.streamReader(() => clock);
    const tool = ['content_block_start', '{"type":"content_block_start","content_block":{"type":"tool_use","id":"t","name":"f","input":{}},"index":1}'] as const;
    for (const [at, event] of [[20, start], [21, blockStart], [22, text('')], [25, text('Hi')], [27, tool]] as const) {
      clock = at;
      reader.feed(Buffer.from(sse(event)));
    }
    expect([observer.firstOutputAt, observer.outputEvents, observer.itl]).toEqual([25, 2, [2]]);
  });

  it('takes a non-stream answer whole (a null stop reason is left out), and Anthropic-shaped errors by status', () => {
    const body = (reason: string) => `{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"m"${reason},"usage":{"input_tokens":3,"output_tokens":2}}`;
    expect(judgeTranscript(planFor('messages', false), 200, 'application/json', body(''))).toMatchObject({
      outcome: 'delivered', finishReasons: ['none'], usage: { promptTokens: 3, completionTokens: 2, cachedTokens: undefined }, outputEvents: 1,
    });
    expect(judgeTranscript(planFor('messages', false), 200, 'application/json', body(',"stop_reason":"max_tokens"')).finishReasons).toEqual(['length']);
    const anthropic = (type: string) => `{"type":"error","error":{"type":"${type}","message":"m"}}`;
    // Waybill's own 504 (its deadline) has no code in Anthropic's shape; vLLM's Anthropic errors carry none either.
    expect(judgeTranscript(planFor('messages', false), 504, 'application/json', anthropic('api_error'))).toMatchObject({ outcome: 'timeout', code: 504 });
    expect(judgeTranscript(planFor('messages', true), 502, 'application/json', anthropic('api_error'))).toMatchObject({ outcome: 'failed', code: 502, finishReasons: [] });
    expect(judgeTranscript(planFor('messages', true), 429, 'application/json', anthropic('rate_limit_error'))).toMatchObject({ outcome: 'rejected' });
  });
});

describe('judging the non-generation routes (docs/routes.md)', () => {
  it('delivers a 2xx JSON object without error: no choices, usage.prompt_tokens (rerank\'s two keys; tokenize none)', () => {
    const embeddings = '{"id":"embd-0","object":"list","created":1,"model":"m","data":[{"index":0,"object":"embedding","embedding":[0.6,0.8]}],"usage":{"prompt_tokens":7,"total_tokens":7,"completion_tokens":0,"prompt_tokens_details":null}}';
    expect(judgeTranscript(planFor('embeddings', false, 0), 200, 'application/json', embeddings)).toEqual({
      outcome: 'delivered', code: 200, cancelPhase: undefined, finishReasons: [], cancelRacedEnd: false, anomaly: undefined,
      usage: { promptTokens: 7, completionTokens: 0, cachedTokens: undefined }, outputEvents: 0,
    });
    const rerank = '{"id":"score-0","model":"m","usage":{"prompt_tokens":11,"total_tokens":11},"results":[{"index":1,"document":{"text":"b","multi_modal":null},"relevance_score":0.9}]}';
    expect(judgeTranscript(planFor('rerank', false, 0), 200, 'application/json', rerank)).toMatchObject({ outcome: 'delivered', usage: { promptTokens: 11, completionTokens: undefined } });
    const tokenize = '{"count":3,"max_model_len":131072,"tokens":[1,2,3],"token_strs":null}';
    expect(judgeTranscript(planFor('tokenize', false, 0), 200, 'application/json', tokenize)).toMatchObject({ outcome: 'delivered', usage: undefined, finishReasons: [] });
    // An error body under 200 is answered with a status by Waybill: reaching the client, it is a bug.
    expect(judgeTranscript(planFor('embeddings', false, 0), 200, 'application/json', '{"error":{"message":"m","type":"t","param":null,"code":500}}')).toMatchObject({
      outcome: 'incomplete', anomaly: 'a 200 body that is not an answer reached the client',
    });
    expect(judgeTranscript(planFor('embeddings', false, 0), 504, 'application/json', '{"error":{"message":"m","type":"timeout_error","param":null,"code":"upstream_timeout"}}')).toMatchObject({ outcome: 'timeout' });
    expect(judgeTranscript(planFor('tokenize', false, 0), 404, 'application/json', '{"detail":"Not Found"}')).toMatchObject({ outcome: 'rejected' });
  });

  it('has no stream to read', () => {
    expect(readerOf('embeddings').event('{}', undefined)).toEqual({ kind: 'malformed' });
  });
});

describe('borderline SLO results', () => {
  const plan = { ...planRequest(WORKLOAD, seededRandom(1), 0, false), stream: true, n: 1, cancel: undefined, fault: undefined, slow: undefined };
  const result = (over: Partial<RequestResult>): RequestResult => ({
    plan, startedAt: 0, sentMs: 5, status: 200, outcome: 'delivered', code: 200, cancelPhase: undefined, ttftMs: 100, tpotMs: 20,
    e2eMs: 1000, itlMs: [], outputEvents: 11, usage: { promptTokens: 100, completionTokens: 11, cachedTokens: undefined },
    finishReasons: ['stop'], cancelRacedEnd: false, anomaly: undefined, error: undefined, ...over,
  });
  const slo = { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000 };

  it('are those whose client timing lies within the margin of a threshold; the others are exact', () => {
    // TTFT runs from the moment the request was written (sentMs 5); Waybill's cannot be longer than the client's.
    expect(sloCandidates(result({ ttftMs: 2005 }), slo, 50)).toEqual(['met']);
    expect(sloCandidates(result({ ttftMs: 2030 }), slo, 50)).toEqual(['met', 'missed_ttft']);
    expect(sloCandidates(result({ ttftMs: 2056 }), slo, 50)).toEqual(['missed_ttft']);
    // TPOT is an interval over 10 gaps (11 tokens): the margin is 5 ms either side.
    expect(sloCandidates(result({ tpotMs: 94 }), slo, 50)).toEqual(['met']);
    expect(sloCandidates(result({ tpotMs: 97 }), slo, 50)).toEqual(['met', 'missed_tpot']);
    expect(sloCandidates(result({ tpotMs: 106 }), slo, 50)).toEqual(['missed_tpot']);
    // A cancellation before the first token: the time the client waited, the margin either side.
    const cancelled = result({ outcome: 'client_cancelled', code: 499, cancelPhase: 'before_first_token', ttftMs: undefined, tpotMs: undefined, usage: undefined });
    expect(sloCandidates({ ...cancelled, e2eMs: 1960 }, slo, 50)).toEqual(['excluded', 'missed_ttft']);
    expect(sloCandidates({ ...cancelled, e2eMs: 1900 }, slo, 50)).toEqual(['excluded']);
  });

  it('let Waybill\'s count of a class lie between the exact count and the exact count plus the borderline ones', () => {
    const results = [result({ ttftMs: 2030 }), result({ ttftMs: 10 })];
    const mismatchesWith = (met: number, missed: number) => {
      const text = [`waybill_slo_requests_total{model="m",prompt_len="0-1k",result="met"} ${met}`, `waybill_slo_requests_total{model="m",prompt_len="0-1k",result="missed_ttft"} ${missed}`].join('\n');
      const after = { metrics: parseMetrics(text), sims: [] };
      return reconcile(results, { metrics: [], sims: [] }, after, slo, 50).mismatches.filter((m) => m.what.startsWith('SLO'));
    };
    expect(mismatchesWith(2, 0)).toEqual([]);
    expect(mismatchesWith(1, 1)).toEqual([]);
    expect(mismatchesWith(0, 2)).toEqual([
      { what: 'SLO results by prompt_len', key: '0-1k|met', min: 1, max: 2, waybill: 0 },
      { what: 'SLO results by prompt_len', key: '0-1k|missed_ttft', min: 0, max: 1, waybill: 2 },
    ]);
    // Each request is counted once: met 2 and missed 1 are each within bounds, but not together.
    expect(mismatchesWith(2, 1)).toEqual([{ what: 'SLO results by prompt_len', key: 'total', min: 2, max: 2, waybill: 3 }]);
  });
});

describe('reconciling the event routes', () => {
  const slo = { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000 };
  const faulted = (route: LoadRoute, fault: PlannedRequest['fault'], over: Partial<RequestResult>): RequestResult => ({
    plan: { ...planFor(route, true), fault, simHeader: `tokens=8; ${fault ?? ''}=3` },
    startedAt: 0, sentMs: 1, status: 200, outcome: 'delivered', code: 200, cancelPhase: undefined, ttftMs: 20, tpotMs: undefined, e2eMs: 100,
    itlMs: [], outputEvents: 3, usage: undefined, finishReasons: ['none'], cancelRacedEnd: false, anomaly: undefined, error: undefined, ...over,
  });
  const anomalyMismatches = (results: RequestResult[], counted: Record<string, number>, injected: Record<string, number>) => {
    const metrics = parseMetrics(Object.entries(counted).map(([kind, n]) => `waybill_stream_anomalies_total{model="m",upstream="u",kind="${kind}"} ${n}`).join('\n'));
    const sims = (faults: Record<string, number>) => [{ byRoute: {}, faultsInjected: faults }];
    return reconcile(results, { metrics: [], sims: sims({}) }, { metrics, sims: sims(injected) }, slo, 50).mismatches.filter(
      (m) => m.what.startsWith('anomalies') || m.what.startsWith('faults injected'),
    );
  };

  it('expects each fault\'s anomalies as the route shows it (docs/simulator.md): no [DONE] after a Messages error, no finish without response.completed', () => {
    const results = [
      // Messages: `event: error` then a clean end — an error payload, never a [DONE] after it.
      faulted('messages', 'error_after', { outcome: 'stream_error' }),
      // Responses: the finish reason comes only with response.completed.
      faulted('responses', 'no_done', { outcome: 'incomplete' }),
      // Responses: an engine error cuts the connection before output: retried, a 502, no anomaly; injected once per attempt.
      faulted('responses', 'error_before_output', { status: 502, code: 502, outcome: 'failed', finishReasons: [], outputEvents: 0, ttftMs: undefined }),
    ];
    const counted = { error_payload: 1, missing_done: 1, missing_finish_reason: 1 };
    expect(anomalyMismatches(results, counted, { error_after: 1, no_done: 1, error_before_output: 3 })).toEqual([]);
    expect(anomalyMismatches(results, { ...counted, done_after_error: 1 }, { error_after: 1, no_done: 1, error_before_output: 1 })).toEqual([
      { what: 'anomalies (faults the clients saw take effect, Waybill counted)', key: 'done_after_error', min: 0, max: 0, waybill: 1 },
    ]);
    expect(anomalyMismatches(results, counted, { error_after: 2, no_done: 1 })).toEqual([
      { what: 'faults injected (clients planned, simulators injected)', key: 'error_after', min: 1, max: 1, waybill: 2 },
      { what: 'faults injected (clients planned, simulators injected)', key: 'error_before_output', min: 1, max: Number.POSITIVE_INFINITY, waybill: 0 },
    ]);
  });
});

describe('the HTML report', () => {
  it('draws a long run (millions of inter-token gaps) without exceeding the call stack', () => {
    const plan = planRequest(WORKLOAD, seededRandom(1), 0, false);
    const gaps = Array.from({ length: 1_000_000 }, (_, i) => 1 + (i % 97));
    const result = {
      plan, startedAt: 0, sentMs: 0, status: 200, outcome: 'delivered' as const, code: 200, cancelPhase: undefined, ttftMs: 5, tpotMs: 2,
      e2eMs: 2000, itlMs: gaps, outputEvents: gaps.length + 1, usage: undefined, finishReasons: ['stop' as const], cancelRacedEnd: false, anomaly: undefined, error: undefined,
    };
    const slo = { ttftMs: 2000, tpotMs: 100, e2eMs: 60_000 };
    const asked = { requests: 1, durationS: null, warmup: 0 };
    const header: RunHeader = {
      target: 'http://127.0.0.1:1', model: 'm', startedAt: new Date(0).toISOString(), load: { mode: 'closed', concurrency: 1 }, asked,
      taken: measureTaken([result], asked, 2000), workload: workloadKeys(WORKLOAD, 'm'), seed: 1, simulator: false, reconcile: false,
      timeoutS: 300, waybill: { version: '0.0.0', revision: 'unknown' }, argv: [],
    };
    const html = htmlReport({ header, summary: summarize([result], 2, slo), slo, results: [result], reconciliation: undefined });
    expect(html).toContain('Inter-token latency (per event) (1000000 values');
  });
});

describe('a run against the simulator', () => {
  let sim: Simulator;
  let url: string;
  beforeAll(async () => {
    sim = createSimulator({ ttftMs: 2, itlMs: 1, jitter: 0 });
    url = (await sim.listen(0, '127.0.0.1')).url;
  });
  afterAll(async () => {
    await sim.close();
  });

  it('measures every request and writes the JSON and self-contained HTML reports', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-load-'));
    const config = await parseLoadArgs([
      '--url', url, '--concurrency', '8', '--requests', '60', '--output-tokens', '10',
      '--usage-share', '1', '--json', join(dir, 'r.json'), '--html', join(dir, 'r.html'), '--quiet',
    ]);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    const lines: string[] = [];
    expect(await runLoadWith(config, (t) => lines.push(t))).toEqual({ exitCode: 0, mismatches: 0 });
    expect(lines.join('\n')).toMatch(/delivered\s+60 {2}\(100\.00% delivered vs 100\.00% HTTP 2xx\)/);
    const report = JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as {
      summary: { requests: number; ttftMs: { count: number }; itlMs: { count: number } };
      requests: Array<{ outcome: string; output_events: number; usage: { completionTokens: number } }>;
    };
    expect(report.summary.requests).toBe(60);
    expect(report.requests.every((r) => r.outcome === 'delivered' && r.output_events === 10 && r.usage.completionTokens === 10)).toBe(true);
    expect(report.summary.ttftMs.count).toBe(60);
    expect(report.summary.itlMs.count).toBe(60 * 9);
    const html = readFileSync(join(dir, 'r.html'), 'utf8');
    expect(html).toContain('<svg');
    expect(html).not.toMatch(/<(script|link|img)[^>]+(src|href)=/);
    expect(sim.stats().byRoute.chat_completions).toBe(60);
  });

  it('sends every route of a mix, streamed and not, and reads each answer as delivered', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-load-'));
    const before = sim.stats().byRoute;
    const config = await parseLoadArgs([
      '--url', url, '--concurrency', '8', '--requests', '140', '--output-tokens', '6', '--stream-share', '0.5', '--seed', '2',
      '--route-mix', 'chat=0.2,completions=0.1,responses=0.2,messages=0.2,embeddings=0.1,rerank=0.1,tokenize=0.1',
      '--json', join(dir, 'r.json'), '--quiet',
    ]);
    if ('problems' in config) throw new Error(config.problems.join('\n'));
    expect(await runLoadWith(config, () => {})).toEqual({ exitCode: 0, mismatches: 0 });
    const report = JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')) as {
      requests: Array<{ route: string; stream: boolean; outcome: string; anomaly?: string; finish_reasons: string[]; output_events: number; usage?: { promptTokens?: number } }>;
    };
    const after = sim.stats().byRoute;
    for (const route of ['chat_completions', 'completions', 'responses', 'messages', 'embeddings', 'rerank', 'tokenize'] as const) {
      const sent = report.requests.filter((r) => r.route === route);
      expect(sent.length, route).toBeGreaterThan(0);
      expect(after[route] - before[route], route).toBe(sent.length);
      for (const r of sent) {
        expect([r.outcome, r.anomaly], route).toEqual(['delivered', undefined]);
        if (route === 'responses' || route === 'messages') expect(r.finish_reasons.length).toBe(1);
        if (r.stream) expect(r.output_events, route).toBe(6);
        // Usage always comes, but on tokenize, and on chat and legacy completions streams that did not ask for it.
        const asked = !(r.stream && (route === 'chat_completions' || route === 'completions'));
        if (route !== 'tokenize' && asked) expect(r.usage?.promptTokens, route).toBeGreaterThan(0);
      }
    }
    expect(report.requests.some((r) => r.route === 'messages' && r.stream)).toBe(true);
    expect(report.requests.some((r) => r.route === 'responses' && r.stream)).toBe(true);
  });
});
