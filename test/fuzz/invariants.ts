/**
 * The invariants every fuzz case must keep, whatever the upstream sent and however the client behaved. Each check
 * returns violations (never throws), so one case can report all that it broke.
 *
 *  answered_in_time      every client that stays gets a complete HTTP response within the total deadline + margin
 *                        (a connection the gateway closes while the request is still being sent counts as an answer:
 *                        that is a refusal, e.g. Node's 431 for huge headers);
 *  stream_terminated     a 200 to a streamed request (`"stream": true`) is an event stream whose body ends with
 *                        `data: [DONE]` or an error event (no truncated tail);
 *  counted_once          settlements and the sum of waybill_requests_total both equal the requests sent (a request
 *                        is sent once its head was written), and no request id settles twice;
 *  metrics_sane          every counter and histogram sample is finite and non-negative, every `_total`, `_count`
 *                        and `_bucket` is an integer; gauges are finite and non-negative;
 *  finish_reasons_bounded  finish reasons counted for a request <= its choices (n × prompts; 0 if n is invalid), per
 *                        settlement and in waybill_choice_finish_reasons_total;
 *  done_iff_delivered    `[DONE]` reaches the client iff the request settled `delivered` (for clients that left
 *                        early only "if": they may not have read a `[DONE]` that was sent);
 *  nothing_in_flight     once every request settled, waybill_inflight_requests and the gateway's in-flight count are 0;
 *  cached_le_prompt      waybill_cached_prompt_tokens_total <= waybill_prompt_tokens_total (a cache hit is part of the
 *                        prompt);
 *  rss_bounded           (per run, see harness.ts) the process RSS grows by less than the stated limit.
 */
import type { Settlement } from '../../src/accounting/ledger.js';
import { asksStream, expectedChoices, type ClientPlan } from './client-grammar.js';
import type { ClientObservation } from './raw-client.js';

export const INVARIANTS = [
  'answered_in_time',
  'stream_terminated',
  'counted_once',
  'metrics_sane',
  'finish_reasons_bounded',
  'done_iff_delivered',
  'nothing_in_flight',
  'cached_le_prompt',
  'rss_bounded',
] as const;
export type InvariantName = (typeof INVARIANTS)[number];

export interface Violation {
  readonly invariant: InvariantName;
  /** The request it concerns, when it concerns one. */
  readonly request?: string;
  readonly detail: string;
}

// --- Prometheus text -----------------------------------------------------------------------------------------

export interface Sample {
  readonly name: string;
  readonly labels: string;
  readonly value: number;
  readonly raw: string;
  /** The family's TYPE (counter, histogram, gauge, ...), or 'untyped'. */
  readonly type: string;
}

function parseValue(text: string): number {
  if (text === '+Inf') return Number.POSITIVE_INFINITY;
  if (text === '-Inf') return Number.NEGATIVE_INFINITY;
  if (text === 'NaN') return Number.NaN;
  return text.trim() === '' ? Number.NaN : Number(text);
}

/** Samples of a Prometheus text exposition (no timestamps: prom-client writes none). */
export function parseMetrics(text: string): Sample[] {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line.startsWith('# TYPE ')) {
      const [, , name, type] = line.split(' ');
      if (name !== undefined && type !== undefined) types.set(name, type);
      continue;
    }
    if (line.startsWith('#') || line.trim() === '') continue;
    const brace = line.indexOf('{');
    const space = line.lastIndexOf(' ');
    const nameEnd = brace >= 0 && brace < space ? brace : line.indexOf(' ');
    const name = line.slice(0, nameEnd);
    const labels = brace >= 0 && brace < space ? line.slice(brace, line.lastIndexOf('}') + 1) : '';
    const raw = line.slice(space + 1);
    const family = types.has(name) ? name : name.replace(/_(bucket|sum|count)$/, '');
    samples.push({ name, labels, value: parseValue(raw), raw, type: types.get(family) ?? types.get(name) ?? 'untyped' });
  }
  return samples;
}

/** Sum of the samples named `name` (0 when absent). */
export function total(samples: readonly Sample[], name: string): number {
  let sum = 0;
  for (const s of samples) if (s.name === name) sum += s.value;
  return sum;
}

