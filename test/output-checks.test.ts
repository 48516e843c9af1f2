/**
 * The output contract over real sockets: a scripted upstream streams real vLLM-shaped payloads (valid, invalid,
 * truncated, fenced, tool calls with bad arguments) through the gateway, and the verdicts are read back from
 * /metrics by value — HTTP 2xx ⊇ delivered ⊇ accepted over one denominator — and from the settlement.
 */
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { GatewayMetrics } from '../src/telemetry/metrics.js';
import { ObserverGuard } from '../src/telemetry/guard.js';
import { NO_TRACE } from '../src/telemetry/request-trace.js';
import { createSettlementRecorder } from '../src/telemetry/settlement.js';
import { useCleanups } from './helpers/cleanups.js';
import { startScripted, wire } from './helpers/scripted.js';
import { CHAT, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const chunk = (choice: Record<string, unknown>) =>
  `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'sim-model', choices: [{ index: 0, logprobs: null, finish_reason: null, ...choice }] })}\n\n`;
const usage = `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'sim-model', choices: [], usage: { prompt_tokens: 5, completion_tokens: 9 } })}\n\n`;

/** A stream of `text` cut into pieces of `size` characters, finished with `reason`. */
function contentStream(text: string, reason = 'stop', size = 3): string {
  let out = wire.role;
  for (let i = 0; i < text.length; i += size) out += wire.content(text.slice(i, i + size));
  return out + chunk({ delta: {}, finish_reason: reason }) + usage + wire.done;
}

function toolStream(name: string, args: string): string {
  return (
    wire.role +
    chunk({ delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name, arguments: '' } }] } }) +
    [...args.matchAll(/.{1,4}/gs)].map((m) => chunk({ delta: { tool_calls: [{ index: 0, function: { arguments: m[0] } }] } })).join('') +
    chunk({ delta: {}, finish_reason: 'tool_calls' }) +
    usage +
    wire.done
  );
}

const PERSON = {
  type: 'object',
  properties: { name: { type: 'string' }, age: { type: 'integer', minimum: 0 } },
  required: ['name', 'age'],
};
const SCHEMA_BODY = { response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON } } };
const TOOLS_BODY = {
  tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }],
};

/** What the scripted upstream streams for each case (chosen by the x-case header). */
const CASES: Record<string, string> = {
  valid_schema: contentStream('{"name": "Ada", "age": 36}'),
  invalid_schema: contentStream('{"name": "Ada", "age": "thirty-six"}'),
  not_json: contentStream('Sure! Here is the person: Ada, 36.'),
  fenced: contentStream('```json\n{"name": "Ada", "age": 36}\n```'),
  truncated: contentStream('{"name": "Ada", "ag', 'length'),
  whole_but_length: contentStream('{"name": "Ada", "age": 36}', 'length'),
  empty: wire.role + chunk({ delta: {}, finish_reason: 'stop' }) + usage + wire.done,
  reasoning_only: wire.role + chunk({ delta: { reasoning_content: 'Let me think' } }) + chunk({ delta: {}, finish_reason: 'stop' }) + usage + wire.done,
  plain: contentStream('Hello there, how can I help?'),
  good_tool: toolStream('get_weather', '{"city": "Oslo"}'),
  bad_tool_args: toolStream('get_weather', '{"city": "Oslo"'),
  unknown_tool: toolStream('get_time', '{}'),
  stream_error: wire.role + wire.content('{"na') + wire.errorEvent(500) + wire.done,
};

const NON_STREAM: Record<string, unknown> = {
  valid_schema: { content: '{"name":"Ada","age":36}', finish_reason: 'stop' },
  invalid_schema: { content: '{"name":"Ada"}', finish_reason: 'stop' },
};

async function gateway(config: Record<string, unknown> = {}): Promise<Stack> {
  const upstream = await startScripted((req, res) => {
    const name = String(req.headers['x-case']);
    if (req.headers['accept'] === 'application/json') {
      const message = NON_STREAM[name] as { content: string; finish_reason: string };
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id: 'c',
          object: 'chat.completion',
          created: 1,
          model: 'sim-model',
          choices: [{ index: 0, message: { role: 'assistant', content: message.content }, finish_reason: message.finish_reason }],
          usage: { prompt_tokens: 5, completion_tokens: 7 },
        }),
      );
      return;
    }
    res.writeHead(200, wire.sse);
    res.end(CASES[name]);
  });
  cleanups.push(() => upstream.close());
  const stack = await startStack({
    sims: 0,
    extraUpstreams: [{ name: 'scripted', url: upstream.url }],
    config: { health: { interval: '1h', timeout: '200ms' }, ...config },
  });
  cleanups.push(() => stack.close());
  return stack;
}

