import { describe, expect, it } from 'vitest';
import type { RequestInfo, Verdict } from '../src/accounting/ledger.js';
import { RequestLedger } from './helpers/ledger-driver.js';
import { cancelledRecord, rejectedRecord, settle } from '../src/accounting/settle.js';
import { requestInfo } from './helpers/ledger-info.js';
import { classifyEventData, type EventFacts } from '../src/sse/classify.js';

const info = requestInfo;

const role = (index = 0) => `{"choices":[{"index":${index},"delta":{"role":"assistant","content":""},"finish_reason":null}]}`;
const delta = (text: string, index = 0) => `{"choices":[{"index":${index},"delta":{"content":${JSON.stringify(text)}},"finish_reason":null}]}`;
const finish = (reason: string, index = 0, text = '') =>
  `{"choices":[{"index":${index},"delta":{"content":${JSON.stringify(text)}},"finish_reason":"${reason}","stop_reason":null}]}`;
const usage = (prompt: number, completion: number, cached?: number) =>
  JSON.stringify({
    choices: [],
    usage: {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      ...(cached !== undefined ? { prompt_tokens_details: { cached_tokens: cached } } : {}),
    },
  });
const errorEvent = (code: number) => `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": ${code}}}`;

/** Feeds [time, event data] pairs to a fresh attempt and returns the verdicts. */
function feed(ledger: RequestLedger, events: Array<[number, string]>): Verdict[] {
  return events.map(([at, data]) => ledger.streamEvent(at, classifyEventData(data)));
}

function started(overrides: Partial<RequestInfo> = {}, gaps: number[] = []): RequestLedger {
  const ledger = new RequestLedger(info(overrides), 0, { onInterTokenGap: (ms) => gaps.push(ms) });
  ledger.startAttempt(1, 'u0');
  ledger.responseStarted(2, 200);
  return ledger;
}

describe('classifyEventData', () => {
  it('tells done, malformed, error, output and usage apart', () => {
    expect(classifyEventData('[DONE]')).toEqual({ kind: 'done' });
    expect(classifyEventData('{"id":"broken')).toEqual({ kind: 'malformed' });
    expect(classifyEventData('42')).toEqual({ kind: 'malformed' });
    expect(classifyEventData(errorEvent(500))).toEqual({
      kind: 'error',
      code: 500,
      type: 'InternalServerError',
      message: 'Internal server error',
      param: undefined,
    });
    // An `error` key makes an error whatever else the event holds (older vLLM added "object":"error").
    expect(classifyEventData('{"object":"error","error":"Unauthorized","choices":[]}')).toMatchObject({ kind: 'error', message: 'Unauthorized' });
    const roleFacts = classifyEventData(role());
    expect(roleFacts).toMatchObject({ kind: 'chunk', output: [], choices: [0], finishes: [], usageOnly: false });
    expect(classifyEventData(finish('length', 2, 'x'))).toMatchObject({ output: [2], finishes: [{ index: 2, reason: 'length' }] });
    expect(classifyEventData('{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"finish_reason":null}]}')).toMatchObject({ output: [0] });
    expect(classifyEventData('{"choices":[{"index":0,"delta":{"reasoning":"hm"},"finish_reason":null}]}')).toMatchObject({ output: [0] });
    expect(classifyEventData('{"choices":[{"index":1,"text":"ab","finish_reason":null}]}')).toMatchObject({ output: [1] });
    expect(classifyEventData('{"choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}')).toMatchObject({ output: [] });
    expect(classifyEventData(usage(10, 5))).toMatchObject({
      usageOnly: true,
      usage: { promptTokens: 10, completionTokens: 5, cachedTokens: undefined },
    });
    expect(classifyEventData(usage(10, 5, 4))).toMatchObject({ usage: { cachedTokens: 4 } });
  });
});