/** Checks the samples; with `before`, only those that changed since (so one bad value is reported once). */
export function checkMetrics(samples: readonly Sample[], before: readonly Sample[] = []): Violation[] {
  const violations: Violation[] = [];
  const old = new Map(before.map((s) => [`${s.name}${s.labels}`, s.raw]));
  for (const s of samples) {
    if (!s.name.startsWith('waybill_') || old.get(`${s.name}${s.labels}`) === s.raw) continue;
    const where = `${s.name}${s.labels} ${s.raw}`;
    if (!Number.isFinite(s.value)) violations.push({ invariant: 'metrics_sane', detail: `not finite: ${where}` });
    else if (s.value < 0) violations.push({ invariant: 'metrics_sane', detail: `negative: ${where}` });
    else if ((s.type === 'counter' || s.type === 'histogram') && /_(total|count|bucket)$/.test(s.name) && !Number.isInteger(s.value)) {
      violations.push({ invariant: 'metrics_sane', detail: `not an integer: ${where}` });
    }
  }
  const cached = total(samples, 'waybill_cached_prompt_tokens_total');
  const prompt = total(samples, 'waybill_prompt_tokens_total');
  const wasOver = total(before, 'waybill_cached_prompt_tokens_total') > total(before, 'waybill_prompt_tokens_total');
  if (cached > prompt && !wasOver) violations.push({ invariant: 'cached_le_prompt', detail: `waybill_cached_prompt_tokens_total ${cached} > waybill_prompt_tokens_total ${prompt}` });
  return violations;
}

// --- Client bodies -------------------------------------------------------------------------------------------

/** The data of each complete event of an SSE body (any line-end style), and the bytes after the last one. */
export function sseEvents(body: Buffer): { events: string[]; tail: string } {
  const text = body.toString('utf8').replace(/\r\n|\r/g, '\n');
  const blocks = text.split('\n\n');
  const tail = blocks.pop() ?? '';
  const events: string[] = [];
  for (const block of blocks) {
    const data = block
      .split('\n')
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(line.startsWith('data: ') ? 6 : 5));
    if (data.length > 0) events.push(data.join('\n'));
  }
  return { events, tail };
}

function isErrorEvent(data: string): boolean {
  try {
    const json = JSON.parse(data) as unknown;
    return typeof json === 'object' && json !== null && !Array.isArray(json) && 'error' in json && json.error != null;
  } catch {
    return false;
  }
}

function isEventStream(obs: ClientObservation): boolean {
  return (obs.headers['content-type'] ?? '').toLowerCase().startsWith('text/event-stream');
}

function sawDone(obs: ClientObservation): boolean {
  return obs.status === 200 && isEventStream(obs) && sseEvents(obs.body).events.includes('[DONE]');
}

/** The client's plan made it leave before its response could complete (it did not stay for an answer). */
export function clientLeft(obs: ClientObservation): boolean {
  return obs.endedBy === 'client_left';
}

// --- Per case ----------------------------------------------------------------------------------------------------

export interface RequestOutcome {
  readonly id: string;
  readonly plan: ClientPlan;
  readonly obs: ClientObservation;
  /** Every settlement published for this id (exactly one expected). */
  readonly settlements: readonly Settlement[];
}

export interface CaseFacts {
  readonly requests: readonly RequestOutcome[];
  /** Settlements published while the case ran, for any id. */
  readonly settlementCount: number;
  /** Settlements whose id is none of the case's (the gateway replaced an id, or one leaked from elsewhere). */
  readonly strangerSettlements: ReadonlyArray<{ id: string; settlement: Settlement }>;
  /** Metric samples before and after the case (after every request settled or the wait ran out). */
  readonly before: readonly Sample[];
  readonly after: readonly Sample[];
  /** Logical requests the gateway still holds after the case. */
  readonly gatewayInflight: number;
  readonly deadlineMs: number;
}