async function send(stack: Stack, name: string, extra: Record<string, unknown>, stream = true, headers: Record<string, string> = {}) {
  const count = stack.settlements.length + 1;
  const result = await post(stack.base, '/v1/chat/completions', { ...CHAT, stream, ...extra }, { 'x-case': name, ...headers });
  const [settlement] = (await stack.settled(count)).slice(-1);
  return { result, settlement: settlement as Settlement };
}

const checks = (s: Settlement) => s.checks[0];

describe('output checks on streamed answers', () => {
  it.each([
    ['valid_schema', SCHEMA_BODY, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'pass' }, true],
    ['invalid_schema', SCHEMA_BODY, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'fail' }, false],
    ['not_json', { response_format: { type: 'json_object' } }, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'fail' }, false],
    ['fenced', SCHEMA_BODY, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'fail' }, false],
    ['truncated', SCHEMA_BODY, { answer_present: 'pass', not_truncated: 'fail', format_valid: 'fail' }, false],
    ['empty', {}, { answer_present: 'fail', not_truncated: 'pass', format_valid: 'unevaluated' }, false],
    ['reasoning_only', {}, { answer_present: 'fail', not_truncated: 'pass', format_valid: 'unevaluated' }, false],
    ['plain', {}, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'unevaluated' }, true],
    ['good_tool', TOOLS_BODY, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'pass' }, true],
    ['bad_tool_args', TOOLS_BODY, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'fail' }, false],
    ['unknown_tool', TOOLS_BODY, { answer_present: 'pass', not_truncated: 'pass', format_valid: 'fail' }, false],
  ] as const)('%s: delivered, checks %o', async (name, body, expected, accepted) => {
    const stack = await gateway();
    const { result, settlement } = await send(stack, name, body);
    // The client gets the upstream's bytes whatever the verdict: checks observe, they never change delivery.
    expect(result.status).toBe(200);
    expect(result.body).toContain('data: [DONE]');
    expect(settlement.outcome).toBe('delivered');
    expect(checks(settlement)).toEqual(expected);
    expect(settlement.accepted).toBe(accepted);
    expect(settlement.failedChecks).toEqual(Object.entries(expected).filter(([, r]) => r === 'fail').map(([c]) => c));
    for (const [check, result] of Object.entries(expected)) {
      expect(await stack.metric('waybill_output_checks_total', { model: 'sim-model', check, result }), check).toBe(1);
    }
    expect(await stack.metric('waybill_requests_accepted_total', { model: 'sim-model' })).toBe(accepted ? 1 : 0);
  });

  it('a stream that fails after commit is not delivered: no checks are counted, and it is not accepted', async () => {
    const stack = await gateway();
    const { settlement } = await send(stack, 'stream_error', SCHEMA_BODY);
    expect(settlement.outcome).toBe('stream_error');
    expect(settlement.checks).toEqual([]);
    expect(settlement.accepted).toBe(false);
    expect(await stack.metric('waybill_output_checks_total')).toBe(0);
  });

  it('non-stream answers are checked the same way', async () => {
    const stack = await gateway();
    const good = await send(stack, 'valid_schema', SCHEMA_BODY, false);
    expect(good.result.status).toBe(200);
    expect(checks(good.settlement)).toEqual({ answer_present: 'pass', not_truncated: 'pass', format_valid: 'pass' });
    const bad = await send(stack, 'invalid_schema', SCHEMA_BODY, false);
    expect(checks(bad.settlement)?.format_valid).toBe('fail');
    expect(await stack.metric('waybill_requests_accepted_total', { stream: 'false' })).toBe(1);
  });

  it('the funnel over one denominator: 2xx ⊇ delivered ⊇ accepted', async () => {
    const stack = await gateway();
    for (const name of ['valid_schema', 'invalid_schema', 'truncated', 'stream_error', 'plain']) await send(stack, name, SCHEMA_BODY);
    const all = await stack.metric('waybill_requests_total', { model: 'sim-model' });
    const ok = await stack.metric('waybill_requests_total', { model: 'sim-model', code: '200' });
    const delivered = await stack.metric('waybill_requests_total', { model: 'sim-model', outcome: 'delivered' });
    const accepted = await stack.metric('waybill_requests_accepted_total', { model: 'sim-model' });
    // plain: content that is not JSON, under a schema contract → format fail.
    expect([all, ok, delivered, accepted]).toEqual([5, 5, 4, 1]);
  });

  it('past max_output_chars the format check is unevaluated, and the answer still accepted', async () => {
    const stack = await gateway({ output_checks: { max_output_chars: 10 } });
    const { settlement } = await send(stack, 'invalid_schema', SCHEMA_BODY);
    expect(checks(settlement)).toEqual({ answer_present: 'pass', not_truncated: 'pass', format_valid: 'unevaluated' });
    expect(settlement.accepted).toBe(true);
  });
});

