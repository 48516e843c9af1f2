/**
 * What the delivery machine reports for observers (metrics, the request's span, a debug log line), carried out
 * behind the guard: none of it decides anything, and none of it can break the request.
 */
import type { Logger } from 'pino';
import type { Observation } from '../delivery/machine.js';
import type { ObserverGuard } from './guard.js';
import type { GatewayMetrics } from './metrics.js';
import type { RequestTrace } from './request-trace.js';

export interface DeliveryObserverDeps {
  readonly metrics: GatewayMetrics;
  readonly guard: ObserverGuard;
  readonly logger: Logger;
  readonly now: () => number;
}

/**
 * One request's observer: `trace` is already guarded (ObserverGuard.trace). `onInflight` is told the label the request
 * was counted in flight under, for its settlement to take it off the same series.
 */
export function createDeliveryObserver(
  deps: DeliveryObserverDeps,
  model: string,
  requestId: string,
  trace: RequestTrace,
  onInflight: (label: string) => void = () => {},
): (o: Observation) => void {
  const { metrics, guard, logger, now } = deps;
  return (observation) => {
    switch (observation.type) {
      case 'request_started':
        return guard.run('metrics', () => onInflight(metrics.requestStarted(model)));
      case 'queue_waited':
        return guard.run('metrics', () => metrics.queueWaited(model, observation.ms));
      case 'retry_made':
        return guard.run('metrics', () => metrics.retryMade(model, observation.reason));
      case 'retry_budget_spent':
        return guard.run('metrics', () => metrics.retryBudgetSpent(model));
      case 'first_output':
        return trace.firstOutput(now());
      case 'upstream_error':
        return trace.upstreamError(observation.attempt, observation.error, now());
      case 'anomaly':
        return trace.anomaly(observation.attempt, observation.kind, now());
      case 'retry_scheduled':
        return trace.retryScheduled(observation.reason, observation.delayMs, now());
      case 'client_cancelled':
        return trace.clientCancelled(now());
      case 'connect_failed':
        return guard.run('logging', () => logger.debug({ requestId, attempt: observation.attempt, err: observation.message }, 'upstream connection failed'));
      case 'internal_error':
        return guard.report('exchange', observation.error);
    }
  };
}