describe('RequestLedger — streams', () => {
  it('holds the role chunk, commits on the first output, drops the injected usage chunk, forwards [DONE]', () => {
    const gaps: number[] = [];
    const ledger = started({}, gaps);
    const verdicts = feed(ledger, [
      [100, role()],
      [100, delta('Hel')],
      [130, delta('lo')],
      [150, finish('stop', 0, '!')],
      [150, usage(2000, 4, 1024)],
      [151, '[DONE]'],
    ]);
    expect(verdicts).toEqual(['hold', 'commit', 'forward', 'forward', 'drop', 'forward']);
    expect(ledger.ending).toEqual({ kind: 'complete' });
    expect(gaps).toEqual([30, 20]);
    ledger.streamEnded(152, 'eof');
    ledger.clientEnded(151);
    const s = ledger.settle(153);
    expect(s).toMatchObject({
      outcome: 'delivered',
      code: 200,
      ttftMs: 100,
      // (150 - 100) / (4 - 1)
      tpotMs: 50 / 3,
      durationMs: 151,
      promptLen: '1k-4k',
      slo: 'met',
      finishReasons: ['stop'],
      anomalies: [],
      cancelPhase: undefined,
      usage: { promptTokens: 2000, completionTokens: 4, cachedTokens: 1024 },
    });
    expect(s.attempts).toEqual([
      { upstream: 'u0', startedAt: 1, status: 200, result: 'ok', endedAt: 152, firstOutputAt: 100, failure: undefined },
    ]);
  });

  it('forwards the usage chunk when the client asked for it', () => {
    const ledger = started({ dropUsageChunk: false });
    expect(feed(ledger, [[5, delta('a')], [6, finish('stop')], [7, usage(1, 1)], [8, '[DONE]']])).toEqual(['commit', 'forward', 'forward', 'forward']);
  });

  it('forwards an error event after commit, drops and counts the [DONE] after it: stream_error', () => {
    const ledger = started();
    expect(feed(ledger, [[10, delta('a')], [20, errorEvent(500)], [20, '[DONE]']])).toEqual(['commit', 'forward', 'drop']);
    expect(ledger.ending).toEqual({ kind: 'upstream_error' });
    ledger.clientEnded(20);
    ledger.streamEnded(21, 'eof');
    const s = ledger.settle(21);
    expect(s).toMatchObject({ outcome: 'stream_error', code: 200, slo: 'failed', doneAfterErrorDropped: 1, finishReasons: ['none'] });
    expect(s.anomalies.map((a) => a.kind)).toEqual(['error_payload', 'done_after_error']);
    expect(s.attempts[0]?.result).toBe('error_payload');
  });

  it('turns an error event before any output into the status its code names (lazy validation)', () => {
    const ledger = started();
    expect(feed(ledger, [[10, errorEvent(400)], [10, '[DONE]']])).toEqual(['drop', 'drop']);
    expect(ledger.committed).toBe(false);
    expect(ledger.finalFailure()).toMatchObject({ status: 400, outcome: 'rejected', cause: 'error_payload' });
    ledger.clientEnded(11);
    ledger.streamEnded(11, 'eof');
    expect(ledger.settle(12)).toMatchObject({ outcome: 'rejected', code: 400, slo: 'excluded', finishReasons: [] });
  });

  it('ends a committed stream that stopped without [DONE] as incomplete with missing_done', () => {
    const ledger = started();
    feed(ledger, [[10, delta('a')], [20, delta('b')]]);
    ledger.streamEnded(30, 'eof');
    expect(ledger.ending).toEqual({ kind: 'gateway_error', cause: 'eof' });
    ledger.clientEnded(30);
    const s = ledger.settle(30);
    expect(s).toMatchObject({ outcome: 'incomplete', code: 200, slo: 'failed', tpotMs: undefined });
    expect(s.anomalies.map((a) => a.kind)).toEqual(['missing_done', 'missing_finish_reason']);
    expect(s.attempts[0]?.result).toBe('incomplete');
  });

  it('does not deliver [DONE] when a choice has no finish_reason', () => {
    const ledger = started({ expectedChoices: 2 });
    const verdicts = feed(ledger, [[10, delta('a', 0)], [11, delta('b', 1)], [12, finish('stop', 0)], [13, '[DONE]']]);
    expect(verdicts).toEqual(['commit', 'forward', 'forward', 'drop']);
    expect(ledger.ending).toEqual({ kind: 'gateway_error', cause: 'unfinished_choices' });
    ledger.clientEnded(13);
    ledger.streamEnded(14, 'eof');
    const s = ledger.settle(14);
    expect(s).toMatchObject({ outcome: 'incomplete', finishReasons: ['stop', 'none'] });
    expect(s.anomalies.map((a) => a.kind)).toEqual(['missing_finish_reason']);
  });

  it('counts malformed events and data after [DONE], and drops them', () => {
    const ledger = started();
    const verdicts = feed(ledger, [[10, delta('a')], [11, '{"id":"broken'], [12, finish('length')], [13, '[DONE]'], [14, delta('late')]]);
    expect(verdicts).toEqual(['commit', 'drop', 'forward', 'forward', 'drop']);
    ledger.clientEnded(13);
    ledger.streamEnded(15, 'eof');
    const s = ledger.settle(15);
    expect(s.outcome).toBe('delivered');
    expect(s.anomalies.map((a) => a.kind)).toEqual(['malformed_event', 'data_after_done']);
    expect(s.finishReasons).toEqual(['length']);
  });

  it('counts an idle timeout after commit as a timeout, and a reset as incomplete', () => {
    const idle = started();
    feed(idle, [[10, delta('a')]]);
    idle.streamEnded(50, 'idle_timeout');
    idle.clientEnded(50);
    expect(idle.settle(50)).toMatchObject({ outcome: 'timeout', code: 200 });

    const reset = started();
    feed(reset, [[10, delta('a')]]);
    reset.streamEnded(20, 'reset');
    reset.clientEnded(20);
    const s = reset.settle(20);
    expect(s).toMatchObject({ outcome: 'incomplete', code: 200 });
    expect(s.attempts[0]?.result).toBe('reset');
    expect(s.anomalies).toEqual([]);
  });

  it('maps pre-commit failures to 502 and 504', () => {
    const refused = new RequestLedger(info(), 0);
    refused.startAttempt(0, 'u0');
    refused.connectFailed(1, 'connect_error');
    refused.clientEnded(1);
    expect(refused.settle(1)).toMatchObject({ outcome: 'failed', code: 502, slo: 'failed' });

    const slow = started();
    feed(slow, [[10, role()]]);
    slow.streamEnded(500, 'first_output_timeout');
    slow.clientEnded(500);
    const s = slow.settle(500);
    expect(s).toMatchObject({ outcome: 'timeout', code: 504, ttftMs: undefined });
    expect(s.attempts[0]?.result).toBe('timeout');
  });

  it('records a client cancellation with its phase, and judges the SLO by the time waited', () => {
    const early = started();
    feed(early, [[10, role()]]);
    early.clientCancelled(200);
    early.streamEnded(200, 'eof');
    expect(early.settle(201)).toMatchObject({ outcome: 'client_cancelled', code: 499, cancelPhase: 'before_first_token', slo: 'excluded', durationMs: 200 });

    const late = started();
    late.clientCancelled(1500);
    expect(late.settle(1500)).toMatchObject({ cancelPhase: 'before_first_token', slo: 'missed_ttft' });

    const streaming = started();
    feed(streaming, [[10, delta('a')]]);
    streaming.clientCancelled(40);
    const s = streaming.settle(41);
    expect(s).toMatchObject({ outcome: 'client_cancelled', code: 200, cancelPhase: 'streaming', slo: 'excluded', finishReasons: ['none'] });
    expect(s.attempts[0]?.result).toBe('cancelled');
  });

  it('judges TTFT per prompt-length class and TPOT jointly', () => {
    // 2 s TTFT misses the 1 s default but meets the 3 s threshold of the 4k-16k class.
    const longPrompt = started();
    feed(longPrompt, [[2000, delta('a')], [2010, finish('stop', 0, 'b')], [2010, usage(5000, 2)], [2011, '[DONE]']]);
    longPrompt.clientEnded(2011);
    expect(longPrompt.settle(2012)).toMatchObject({ promptLen: '4k-16k', slo: 'met', tpotMs: 10 });

    const both = started();
    feed(both, [[2000, delta('a')], [2200, finish('stop', 0, 'b')], [2200, usage(10, 2)], [2201, '[DONE]']]);
    both.clientEnded(2201);
    expect(both.settle(2201)).toMatchObject({ promptLen: '0-1k', slo: 'missed_ttft_tpot', tpotMs: 200 });

    const noUsage = started();
    feed(noUsage, [[10, delta('a')], [20, finish('stop', 0, 'b')], [21, '[DONE]']]);
    noUsage.clientEnded(21);
    expect(noUsage.settle(21)).toMatchObject({ promptLen: 'unknown', slo: 'met', tpotMs: undefined, usage: undefined });
  });

  it('keeps the estimated prompt-length class for a request without usage, and lets usage replace it', () => {
    // A ~20k-token prompt that times out before any output: the incident the prompt_len slice exists to show.
    const timedOut = started({ promptTokensEstimate: 20_000 });
    timedOut.streamEnded(600, 'first_output_timeout');
    expect(timedOut.settle(600)).toMatchObject({ outcome: 'timeout', promptLen: '16k-64k', slo: 'failed' });

    const cancelled = started({ promptTokensEstimate: 2_000 });
    cancelled.clientCancelled(50);
    expect(cancelled.settle(50)).toMatchObject({ outcome: 'client_cancelled', promptLen: '1k-4k' });

    const measured = started({ promptTokensEstimate: 20_000 });
    feed(measured, [[10, delta('a')], [20, finish('stop', 0, 'b')], [20, usage(900, 2)], [21, '[DONE]']]);
    measured.clientEnded(21);
    expect(measured.settle(21)).toMatchObject({ outcome: 'delivered', promptLen: '0-1k' });
  });

  it('commits a stream that finished every choice without output at its [DONE]', () => {
    const ledger = started();
    expect(feed(ledger, [[5, role()], [6, finish('length')], [7, '[DONE]']])).toEqual(['hold', 'hold', 'commit']);
    ledger.clientEnded(7);
    expect(ledger.settle(8)).toMatchObject({ outcome: 'delivered', ttftMs: undefined, slo: 'met' });
  });

  it('settles exactly once', () => {
    const ledger = new RequestLedger(info(), 0);
    ledger.reject(400);
    expect(ledger.settle(1)).toMatchObject({ outcome: 'rejected', code: 400, attempts: [], slo: 'excluded' });
    expect(() => ledger.settle(2)).toThrow(/settled twice/);
  });
});

