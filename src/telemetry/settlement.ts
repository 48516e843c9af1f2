/**
 * Publishing a settled logical request to everything that observes it: its span, the metrics (with its trace id as
 * exemplar), the wide log line, and the settlement subscribers. Each observer runs behind the guard, so one that
 * throws is logged and counted and the others still see the request. Shared by proxied requests and those the
 * gateway answered itself.
 */
import type { Logger } from 'pino';
import type { Settlement } from '../accounting/ledger.js';
import type { ObserverGuard } from './guard.js';
import type { GatewayMetrics } from './metrics.js';
import { requestLogLine } from './request-log.js';
import type { RequestTrace } from './request-trace.js';

export interface SettlementRecorderDeps {
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  readonly guard: ObserverGuard;
  /** One wide log line per request (logging.requests). */
  readonly logRequests: boolean;
  readonly onSettled?: ((settlement: Settlement, requestId: string) => void) | undefined;
}

export type PublishSettlement = (settlement: Settlement, requestId: string, trace: RequestTrace, started: boolean, at: number) => void;

export function createSettlementRecorder(deps: SettlementRecorderDeps): PublishSettlement {
  const { metrics, logger, guard, logRequests, onSettled } = deps;
  return (settlement, requestId, trace, started, at) => {
    guard.run('tracing', () => trace.settle(settlement, at));
    const traceId = trace.traceId;
    guard.run('metrics', () => metrics.record(settlement, started, traceId));
    if (logRequests) guard.run('logging', () => logger.info(requestLogLine(settlement, requestId, traceId), 'request'));
    if (onSettled !== undefined) guard.run('hook', () => onSettled(settlement, requestId));
  };
}
