/**
 * The streaming answer of chat, legacy completions and audio: `data:`-only chunks in vLLM's order — role chunks with
 * the first token, interleaved deltas, one finish chunk per choice, usage, [DONE]. The pace, the faults and the end are
 * the stream engine's (stream-engine.ts); this file is the chunks.
 */
import type { ServerResponse } from 'node:http';
import { httpSink } from './http-sink.js';
import { runStream, type StreamControl, type StreamEnginePlan, type StreamHooks, type StreamEvent, type StreamRenderer } from './stream-engine.js';
import { choiceTextJsonInner, DONE_DATA, errorEventData, MALFORMED_DATA, type ChunkSerializer, type FramingStyle, type Usage } from './wire.js';


export interface StreamPlan extends StreamEnginePlan {
  /** finish_reason of every choice. */
  readonly finishReason: string;
  /** null: no usage chunk. */
  readonly usage: Usage | null;
  readonly serializer: ChunkSerializer;
  readonly framing: FramingStyle;
}

export function startStream(res: ServerResponse, plan: StreamPlan, hooks: StreamHooks): StreamControl {
  return runStream(plan, chunkRenderer(plan), httpSink(res, plan.framing), hooks);
}

const DONE = { data: DONE_DATA, isJson: false } as const;

function chunkRenderer(plan: StreamPlan): StreamRenderer {
  const { serializer } = plan;
  return {
    opening: () => [],
    first: () => {
      const roles: StreamEvent[] = [];
      for (let index = 0; index < plan.choiceCount; index++) {
        const role = serializer.role(index);
        if (role !== null) roles.push({ data: role });
      }
      return roles;
    },
    output: (choice, start, count, last, variant) => {
      // drop_finish: the first choice's finish chunk loses its finish_reason.
      const finishReason = last && !(variant.dropFinish && choice === 0) ? plan.finishReason : null;
      return { data: serializer.output(choice, choiceTextJsonInner(choice, start, count), finishReason) };
    },
    oversized: (choice, bytes) => {
      // A content chunk padded with 'x' so its JSON is `bytes` long (or its minimum size).
      const base = Buffer.byteLength(serializer.output(choice, '', null));
      return { data: serializer.output(choice, 'x'.repeat(Math.max(0, bytes - base)), null) };
    },
    malformed: () => ({ data: MALFORMED_DATA, isJson: false }),
    failure: (info) => [{ data: errorEventData(info) }, DONE],
    finish: (variant) => {
      const events: StreamEvent[] = [];
      if (plan.usage !== null) events.push({ data: serializer.usage(plan.usage) });
      if (!variant.noTerminal) events.push(DONE);
      return events;
    },
    late: (start) => ({ data: serializer.output(0, choiceTextJsonInner(0, start, 1), null) }),
  };
}
