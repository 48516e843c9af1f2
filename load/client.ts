/**
 * One request as a client sees it: status, whether the answer was delivered complete (every finish_reason,
 * `[DONE]`, no error event), TTFT on the first output-bearing event, the gaps between output events, TPOT,
 * end-to-end time, usage, and what Waybill's own error events say. Reuses Waybill's framer and classifier.
 */
import { request, type Dispatcher } from 'undici';
import type { CancelPhase, FinishReason, Outcome } from '../src/accounting/outcomes.js';
import { finishReasonLabel } from '../src/accounting/outcomes.js';
import { classifyEventData, classifyJson, type EventFacts, type Usage } from '../src/sse/classify.js';
import { createFramer } from '../src/sse/framer.js';
import { promptText, type PlannedRequest } from './workload.js';

export interface RequestResult {
  readonly plan: PlannedRequest;
  /** Milliseconds since the run started. */
  readonly startedAt: number;
  readonly status: number | undefined;
  /** The outcome and code as the client can tell them (Waybill's labels). */
  readonly outcome: Outcome;
  readonly code: number;
  readonly cancelPhase: CancelPhase | undefined;
  readonly ttftMs: number | undefined;
  readonly tpotMs: number | undefined;
  readonly e2eMs: number;
  readonly itlMs: readonly number[];
  readonly outputEvents: number;
  readonly usage: Usage | undefined;
  /** One per expected choice, when a response was committed (status 200). */
  readonly finishReasons: readonly FinishReason[];
  /** A problem the client saw that no outcome explains (a bug to report), e.g. `[DONE]` without every finish. */
  readonly anomaly: string | undefined;
  /** A transport error message, when the request failed below HTTP. */
  readonly error: string | undefined;
}

export interface ClientOptions {
  readonly baseUrl: string;
  readonly model: string;
  readonly apiKey: string | undefined;
  readonly dispatcher: Dispatcher;
  readonly runStart: number;
  readonly timeoutMs: number;
}

function body(plan: PlannedRequest, model: string): string {
  const prompt = promptText(plan.promptTokens, plan.index);
  const common = { model, max_tokens: plan.maxTokens, n: plan.n, stream: plan.stream };
  const options = plan.includeUsage ? { stream_options: { include_usage: true } } : {};
  return JSON.stringify(
    plan.route === 'chat_completions'
      ? { ...common, ...options, messages: [{ role: 'user', content: prompt }] }
      : { ...common, ...options, prompt },
  );
}

const PATHS = { chat_completions: '/v1/chat/completions', completions: '/v1/completions' } as const;

/** Waybill's own error events after commit carry a string code naming the cause; an upstream's carries a number. */
const GATEWAY_STREAM_CODES: Record<string, Outcome> = { stream_truncated: 'incomplete', stream_timeout: 'timeout' };