describe('RequestLedger — non-stream bodies', () => {
  const body = (facts: EventFacts) => facts;
  it('delivers a complete body and reads its usage', () => {
    const ledger = new RequestLedger(info({ stream: false }), 0);
    ledger.startAttempt(0, 'u0');
    ledger.bodyReceived(
      400,
      200,
      body(
        classifyEventData(
          '{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}',
        ),
      ),
    );
    ledger.clientEnded(401);
    expect(ledger.settle(401)).toMatchObject({ outcome: 'delivered', code: 200, ttftMs: undefined, slo: 'met', finishReasons: ['stop'], durationMs: 401 });
  });

  it('passes an upstream 4xx through and turns a 5xx into 502', () => {
    const bad = new RequestLedger(info({ stream: false }), 0);
    bad.startAttempt(0, 'u0');
    bad.bodyReceived(5, 400, classifyEventData('{"error":{"message":"too long","type":"BadRequestError","param":"input_tokens","code":400}}'));
    expect(bad.finalFailure()).toMatchObject({ status: 400, outcome: 'rejected', upstreamError: { param: 'input_tokens', message: 'too long' } });

    const broken = new RequestLedger(info({ stream: false }), 0);
    broken.startAttempt(0, 'u0');
    broken.bodyReceived(5, 503, classifyEventData('{"error":"Service Unavailable"}'));
    broken.clientEnded(5);
    const s = broken.settle(5);
    expect(s).toMatchObject({ outcome: 'failed', code: 502, slo: 'failed' });
    expect(s.attempts[0]?.result).toBe('http_5xx');
  });

  it('gives e2e misses for slow non-stream responses', () => {
    const ledger = new RequestLedger(info({ stream: false }), 0);
    ledger.startAttempt(0, 'u0');
    ledger.bodyReceived(6000, 200, classifyEventData('{"choices":[{"index":0,"text":"x","finish_reason":"stop"}]}'));
    ledger.clientEnded(6000);
    expect(ledger.settle(6000)).toMatchObject({ outcome: 'delivered', slo: 'missed_e2e', usage: undefined });
  });
});

