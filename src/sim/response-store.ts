/**
 * vLLM's Responses store (VLLM_ENABLE_RESPONSES_API_STORE=1), in the simulator's memory: the stored responses
 * (`response_store`), the buffered events of background streams (`event_store`) and the background tasks that can be
 * cancelled (`background_tasks`), one entry per response id. Sources: `vllm/entrypoints/openai/responses/serving.py`
 * (`_run_background_request[_stream]`, `responses_background_stream_generator`, `retrieve_responses`,
 * `cancel_responses`); docs/simulator.md.
 *
 * Unlike vLLM, which never evicts (it warns of the memory leak at start-up), the store is bounded: past
 * RESPONSES_STORE_LIMIT entries the oldest one whose generation is not running is forgotten.
 */
import type { NamedEvent } from './event-stream.js';
import { pendingResponseBody, type ResponsesAnswer, type ResponseStatus } from './responses-answer.js';

/** Responses kept at most (vLLM: unbounded). */
export const RESPONSES_STORE_LIMIT = 10_000;

/** What a background generation is to the store: something /cancel can stop. */
export interface BackgroundTask {
  /** Stop generating (no event, no final response after this) and settle the request as cancelled. */
  cancel(): void;
}

export type StoredStatus = Exclude<ResponseStatus, 'in_progress'>;

export class StoredResponse {
  private statusValue: StoredStatus;
  private final: string | null = null;
  private readonly listeners = new Set<() => void>();
  /** The running background generation; null when there is none (not background, or it ended or died). */
  task: BackgroundTask | null = null;
  /** Characters a request continuing this response (`previous_response_id`) puts before its own input. */
  contextChars: number;

  /**
   * `events`: a background stream's buffered events (vLLM's `event_store` deque), every event the task produced, in
   * order; null for any other response, whose replay vLLM refuses.
   */
  constructor(
    readonly answer: ResponsesAnswer,
    status: StoredStatus,
    readonly events: NamedEvent[] | null,
  ) {
    this.statusValue = status;
    this.contextChars = answer.request.promptChars;
  }

  get id(): string {
    return this.answer.id;
  }

  get status(): StoredStatus {
    return this.statusValue;
  }

  /** The response JSON as GET answers it: the final response once there is one, else the pending one. */
  body(): string {
    if (this.final !== null) return this.final;
    return pendingResponseBody(this.answer, this.statusValue === 'cancelled' ? 'cancelled' : 'queued');
  }

  /**
   * The generation's final response. vLLM does not overwrite a cancelled response (the simulator's task is stopped at
   * once by /cancel, so this cannot happen; kept for fidelity).
   */
  finish(body: string, status: 'completed' | 'incomplete', outputChars: number): void {
    if (this.statusValue === 'cancelled') return;
    this.final = body;
    this.statusValue = status;
    this.contextChars = this.answer.request.promptChars + outputChars;
  }

  /** /cancel: only a queued response (vLLM also allows in_progress, which its store never holds). */
  cancel(): boolean {
    if (this.statusValue !== 'queued') return false;
    this.statusValue = 'cancelled';
    const task = this.task;
    this.task = null;
    task?.cancel();
    return true;
  }

  /** A background stream's next events: buffered, then every replay is told. */
  push(events: readonly NamedEvent[]): void {
    if (this.events === null || events.length === 0) return;
    this.events.push(...events);
    for (const listener of [...this.listeners]) listener();
  }

  /** Be told of each push; returns the unsubscribe. */
  subscribe(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}

export class ResponseStore {
  private readonly entries = new Map<string, StoredResponse>();

  constructor(private readonly limit = RESPONSES_STORE_LIMIT) {}

  get size(): number {
    return this.entries.size;
  }

  get(id: string): StoredResponse | undefined {
    return this.entries.get(id);
  }

  /** Keep `entry` under its id (replacing one with the same id, as vLLM's dict does), then enforce the limit. */
  put(entry: StoredResponse): void {
    this.entries.delete(entry.id);
    this.entries.set(entry.id, entry);
    if (this.entries.size <= this.limit) return;
    for (const [id, old] of this.entries) {
      if (old.task !== null) continue; // a running generation stays findable (and cancellable)
      this.entries.delete(id);
      if (this.entries.size <= this.limit) return;
    }
  }
}
