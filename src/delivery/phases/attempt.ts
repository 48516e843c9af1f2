/**
 * What the current attempt reports, in `attempting` (nothing sent: events are held, the first output commits) and in
 * `streaming` (committed: events are forwarded and written at the end of each upstream read), and after the response
 * is over (`ending`: the drain grace reads on, for accounting only). The record rules on each event (hold, commit,
 * forward, drop) and on how the response ends; `decide` (ending.ts) carries that out.
 */
import { currentAttempt, isExpectedChoice, recordAttemptStart, wantsParts } from '../../accounting/record.js';
import { recordBody, recordConnectFailure, recordOrdinaryOutput, recordProtocolViolation, recordStreamEnd, recordStreamEvent } from '../../accounting/record-upstream.js';
import { matchKeptTemplate } from '../../sse/fast-classify.js';
import type { SseEvent } from '../../sse/framer.js';
import type { MachineEvent } from '../machine.js';
import { arm, attemptOpen, clear, dropOut, emit, endClient, flush, forward, isArmed, observe, reportAnomalies, responseEnded, writeHead, type DeliveryState } from '../state.js';
import { classifyStreamEvent, classifyWholeBody, sseHead } from '../wire.js';
import { decide, retryNow, settleIfDone } from './ending.js';

export function attemptStarted(s: DeliveryState, attempt: number, upstream: string): void {
  if (attempt !== s.attempt) return;
  s.tried.add(upstream);
  s.held = [];
  s.heldBytes = 0;
  dropOut(s);
  s.upstream = 'reading';
  s.retryAfterMs = undefined;
  s.contentType = undefined;
  s.metadata = undefined;
  recordAttemptStart(s.record, s.at, upstream);
  // Counted when the retry is made, not when scheduled: retries_total = attempts - requests, exactly.
  if (s.retriedFor !== undefined) observe(s, { type: 'retry_made', reason: s.retriedFor });
  arm(s, 'first_output', s.deps.settings.firstOutputMs);
}

export function upstreamFact(s: DeliveryState, event: Exclude<Extract<MachineEvent, { attempt: number }>, { type: 'attempt_started' | 'attempt_settled' }>): void {
  switch (event.type) {
    case 'response_start':
      s.retryAfterMs = event.retryAfterMs;
      s.contentType = event.contentType;
      s.metadata = event.metadata;
      currentAttempt(s.record).status = event.status;
      return;
    case 'protocol_violation':
      recordProtocolViolation(s.record, s.request.info, s.at, event.violation);
      reportAnomalies(s);
      return decide(s);
    case 'block':
      block(s, event.raw, event.event);
      // The read's last block ends the read in the same step: a read of one event (vLLM's usual) is one step.
      if (event.endOfRead !== true) return;
      flush(s);
      return decide(s);
    case 'chunk_done':
      flush(s);
      return decide(s);
    case 'body':
      recordBody(s.record, s.request.info, s.at, event.status, classifyWholeBody(s.request.info.route, event.body, s.contentType, wantsParts(s.record)));
      reportAnomalies(s);
      if (s.record.ending?.kind === 'complete' && !responseEnded(s)) {
        const headers: Record<string, string | number> = { 'content-type': s.contentType ?? 'application/json', 'content-length': event.body.length };
        if (s.metadata !== undefined) headers['metadata'] = s.metadata;
        writeHead(s, 200, headers);
        return endClient(s, event.body);
      }
      return decide(s);
    case 'stream_end':
      recordStreamEnd(s.record, s.request.info, s.at, event.how);
      reportAnomalies(s);
      return decide(s);
    case 'network_failure':
      observe(s, { type: 'connect_failed', attempt: event.attempt, message: event.message });
      recordConnectFailure(s.record, s.request.info, s.at, event.failure);
      return decide(s);
  }
}

/** `data: `, the field each of vLLM's events is (one per read, ended by a blank line): its length. */
const DATA_FIELD = 6;
const LF = 0x0a;

/**
 * A committed stream's steady state, without the framer and the step (issue 27): the read `chunk` of attempt
 * `attempt` at `at` when it is exactly one ordinary delta event — `data: `, a chunk one of the stream's kept templates
 * matches (sse/stream-head.ts) with output for an expected choice, and one blank line — while the request streams
 * plainly (committed, not ending, no answer to assemble for an output contract or captureAnswer, nothing forwarded
 * and unwritten, the attempt open with neither `[DONE]` nor an error seen), on chat or legacy completions. Then the
 * state changes as `step` changes it for that read's one `block` event (endOfRead) — the record, the idle clock, the
 * inter-token gap — and the read's bytes are returned: the step's one effect would have been their write. Anything
 * else returns undefined with nothing a later step reads changed (a template matched for an unexpected choice leaves
 * its facts in the classifier's scratch, which is read within a step only), and the caller frames the read and steps
 * its events. Bytes between those of such a read cannot hold a line end (the
 * template's grammar has no whitespace and its string no raw control character), so the framer, idle between blocks,
 * would have made it one block of one data line. test/ordinary-read.property.test.ts holds both paths to equal records,
 * writes and settlements.
 */
