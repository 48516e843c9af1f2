/**
 * Publishing a settled logical request to everything that observes it: its span, the metrics (with its trace id as
 * exemplar), the wide log line, and the settlement subscribers. Each observer runs behind the guard, so one that
 * throws is logged and counted and the others still see the request. Shared by proxied requests and those the
 * gateway answered itself.
 */
import type { Logger } from 'pino';
import type { Settlement } from '../accounting/ledger.js';
import { evaluationSample, type EvaluationSettings } from './evaluation.js';
import type { ObserverGuard } from './guard.js';
import type { GatewayMetrics } from './metrics.js';
import { dataRecordWriter } from './logger.js';
import { requestLogLine, requestLogMembers } from './request-log.js';
import type { RequestTrace } from './request-trace.js';

export interface SettlementRecorderDeps {
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  readonly guard: ObserverGuard;
  /** One wide log line per request (logging.requests). */
  readonly logRequests: boolean;
  /**
   * Subscribers to every settled request, in order (the gateway's `onSettled` option, the status page's window). Each
   * runs behind the guard on its own, so one that throws is counted and the next still sees the request.
   */
  readonly onSettled?: readonly SettlementSubscriber[] | undefined;
  /** Sampling of delivered responses for external evaluation (config `evaluation`). */
  readonly evaluation?: EvaluationSettings | undefined;
}

/** Sees one settled request with its id and, when the request is traced, its trace id. */
export type SettlementSubscriber = (settlement: Settlement, requestId: string, traceId: string | undefined) => void;

/** `inflightLabel`: the in-flight gauge's label the request was counted under (GatewayMetrics.requestStarted), if it was. */
export type PublishSettlement = (settlement: Settlement, requestId: string, trace: RequestTrace, inflightLabel: string | undefined, at: number) => void;

export function createSettlementRecorder(deps: SettlementRecorderDeps): PublishSettlement {
  const { metrics, logger, guard, logRequests, onSettled, evaluation } = deps;
  const writeLine = dataRecordWriter(logger, requestLogMembers);
  return (settlement, requestId, trace, inflightLabel, at) => {
    const traceId = trace.traceId;
    const sample = evaluation === undefined ? undefined : guard.run('hook', () => evaluationSample(evaluation, settlement, requestId, traceId), undefined);
    guard.run('tracing', () => trace.settle(settlement, at, sample));
    guard.run('metrics', () => metrics.record(settlement, inflightLabel, traceId));
    if (sample !== undefined) {
      guard.run('metrics', () => metrics.evaluationSampled(settlement.model, Date.now()));
      // Its own line, so a collector can route samples to the evaluator without parsing every request's line.
      guard.run('logging', () => logger.info({ evaluation_sample: sample }, 'evaluation sample'));
    }
    if (logRequests) guard.run('logging', () => writeLine(requestLogLine(settlement, requestId, traceId, sample?.inclusion_probability), 'request'));
    for (const subscriber of onSettled ?? []) guard.run('hook', () => subscriber(settlement, requestId, traceId));
  };
}