function gatewayStreamOutcome(data: string): Outcome | undefined {
  try {
    const code = (JSON.parse(data) as { error?: { code?: unknown } }).error?.code;
    return typeof code === 'string' ? GATEWAY_STREAM_CODES[code] : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The outcome of an error status, as Waybill counts it: a 504 is `timeout` only when Waybill's own deadline fired
 * (its body says `upstream_timeout`); an upstream's error event with code 504, passed through, is `failed`.
 */
export function statusOutcome(status: number, body: string): Outcome {
  if (status < 500) return 'rejected';
  if (status !== 504) return 'failed';
  try {
    return (JSON.parse(body) as { error?: { code?: unknown } }).error?.code === 'upstream_timeout' ? 'timeout' : 'failed';
  } catch {
    return 'failed';
  }
}

export async function runRequest(plan: PlannedRequest, options: ClientOptions): Promise<RequestResult> {
  const started = performance.now();
  const abort = new AbortController();
  // One prompt per request: n choices.
  const expected = plan.n;
  const finishes = new Map<number, string>();
  const itl: number[] = [];
  let firstOutputAt: number | undefined;
  let lastOutputAt: number | undefined;
  let outputEvents = 0;
  let doneSeen = false;
  let errorFacts: Extract<EventFacts, { kind: 'error' }> | undefined;
  /** Waybill's own error event after commit: its string code names the cause. */
  let gatewayEnding: Outcome | undefined;
  let usage: Usage | undefined;
  let status: number | undefined;
  let cancelled = false;
  let anomaly: string | undefined;
  let error: string | undefined;
  let doneAt: number | undefined;
  let errorBody = '';

  const cancel = plan.cancel;
  let cancelTimer: NodeJS.Timeout | undefined;
  if (cancel?.phase === 'before_first_token') {
    cancelTimer = setTimeout(() => {
      cancelled = true;
      abort.abort();
    }, cancel.afterMs);
  }
  const deadline = setTimeout(() => abort.abort(), options.timeoutMs);

  const onFacts = (facts: EventFacts, at: number) => {
    switch (facts.kind) {
      case 'done':
        doneSeen = true;
        doneAt = at;
        return;
      case 'error':
        errorFacts = facts;
        return;
      case 'malformed':
        anomaly ??= 'malformed event reached the client';
        return;
      case 'chunk':
        for (const f of facts.finishes) if (!finishes.has(f.index)) finishes.set(f.index, f.reason);
        if (facts.usage !== undefined) usage = facts.usage;
        if (facts.output.length > 0) {
          outputEvents++;
          if (lastOutputAt !== undefined) itl.push(at - lastOutputAt);
          firstOutputAt ??= at;
          lastOutputAt = at;
          if (cancel?.phase === 'streaming' && outputEvents >= cancel.afterEvents && !cancelled) {
            cancelled = true;
            abort.abort();
          }
        }
        return;
    }
  };

  try {
    const headers: Record<string, string> = { 'content-type': 'application/json', 'x-request-id': `load-${plan.index}` };
    if (plan.simHeader !== undefined) headers['x-sim-fault'] = plan.simHeader;
    if (options.apiKey !== undefined) headers['authorization'] = `Bearer ${options.apiKey}`;
    const response = await request(`${options.baseUrl}${PATHS[plan.route]}`, {
      method: 'POST',
      headers,
      body: body(plan, options.model),
      signal: abort.signal,
      dispatcher: options.dispatcher,
    });
    status = response.statusCode;
    const isStream = String(response.headers['content-type'] ?? '').startsWith('text/event-stream');
    if (status === 200 && isStream) {
      const framer = createFramer({
        onBlock: (_raw, event) => {
          if (event === null) return;
          const facts = classifyEventData(event.data);
          if (facts.kind === 'error') gatewayEnding = gatewayStreamOutcome(event.data);
          onFacts(facts, performance.now());
        },
        onOversized: () => (anomaly ??= 'oversized event reached the client'),
      });
      for await (const chunk of response.body) framer.feed(chunk as Buffer);
      framer.end();
    } else {
      const text = await response.body.text();
      errorBody = text;
      const at = performance.now();
      if (status === 200) {
        let facts: EventFacts;
        try {
          facts = classifyJson(JSON.parse(text));
        } catch {
          facts = { kind: 'malformed' };
        }
        onFacts(facts, at);
        if (facts.kind === 'chunk') doneSeen = true;
      }
    }
  } catch (err) {
    if (!cancelled) error = (err as Error).message;
  } finally {
    clearTimeout(cancelTimer);
    clearTimeout(deadline);
  }
  const ended = performance.now();

  let outcome: Outcome;
  let code = status ?? 0;
  let cancelPhase: CancelPhase | undefined;
  const allFinished = [...Array(expected).keys()].every((i) => finishes.has(i));
  if (cancelled && !(doneSeen && plan.stream)) {
    outcome = 'client_cancelled';
    cancelPhase = firstOutputAt === undefined ? 'before_first_token' : 'streaming';
    code = status === undefined ? 499 : status;
  } else if (status === undefined) {
    outcome = 'failed';
    anomaly ??= `no response: ${error ?? 'unknown'}`;
  } else if (status !== 200) {
    outcome = statusOutcome(status, errorBody);
  } else if (!plan.stream) {
    outcome = allFinished ? 'delivered' : 'incomplete';
  } else if (doneSeen) {
    outcome = 'delivered';
    if (!allFinished) anomaly ??= '[DONE] arrived without a finish_reason for every choice';
    if (errorFacts !== undefined) anomaly ??= '[DONE] arrived after an error event';
  } else if (errorFacts !== undefined) {
    outcome = gatewayEnding ?? 'stream_error';
  } else {
    outcome = 'incomplete';
    anomaly ??= 'the stream ended with neither [DONE] nor an error event';
  }

  const perChoice = usage?.completionTokens !== undefined ? usage.completionTokens / Math.max(1, expected) : undefined;
  const tpotMs =
    outcome === 'delivered' && plan.stream && firstOutputAt !== undefined && lastOutputAt !== undefined && perChoice !== undefined && perChoice >= 2
      ? (lastOutputAt - firstOutputAt) / (perChoice - 1)
      : undefined;
  const committed = status === 200;
  return {
    plan,
    startedAt: started - options.runStart,
    status,
    outcome,
    code,
    cancelPhase,
    ttftMs: plan.stream && firstOutputAt !== undefined ? firstOutputAt - started : undefined,
    tpotMs,
    e2eMs: (doneAt ?? ended) - started,
    itlMs: itl,
    outputEvents,
    usage,
    finishReasons: committed ? [...Array(expected).keys()].map((i) => finishReasonLabel(finishes.get(i))) : [],
    anomaly,
    error,
  };
}