describe('relayed output, the estimate for a request without usage', () => {
  it('counts output events per choice and their text, and estimates completion tokens only when usage has none', () => {
    const ledger = started({ charsPerToken: 4 });
    feed(ledger, [
      [3, role()],
      [4, delta('Hello world, this is')], // 20 chars
      [5, '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}'], // 3
      [6, delta('x')],
    ]);
    ledger.clientCancelled(7);
    const settlement = ledger.settle(8);
    expect(settlement.relayed).toEqual({ outputEvents: 3, outputChars: 24 });
    // ceil(24 / 4) = 6 > 3 events.
    expect(settlement.estimatedCompletionTokens).toBe(6);

    // Never fewer tokens than output events: one character an event is still a token each.
    const short = started({ charsPerToken: 4 });
    feed(short, [[3, delta('a')], [4, delta('b')], [5, delta('c')]]);
    short.clientCancelled(6);
    expect(short.settle(7).estimatedCompletionTokens).toBe(3);

    // Usage with completion tokens: counted, nothing estimated.
    const reported = started();
    feed(reported, [[3, delta('abc')], [4, finish('stop')], [5, usage(3, 1)], [6, '[DONE]']]);
    expect(reported.settle(7)).toMatchObject({ relayed: { outputEvents: 1, outputChars: 3 }, estimatedCompletionTokens: undefined });
  });

  it('counts what the answering attempt relayed after a retry, and estimates nothing for a replay', () => {
    const ledger = started();
    feed(ledger, [[3, errorEvent(503)]]);
    ledger.startAttempt(4, 'u1');
    ledger.responseStarted(5, 200);
    feed(ledger, [[6, delta('abcdefgh')]]);
    ledger.streamEnded(7, 'reset');
    expect(ledger.settle(8)).toMatchObject({ relayed: { outputEvents: 1, outputChars: 8 }, estimatedCompletionTokens: 2 });

    // A stored response replayed was counted when it was generated.
    const replay = started({ route: 'responses_retrieve' });
    feed(replay, [[3, delta('abcdefgh')]]);
    replay.clientCancelled(4);
    expect(replay.settle(5)).toMatchObject({ relayed: { outputEvents: 1 }, estimatedCompletionTokens: undefined });
  });
});

