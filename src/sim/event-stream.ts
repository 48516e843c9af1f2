/**
 * The named-event streams of /v1/responses and /v1/messages (`event: <name>` + `data: <JSON>`), one sequence of output
 * tokens. The pace, the faults and the end are the stream engine's (stream-engine.ts), as for the chat stream; what each
 * step sends is the route's EventWriter: Responses announces itself at once and is cut on an engine error; Messages
 * starts at the first token and ends an engine error with an `error` event.
 */
import type { ServerResponse } from 'node:http';
import { httpSink } from './http-sink.js';
import { runStream, type SequencePlan, type StreamControl, type StreamEvent, type StreamHooks, type StreamRenderer, type StreamVariant } from './stream-engine.js';
import { MALFORMED_DATA, type ErrorInfo, type FramingStyle } from './wire.js';


export interface NamedEvent extends StreamEvent {
  readonly name: string;
}

/** What a route writes at each step. Events are built in the order they go out (Responses numbers them). */
export interface EventWriter {
  /** Written with the 200 headers, before the engine runs (Responses: created, in_progress). */
  opening(): NamedEvent[];
  /** Written with the first output event, before it (Responses: item and part added; Messages: message_start…). */
  first(): NamedEvent[];
  /** The output event carrying `count` tokens from `start`. */
  output(start: number, count: number): NamedEvent;
  /** An extra output event whose JSON is `bytes` long (never shorter than its minimal size). */
  oversized(bytes: number): NamedEvent;
  /** The name the malformed data goes under. */
  readonly malformedName: string;
  /**
   * Everything after the last output event of a complete answer. `dropFinish`: without the event that gives the
   * finish reason; `noTerminal`: without the terminal event.
   */
  finish(variant: StreamVariant): NamedEvent[];
  /** The output event of `data_after_done`: the token after the last, past the terminal event. */
  late(start: number): NamedEvent;
  /** An engine error: the events that end the stream cleanly, or null to cut the connection (no terminator). */
  failure(info: ErrorInfo): NamedEvent[] | null;
}

/** A route's writer as the engine's renderer: one choice, so the choice index is always 0. */
export function eventRenderer(writer: EventWriter): StreamRenderer<NamedEvent> {
  return {
    opening: () => writer.opening(),
    first: () => writer.first(),
    output: (_choice, start, count) => writer.output(start, count),
    oversized: (_choice, bytes) => writer.oversized(bytes),
    malformed: () => ({ name: writer.malformedName, data: MALFORMED_DATA, isJson: false }),
    failure: (info) => writer.failure(info),
    finish: (variant) => writer.finish(variant),
    late: (start) => writer.late(start),
  };
}

export interface EventStreamPlan extends SequencePlan {
  readonly framing: FramingStyle;
  readonly writer: EventWriter;
}

export function startEventStream(res: ServerResponse, plan: EventStreamPlan, hooks: StreamHooks): StreamControl {
  return runStream({ ...plan, choiceCount: 1, tokensPerChoice: plan.tokens }, eventRenderer(plan.writer), httpSink(res, plan.framing), hooks);
}
