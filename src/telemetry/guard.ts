/**
 * Observers cannot break delivery. Metrics, spans, log lines and settlement hooks watch a request; when one of them
 * throws, the throw is caught here, logged and counted (`waybill_internal_errors_total{component}`), and the request
 * goes on to its answer and its one count. (OpenTelemetry JS does the same with `safeExecuteInTheMiddle`.)
 */
import type { InternalErrorComponent } from './labels.js';
import { NO_TRACE, type RequestTrace } from './request-trace.js';

/** Where an internal error happened: a closed set, for the metric's label (labels.ts). */
export { INTERNAL_ERROR_COMPONENTS } from './labels.js';

export type InternalErrorSink = (component: InternalErrorComponent, error: unknown) => void;

export class ObserverGuard {
  constructor(private readonly sink: InternalErrorSink) {}

  /** Runs `fn`; a throw is reported and `fallback` returned instead. */
  run<T>(component: InternalErrorComponent, fn: () => T, fallback: T): T;
  run(component: InternalErrorComponent, fn: () => void): void;
  run<T>(component: InternalErrorComponent, fn: () => T, fallback?: T): T | undefined {
    try {
      return fn();
    } catch (error) {
      this.report(component, error);
      return fallback;
    }
  }

  /** Reports an error caught elsewhere. Never throws, whatever the sink does. */
  report(component: InternalErrorComponent, error: unknown): void {
    try {
      this.sink(component, error);
    } catch {
      // The sink is the last resort (a log line and a counter); if it fails too there is nowhere left to tell.
    }
  }

  /** The same trace, with every call guarded: a span exporter or processor that throws cannot reach the request. */
  trace(trace: RequestTrace): RequestTrace {
    if (trace === NO_TRACE) return trace;
    return {
      get traceId() {
        return trace.traceId;
      },
      attemptStarted: (...args) => this.run('tracing', () => trace.attemptStarted(...args), undefined),
      attemptEnded: (...args) => this.run('tracing', () => trace.attemptEnded(...args)),
      firstOutput: (...args) => this.run('tracing', () => trace.firstOutput(...args)),
      upstreamError: (...args) => this.run('tracing', () => trace.upstreamError(...args)),
      anomaly: (...args) => this.run('tracing', () => trace.anomaly(...args)),
      retryScheduled: (...args) => this.run('tracing', () => trace.retryScheduled(...args)),
      clientCancelled: (...args) => this.run('tracing', () => trace.clientCancelled(...args)),
      settle: (...args) => this.run('tracing', () => trace.settle(...args)),
    };
  }
}