describe('the evaluation cohort: accepted among evaluated', () => {
  it('an answer over the cap is accepted but outside the cohort; coverage and accepted-among-evaluated have their own denominators', async () => {
    // 330: the valid answer's 26 characters in 9 pieces (32 each of overhead) fit; the plain answer's 28 in 10 do not.
    const stack = await gateway({ output_checks: { max_output_chars: 330 } });
    // Evaluated and accepted; evaluated and not accepted; a schema applies but the answer is over the cap.
    expect((await send(stack, 'valid_schema', SCHEMA_BODY)).settlement.verdict).toBe('accepted');
    expect((await send(stack, 'empty', SCHEMA_BODY)).settlement.verdict).toBe('not_accepted');
    const over = await send(stack, 'plain', { response_format: { type: 'json_object' } });
    // No contract asked for: format_valid does not apply, so the request is evaluated (and accepted).
    expect((await send(stack, 'plain', {})).settlement.verdict).toBe('accepted');
    expect(over.settlement.accepted).toBe(true);
    expect(over.settlement.verdict).toBe('unevaluated');
    const checked = (verdict: string) => stack.metric('waybill_requests_checked_total', { model: 'sim-model', verdict });
    expect([await checked('accepted'), await checked('not_accepted'), await checked('unevaluated')]).toEqual([2, 1, 1]);
    // The old counter still reads the over-cap answer as accepted: only the cohort tells it apart.
    expect(await stack.metric('waybill_requests_accepted_total', { model: 'sim-model' })).toBe(3);
  });

  it('a schema that does not compile leaves the request unevaluated, even beside a certain failure', async () => {
    const stack = await gateway();
    const body = { response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { $async: true, type: 'object' } } } };
    const { settlement } = await send(stack, 'valid_schema', body);
    expect(checks(settlement)?.format_valid).toBe('unevaluated');
    expect(settlement.verdict).toBe('unevaluated');
    // Cut at `length` (certain failure), its JSON whole but its schema not compiled: still outside the cohort.
    const truncated = await send(stack, 'whole_but_length', body);
    expect(truncated.settlement.accepted).toBe(false);
    expect(truncated.settlement.verdict).toBe('unevaluated');
  });
});

