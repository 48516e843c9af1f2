/**
 * The bench's workloads, shared by bench/proxy.ts (every row, one after another) and bench/ab.ts (two builds in
 * alternating rounds), so an A/B run of a scenario is the same workload as the full run's.
 */

/**
 * Extra rows beside direct, `waybill` (the default configuration) and nginx: `lean` a second gateway with request
 * logs off and level warn (the configuration of the figures before issue 15), `otel` a second gateway with the
 * default configuration and tracing on to a collector that is down, `contract` the `waybill` process again with
 * requests that ask for an output contract, `workers` a gateway with `--workers 2` on the same core, `turnsOff` a
 * gateway with `streaming.turn_budget: 0ms` (answering streams never yield).
 */
export type Variant = 'lean' | 'otel' | 'contract' | 'workers' | 'turnsOff';

export interface Scenario {
  name: string;
  concurrency: number;
  itlMs: number;
  ttftMs: number;
  /** Output tokens per request (one per event); `--tokens` overrides it but where `measuresRequests`. */
  tokens: number;
  /** false: non-streaming completions; the TTFT columns then hold whole-request latency. */
  stream: boolean;
  variants: Variant[];
  /** Part of the default set (the scenarios issue 15's targets need, and `req` for the cost per request). */
  byDefault: boolean;
  /** Paced streaming windows that go into the a × requests + b × events fit (bench/proxy/fit.ts). */
  fit: boolean;
  /** Read RSS per in-flight stream, after full GCs, before the windows (rssProbe). */
  rssProbe: boolean;
  note: string;
}

export const SCENARIOS: Scenario[] = [
  { name: 'c1', concurrency: 1, itlMs: 10, ttftMs: 20, tokens: 200, stream: true, variants: [], byDefault: false, fit: false, rssProbe: false, note: '1 stream × 200 tokens, 10 ms apart' },
  { name: 'c64s', concurrency: 64, itlMs: 10, ttftMs: 20, tokens: 64, stream: true, variants: ['lean', 'otel', 'workers'], byDefault: true, fit: true, rssProbe: false, note: '64 streams × 64 tokens, 10 ms apart' },
  { name: 'c256s', concurrency: 256, itlMs: 20, ttftMs: 20, tokens: 64, stream: true, variants: ['lean', 'otel'], byDefault: true, fit: true, rssProbe: true, note: '256 streams × 64 tokens, 20 ms apart' },
  // The sweep of bench/proxy/sustained.ts: the most streams one core sustains at a 20 ms pace, with c256s.
  { name: 'c384s', concurrency: 384, itlMs: 20, ttftMs: 20, tokens: 64, stream: true, variants: [], byDefault: false, fit: false, rssProbe: false, note: '384 streams × 64 tokens, 20 ms apart' },
  { name: 'c512s', concurrency: 512, itlMs: 20, ttftMs: 20, tokens: 64, stream: true, variants: [], byDefault: false, fit: false, rssProbe: false, note: '512 streams × 64 tokens, 20 ms apart' },
  { name: 'c768s', concurrency: 768, itlMs: 20, ttftMs: 20, tokens: 64, stream: true, variants: [], byDefault: false, fit: false, rssProbe: false, note: '768 streams × 64 tokens, 20 ms apart' },
  { name: 'c64', concurrency: 64, itlMs: 10, ttftMs: 20, tokens: 200, stream: true, variants: ['lean', 'otel', 'contract'], byDefault: true, fit: true, rssProbe: false, note: '64 streams × 200 tokens, 10 ms apart' },
  { name: 'c256', concurrency: 256, itlMs: 20, ttftMs: 20, tokens: 200, stream: true, variants: ['lean'], byDefault: false, fit: true, rssProbe: true, note: '256 streams × 200 tokens, 20 ms apart' },
  { name: 'max', concurrency: 64, itlMs: 0, ttftMs: 0, tokens: 200, stream: true, variants: ['lean', 'contract', 'workers', 'turnsOff'], byDefault: true, fit: false, rssProbe: false, note: '64 streams × 200 tokens, no delay (saturation)' },
  // Answered after 50 ms, ~1,300 requests/s: the gateway stays below saturation at a few hundred µs per request.
  { name: 'req', concurrency: 64, itlMs: 10, ttftMs: 50, tokens: 1, stream: false, variants: ['lean', 'otel'], byDefault: true, fit: false, rssProbe: false, note: '64 concurrent non-streaming completions, max_tokens 1, answered after 50 ms' },
  // The same, streamed: what a streamed request costs beyond its events (its head, its end, its settlement), which a
  // 64-token stream spreads over 66 events. Not in the default set; bench/ab.js --scenario reqs.
  { name: 'reqs', concurrency: 64, itlMs: 10, ttftMs: 50, tokens: 1, stream: true, variants: [], byDefault: false, fit: false, rssProbe: false, note: '64 concurrent streamed completions, max_tokens 1, answered after 50 ms' },
];

/**
 * Whether `scenario` measures a request rather than its events: non-streaming, or streamed answers of one token
 * (`reqs`), whose length `--tokens` leaves alone and whose cost bench/ab.js reports per request.
 */
export function measuresRequests(scenario: Scenario): boolean {
  return !scenario.stream || scenario.tokens === 1;
}

/** The events of a streamed answer of `tokens` tokens, one per event: the role chunk, the tokens, and `data: [DONE]`. */
export function eventsPerAnswer(tokens: number): number {
  return tokens + 2;
}

/** The chat completion every scenario sends: `max_tokens` answers of one token per event. */
export function requestBody(outputTokens: number, contract = false, stream = true): Buffer {
  return Buffer.from(
    JSON.stringify({
      model: 'sim-model',
      stream,
      max_tokens: outputTokens,
      messages: [{ role: 'user', content: 'Benchmark prompt: tell me about waybills.' }],
      // An output contract: every event is then parsed whole and the answer assembled and checked at the end.
      ...(contract ? { response_format: { type: 'json_object' } } : {}),
    }),
  );
}