export function ordinaryRead(s: DeliveryState, attempt: number, chunk: Buffer, at: number): Buffer | undefined {
  const rec = s.record;
  // An answer to assemble is read from parsed events, which keep no template; declined here all the same.
  if (s.phase !== 'streaming' || attempt !== s.attempt || !attemptOpen(s) || rec.ending !== undefined || rec.assembly !== undefined || s.outCount !== 0) return undefined;
  const route = s.request.info.route;
  if (route !== 'chat_completions' && route !== 'completions') return undefined;
  const n = chunk.length;
  if (n <= DATA_FIELD + 2 || n > s.deps.settings.maxEventBytes || chunk[n - 1] !== LF || chunk[n - 2] !== LF) return undefined;
  // d a t a : space
  if (chunk[0] !== 0x64 || chunk[1] !== 0x61 || chunk[2] !== 0x74 || chunk[3] !== 0x61 || chunk[4] !== 0x3a || chunk[5] !== 0x20) return undefined;
  const facts = matchKeptTemplate(chunk, DATA_FIELD, n - 2, s.factsScratch);
  if (facts === undefined || facts.kind !== 'chunk' || facts.output.length !== 1) return undefined;
  const index = facts.output[0] as number;
  const current = rec.attempts[rec.attempts.length - 1];
  if (!isExpectedChoice(s.request.info, index) || current === undefined || current.sawDone || current.error !== undefined) return undefined;
  s.effectCount = 0;
  s.at = at;
  if (isArmed(s, 'idle')) s.idleFrom = at;
  recordOrdinaryOutput(rec, current, at, index, facts.outputChars ?? 0, facts.id, facts.model);
  const gap = rec.outputGapMs;
  if (gap !== undefined) s.deps.onInterTokenGap(gap);
  return chunk;
}

function block(s: DeliveryState, raw: Buffer, event: SseEvent | null): void {
  if (event === null) {
    // Blank lines alone are not events: never held (one Buffer per blank line is how a drip of them filled memory),
    // and they do not keep the idle clock going. Comments do: they are the upstream's keep-alives.
    if (isBlankLines(raw)) {
      if ((s.record.committedAt !== undefined) && s.record.ending === undefined) forward(s, raw);
      return;
    }
    refreshIdle(s);
    // Comments: keep them with their neighbours (a keep-alive means something to the client).
    if (s.record.ending !== undefined) return;
    if ((s.record.committedAt !== undefined)) forward(s, raw);
    else hold(s, raw);
    return;
  }
  // The idle clock runs on whole events, not bytes: an upstream dripping bytes without an event boundary is idle.
  refreshIdle(s);
  // The stream's id and model, once seen, are reused by the classifier for every chunk that names the same, and an
  // ordinary delta's facts are filled into the request's scratch: the event allocates no facts (read in this step only).
  const facts = classifyStreamEvent(s.request.info.route, event, wantsParts(s.record), s.record.responseId, s.record.responseModel, s.factsScratch);
  if (facts.kind === 'error') observe(s, { type: 'upstream_error', attempt: s.attempt, error: facts });
  const verdict = recordStreamEvent(s.record, s.request.info, s.at, facts);
  const gap = s.record.outputGapMs;
  if (gap !== undefined) s.deps.onInterTokenGap(gap);
  if (s.anomaliesSeen !== s.record.anomalies.length) reportAnomalies(s);
  switch (verdict) {
    case 'hold':
      return hold(s, raw);
    case 'commit':
      commit(s);
      if (s.record.firstOutputAt !== undefined) observe(s, { type: 'first_output' });
      for (const piece of s.held) forward(s, piece);
      s.held = [];
      s.heldBytes = 0;
      forward(s, raw);
      return;
    case 'forward':
      if (!responseEnded(s)) forward(s, raw);
      return;
    case 'drop':
      return;
  }
}

/**
 * Bytes before the first output are bounded in bytes and in pieces: one role chunk per expected choice (vLLM sends
 * them before any content), plus maxHeldEvents more (comments, empty deltas).
 */
function hold(s: DeliveryState, raw: Buffer): void {
  s.held.push(raw);
  s.heldBytes += raw.length;
  const settings = s.deps.settings;
  if (s.heldBytes > settings.maxEventBytes || s.held.length > settings.maxHeldEvents + s.request.info.expectedChoices) {
    emit(s, { kind: 'abort_attempt', reason: 'oversized' });
  }
}

/** attempting → streaming: the head goes out, and the idle clock starts. */
function commit(s: DeliveryState): void {
  clear(s, 'first_output');
  if (!responseEnded(s)) s.phase = 'streaming';
  writeHead(s, 200, sseHead(s.contentType));
  armIdle(s);
}

export function armIdle(s: DeliveryState): void {
  s.idleFrom = s.at;
  arm(s, 'idle', s.deps.settings.idleMs);
}

function refreshIdle(s: DeliveryState): void {
  if (isArmed(s, 'idle')) s.idleFrom = s.at;
}

export function attemptSettled(s: DeliveryState, attempt: number): void {
  emit(s, { kind: 'attempt_over', attempt, record: s.record.attempts[attempt - 1] });
  if (attempt !== s.attempt) return;
  s.upstream = 'closed';
  // The attempt's clocks stop; the request's total deadline keeps running.
  clear(s, 'first_output');
  clear(s, 'idle');
  clear(s, 'drain');
  if (s.retryDue) {
    s.retryDue = false;
    retryNow(s);
  }
  if (!responseEnded(s) && s.record.ending === undefined) {
    // The attempt stopped without the record deciding how the client's response ends (cannot happen with the
    // attempt's reporting; kept so a future gap shows up as a counted incomplete request, not a hang).
    recordStreamEnd(s.record, s.request.info, s.at, 'eof');
    reportAnomalies(s);
    decide(s);
  }
  settleIfDone(s);
}

/** CR and LF only: a block of blank lines, which dispatches nothing and carries nothing. */
function isBlankLines(raw: Buffer): boolean {
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i];
    if (c !== 0x0a && c !== 0x0d) return false;
  }
  return true;
}