export function checkRequest(r: RequestOutcome, deadlineMs: number): Violation[] {
  const v: Violation[] = [];
  const { obs, id } = r;
  const stayed = !clientLeft(obs);
  if (stayed) {
    const refused = obs.status === undefined && obs.endedBy === 'server_closed' && !obs.requestSent;
    if (obs.endedBy === 'client_deadline') {
      v.push({
        invariant: 'answered_in_time',
        request: id,
        detail:
          obs.status === undefined
            ? `no status line within ${deadlineMs} ms`
            : `HTTP ${obs.status} after ${Math.round(obs.statusAfterMs ?? 0)} ms, but the response did not end within ${deadlineMs} ms (${obs.body.length} body bytes so far: ${tailOf(obs.body)})`,
      });
    } else if (obs.status === undefined && !refused) {
      v.push({ invariant: 'answered_in_time', request: id, detail: `the connection ended (${obs.endedBy}${obs.error ? `, ${obs.error}` : ''}) without any status line, after the whole request was sent` });
    } else if (obs.status !== undefined && !obs.complete) {
      v.push({ invariant: 'answered_in_time', request: id, detail: `HTTP ${obs.status}: the gateway closed the connection mid-response (${obs.body.length} body bytes: ${tailOf(obs.body)})` });
    }
    if (obs.status === 200 && asksStream(r.plan.body) && obs.complete && !isEventStream(obs)) {
      v.push({ invariant: 'stream_terminated', request: id, detail: `a streamed request answered 200 with content-type ${obs.headers['content-type'] ?? '(none)'}, not an event stream: ${tailOf(obs.body)}` });
    } else if (obs.status === 200 && asksStream(r.plan.body) && obs.complete) {
      const { events, tail } = sseEvents(obs.body);
      const last = events.at(-1);
      if (tail.trim() !== '') v.push({ invariant: 'stream_terminated', request: id, detail: `the stream ends inside an event: ${JSON.stringify(tail.slice(-200))}` });
      else if (last === undefined || !(last === '[DONE]' || isErrorEvent(last))) {
        v.push({ invariant: 'stream_terminated', request: id, detail: `the stream's last event is ${last === undefined ? 'missing (no events)' : JSON.stringify(last.slice(0, 200))}, not [DONE] or an error event` });
      }
    }
  }
  const settlement = r.settlements[0];
  if (r.settlements.length > 1) {
    v.push({ invariant: 'counted_once', request: id, detail: `settled ${r.settlements.length} times: ${r.settlements.map((s) => `${s.code}/${s.outcome}`).join(', ')}` });
  }
  if (settlement !== undefined) {
    const bound = expectedChoices(r.plan);
    if (settlement.finishReasons.length > bound) {
      v.push({
        invariant: 'finish_reasons_bounded',
        request: id,
        detail: `${settlement.finishReasons.length} finish reasons counted [${settlement.finishReasons.join(', ')}] for a request with ${bound} choice(s)`,
      });
    }
    const done = sawDone(obs);
    const delivered = settlement.outcome === 'delivered';
    if (done && !delivered) {
      v.push({ invariant: 'done_iff_delivered', request: id, detail: `the client got [DONE] but the request settled ${settlement.code}/${settlement.outcome}` });
    } else if (!done && delivered && settlement.stream && stayed) {
      v.push({
        invariant: 'done_iff_delivered',
        request: id,
        detail: `settled delivered, but the client got no [DONE] (HTTP ${obs.status ?? 'none'}, ${obs.headers['content-type'] ?? 'no content-type'}, ${obs.body.length} bytes: ${tailOf(obs.body)})`,
      });
    }
  }
  return v;
}

function tailOf(body: Buffer): string {
  const text = body.toString('utf8');
  return JSON.stringify(text.length > 160 ? `…${text.slice(-160)}` : text);
}

export function checkCase(facts: CaseFacts): Violation[] {
  const v: Violation[] = [];
  for (const r of facts.requests) v.push(...checkRequest(r, facts.deadlineMs));
  // A client that left before its request head was written sent no request; one whose head was written (and, in a
  // race, one that left while it was being written but got counted anyway) sent one.
  const sent = facts.requests.filter((r) => r.obs.headSent || r.settlements.length > 0).length;
  const unsettled = facts.requests.filter((r) => r.obs.headSent && r.settlements.length === 0);
  if (facts.settlementCount !== sent) {
    v.push({
      invariant: 'counted_once',
      detail: `${sent} request(s) sent, ${facts.settlementCount} settlement(s)${unsettled.length > 0 ? `; never settled: ${unsettled.map((r) => `${r.id} (client saw ${r.obs.status ?? 'no status'}, ${r.obs.endedBy})`).join(', ')}` : ''}${facts.strangerSettlements.length > 0 ? `; under ids no request had: ${facts.strangerSettlements.map((s) => `${s.id} (${s.settlement.route}, ${s.settlement.code}/${s.settlement.outcome})`).join(', ')}` : ''}`,
    });
  }
  const counted = total(facts.after, 'waybill_requests_total') - total(facts.before, 'waybill_requests_total');
  if (counted !== sent) v.push({ invariant: 'counted_once', detail: `${sent} request(s) sent, sum(waybill_requests_total) grew by ${counted}` });
  const finishes = total(facts.after, 'waybill_choice_finish_reasons_total') - total(facts.before, 'waybill_choice_finish_reasons_total');
  const bound = facts.requests.reduce((sum, r) => sum + expectedChoices(r.plan), 0);
  if (finishes > bound) {
    v.push({ invariant: 'finish_reasons_bounded', detail: `waybill_choice_finish_reasons_total grew by ${finishes}, the requests had ${bound} choice(s) in all` });
  }
  v.push(...checkMetrics(facts.after, facts.before));
  const inflight = total(facts.after, 'waybill_inflight_requests');
  if (unsettled.length === 0 && (inflight !== 0 || facts.gatewayInflight !== 0)) {
    v.push({ invariant: 'nothing_in_flight', detail: `every request settled, but waybill_inflight_requests is ${inflight} and the gateway holds ${facts.gatewayInflight}` });
  }
  return v;
}