describe('evaluator traffic and evaluation samples', () => {
  it('evaluator traffic is carried in the settlement, never sampled, and counted apart from users\' answers', async () => {
    const stack = await gateway({ evaluation: { evaluator_header: 'X-Waybill-Evaluator', sample_rate: 1 } });
    const marked = await send(stack, 'valid_schema', SCHEMA_BODY, true, { 'x-waybill-evaluator': 'nightly' });
    expect(marked.settlement.evaluator).toBe(true);
    expect(marked.settlement.accepted).toBe(true);
    const user = await send(stack, 'invalid_schema', SCHEMA_BODY);
    expect(user.settlement.evaluator).toBe(false);
    // Only the user's request is sampled, checked and counted in the acceptance counters.
    expect(await stack.metric('waybill_evaluation_samples_total', { model: 'sim-model' })).toBe(1);
    expect(await stack.metric('waybill_requests_accepted_total', { model: 'sim-model' })).toBe(0);
    expect(await stack.metric('waybill_output_checks_total', { model: 'sim-model', check: 'format_valid' })).toBe(1);
    expect(await stack.metric('waybill_output_checks_total', { model: 'sim-model', check: 'format_valid', result: 'fail' })).toBe(1);
    expect(await stack.metric('waybill_requests_checked_total', { model: 'sim-model' })).toBe(1);
    // The evaluator's calls, tokens and latency, apart; both requests are still requests.
    expect(await stack.metric('waybill_evaluator_requests_total', { model: 'sim-model', outcome: 'delivered' })).toBe(1);
    expect(await stack.metric('waybill_evaluator_tokens_total', { model: 'sim-model', kind: 'prompt' })).toBe(5);
    expect(await stack.metric('waybill_evaluator_tokens_total', { model: 'sim-model', kind: 'completion' })).toBe(9);
    expect(await stack.metric('waybill_evaluator_request_duration_seconds_count', { model: 'sim-model' })).toBe(1);
    expect(await stack.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(2);
    expect(await stack.metric('waybill_slo_requests_total', { result: 'excluded' })).toBe(1);
  });

  it('an evaluator request that fails is an evaluator error, by outcome', async () => {
    const stack = await gateway({ evaluation: { evaluator_header: 'X-Waybill-Evaluator' } });
    await send(stack, 'stream_error', {}, true, { 'x-waybill-evaluator': '1' });
    expect(await stack.metric('waybill_evaluator_requests_total', { model: 'sim-model', outcome: 'stream_error' })).toBe(1);
    expect(await stack.metric('waybill_evaluator_requests_total', { outcome: 'delivered' })).toBe(0);
  });

  it('the last sample\'s wall-clock time is exported', async () => {
    const before = Date.now() / 1000;
    const stack = await gateway({ evaluation: { sample_rate: 1 } });
    await send(stack, 'plain', {});
    const at = await stack.metric('waybill_evaluation_last_sample_timestamp_seconds', { model: 'sim-model' });
    expect(at).toBeGreaterThanOrEqual(Math.floor(before));
    expect(at).toBeLessThanOrEqual(Date.now() / 1000);
  });

  it('evaluator traffic is counted everywhere but excluded from the SLO', async () => {
    const stack = await gateway({ evaluation: { evaluator_header: 'X-Waybill-Evaluator' } });
    const marked = await send(stack, 'plain', {}, true, { 'x-waybill-evaluator': 'nightly' });
    expect(marked.settlement.outcome).toBe('delivered');
    expect(marked.settlement.slo).toBe('excluded');
    const plain = await send(stack, 'plain', {});
    expect(plain.settlement.slo).toBe('met');
    expect(await stack.metric('waybill_slo_requests_total', { result: 'excluded' })).toBe(1);
    expect(await stack.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(2);
  });

  it('with sample_rate 1 every delivered response is sampled and counted', async () => {
    const stack = await gateway({ evaluation: { sample_rate: 1 } });
    await send(stack, 'plain', {});
    await send(stack, 'stream_error', {});
    expect(await stack.metric('waybill_evaluation_samples_total', { model: 'sim-model' })).toBe(1);
  });
});

describe('the sample record', () => {
  /** Publishes one settlement through the real recorder with a logger writing to memory. */
  function publishWith(settlement: Settlement, requestId: string, captureContent: boolean): Array<Record<string, unknown>> {
    const lines: Array<Record<string, unknown>> = [];
    const sink = new Writable({
      write(chunk: Buffer, _encoding, done) {
        lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
        done();
      },
    });
    const logger = pino({ level: 'info' }, sink);
    const metrics = new GatewayMetrics({ ttft: [1], itl: [1], tpot: [1], duration: [1], queueWait: [1] }, { defaultMetrics: false });
    const guard = new ObserverGuard(() => undefined);
    const publish = createSettlementRecorder({ metrics, logger, guard, logRequests: true, evaluation: { sampleRate: 1, models: {}, captureContent } });
    publish(settlement, requestId, NO_TRACE, undefined, 0);
    return lines;
  }

  it('carries the probability, checks and finish reasons, and content only when captured', async () => {
    const stack = await gateway({ evaluation: { sample_rate: 1, capture_content: true } });
    const { settlement } = await send(stack, 'valid_schema', SCHEMA_BODY);
    expect(settlement.answerText).toEqual(['{"name": "Ada", "age": 36}']);

    const without = publishWith(settlement, 'req-1', false);
    const sample = without.find((l) => l['msg'] === 'evaluation sample')?.['evaluation_sample'] as Record<string, unknown>;
    expect(sample).toMatchObject({ request_id: 'req-1', model: 'sim-model', inclusion_probability: 1, accepted: true, verdict: 'accepted', finish_reasons: ['stop'] });
    expect(sample['checks']).toEqual([{ answer_present: 'pass', not_truncated: 'pass', format_valid: 'pass' }]);
    expect(sample).not.toHaveProperty('answers');
    const line = without.find((l) => l['msg'] === 'request');
    expect(line).toMatchObject({ accepted: true, checks_failed: [], format_valid: 'pass', evaluation_sample: 1 });
    expect(JSON.stringify(without)).not.toContain('Ada');

    const withContent = publishWith(settlement, 'req-1', true);
    const captured = withContent.find((l) => l['msg'] === 'evaluation sample')?.['evaluation_sample'] as Record<string, unknown>;
    expect(captured['answers']).toEqual(['{"name": "Ada", "age": 36}']);
    // The wide line stays content-free whatever the sample carries.
    expect(JSON.stringify(withContent.find((l) => l['msg'] === 'request'))).not.toContain('Ada');
  });
});