describe('settle: a request the gateway answered itself (http/answers.ts), from a record without attempts', () => {
  it('a refusal is counted by its status: rejected below 500 (429 failing the SLO), failed from 500', () => {
    const settleWith = (status: number) => settle(rejectedRecord(info(), 0, status), info(), 5);
    expect(settleWith(400)).toMatchObject({ outcome: 'rejected', code: 400, attempts: [], slo: 'excluded', durationMs: 5 });
    expect(settleWith(429)).toMatchObject({ outcome: 'rejected', code: 429, slo: 'failed' });
    expect(settleWith(503)).toMatchObject({ outcome: 'failed', code: 503, slo: 'failed' });
  });

  it('a client that left before the answer: client_cancelled, 499, at the time it left', () => {
    expect(settle(cancelledRecord(info(), 0, 3), info(), 9)).toMatchObject({ outcome: 'client_cancelled', code: 499, cancelPhase: 'before_first_token', durationMs: 3 });
  });

  it('is what the ledger settles to for the same facts, and leaves the record as it was', () => {
    const ledger = new RequestLedger(info(), 0);
    ledger.reject(413);
    const record = rejectedRecord(info(), 0, 413);
    const before = structuredClone(record);
    expect(settle(record, info(), 4)).toEqual(ledger.settle(4));
    expect(record).toEqual(before);
  });
});
