/**
 * Background responses (`background: true`, with the store on): the generation runs with no client attached, its
 * events go to the store (vLLM's `event_store`), and any number of HTTP streams replay them —
 * `responses_background_stream_generator`, `vllm/entrypoints/openai/responses/serving.py`. Two pieces:
 *
 * - startBackground(): the engine side. The stream engine (stream-engine.ts) with the Responses writer, as a stream,
 *   but its events are handed over, not written. An engine error kills the task (vLLM's
 *   GenerationError escapes the task: no event, no final response); `stall_after` freezes it.
 * - startReplay(): one HTTP stream over the buffered events, from an index on. It ends only after writing
 *   `response.completed`; when the task died or was cancelled it stays open and idle until the client leaves.
 */
import type { ServerResponse } from 'node:http';
import { eventRenderer, type EventWriter, type NamedEvent } from './event-stream.js';
import type { Fault } from './faults.js';
import type { StoredResponse } from './response-store.js';
import { cutConnection } from './http-sink.js';
import { runStream, type SequencePlan, type StreamControl, type StreamSink } from './stream-engine.js';
import { createNamedEventFramer, type FramingStyle } from './wire.js';

// ---- the task ----

/** `fault`: `error_before_output`, `error_after`, `stall_after` or null (others are ignored). */
export interface BackgroundPlan extends SequencePlan {
  readonly writer: EventWriter;
}

export interface BackgroundHooks {
  /** Events the task produced, in order (the writer's, untouched). */
  onEvents(events: readonly NamedEvent[]): void;
  onFirstToken(): void;
  onOutput(tokens: number): void;
  /**
   * Once: `completed` after the last events (response.completed included) were handed over; `died` when an engine
   * error killed the task. Never for a stall, nor after abort().
   */
  onEnd(end: 'completed' | 'died'): void;
}

/**
 * The faults a background request honours: `status` and `reset_before_response` on the request itself,
 * `error_before_output`, `error_after` and `stall_after` on its task. The others alter a connection's stream, which a
 * background generation does not have.
 */
export function appliesToBackground(kind: Fault['kind']): boolean {
  return kind === 'error_before_output' || kind === 'error_after' || kind === 'stall_after' || kind === 'status' || kind === 'reset_before_response';
}

/** The faults a background task itself honours; `status` and `reset_before_response` were answered before it. */
function appliesToTask(fault: Fault | null): Fault | null {
  const kind = fault?.kind;
  return kind === 'error_before_output' || kind === 'error_after' || kind === 'stall_after' ? fault : null;
}

/**
 * The task's sink: events are handed over, not written, and nothing is ever held back. An engine error kills the task
 * with no event of its own (the writer's failure is the cut, which has no connection to cut here).
 */
function taskSink(hooks: BackgroundHooks): StreamSink<NamedEvent> {
  return {
    open: (events) => hooks.onEvents(events),
    write: (events) => {
      hooks.onEvents(events);
      return true;
    },
    onDrain: () => undefined,
    end: () => undefined,
    reset: () => undefined,
    cut: () => undefined,
  };
}

export function startBackground(plan: BackgroundPlan, hooks: BackgroundHooks): StreamControl {
  return runStream(
    { ...plan, choiceCount: 1, tokensPerChoice: plan.tokens, fault: appliesToTask(plan.fault) },
    eventRenderer(plan.writer),
    taskSink(hooks),
    {
      onFirstToken: () => hooks.onFirstToken(),
      onOutput: (tokens) => hooks.onOutput(tokens),
      onEnd: ({ generationComplete }) => hooks.onEnd(generationComplete ? 'completed' : 'died'),
    },
  );
}

// ---- the replay ----

export interface ReplayHooks {
  /**
   * Once: `completed` after `response.completed` was written and the body ended; `refused` when vLLM's generator
   * raised after the 200 (no buffered events for this response, or an index past the buffer's start) and the
   * connection was cut. Not called when the client leaves first.
   */
  onEnd(end: 'completed' | 'refused'): void;
}

/**
 * Replay `entry`'s buffered events from index `start` (`starting_after + 1`; 0 from the beginning), then each new one
 * as it comes, as vLLM's loop does — including its Python indexing: a negative index counts from the end of the
 * buffer as it is at that moment, and one before its start raises (the stream is cut). Headers go out at once; a
 * response without buffered events is refused lazily, after the 200. Honours backpressure.
 */
export function startReplay(res: ServerResponse, entry: StoredResponse, start: number, framing: FramingStyle, hooks: ReplayHooks): void {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
  res.flushHeaders();
  const events = entry.events;
  if (events === null) {
    cutConnection(res);
    hooks.onEnd('refused');
    return;
  }
  const frame = createNamedEventFramer(framing);
  let index = start;
  let framed = 0;
  let waitingForDrain = false;
  let done = false;
  const finish = (): void => {
    done = true;
    unsubscribe();
  };
  const pump = (): void => {
    if (done || waitingForDrain) return;
    while (index < events.length) {
      const actual = index < 0 ? events.length + index : index;
      const event = actual < 0 ? undefined : events[actual];
      if (event === undefined) {
        // deque[i] for i < -len: IndexError escapes the generator after the 200.
        finish();
        cutConnection(res);
        hooks.onEnd('refused');
        return;
      }
      const ok = res.write(frame(event.name, event.data, true, framed === 0));
      framed += 1;
      if (event.name === 'response.completed') {
        finish();
        res.end();
        hooks.onEnd('completed');
        return;
      }
      index += 1;
      if (!ok) {
        waitingForDrain = true;
        res.once('drain', () => {
          waitingForDrain = false;
          pump();
        });
        return;
      }
    }
  };
  const unsubscribe = entry.subscribe(pump);
  res.once('close', finish);
  pump();
}

