/**
 * The facts the delivery machine and the ledger read of the configuration, built from it per request: the request's
 * info (its model's SLO thresholds, the prompt-length classes, the output limits) and the machine's settings
 * (deadlines, hold limits, retry rules). Here, beside the exchange that uses them, so config/ stays schema, loading,
 * resolution and reload rules, and does not import the core.
 */
import type { RequestInfo } from '../accounting/ledger.js';
import type { Config } from '../config/load.js';
import type { MachineSettings } from '../delivery/machine.js';

/** The ledger's facts of a request: the model's SLO thresholds and the configured prompt-length classes. */
export function requestInfo(
  config: Config,
  request: Pick<RequestInfo, 'model' | 'route' | 'stream' | 'expectedChoices' | 'dropUsageChunk'> &
    Partial<Pick<RequestInfo, 'tenant' | 'promptTokensEstimate' | 'contract' | 'evaluator' | 'captureAnswer' | 'clientRetry'>>,
): RequestInfo {
  return {
    tenant: request.tenant,
    contract: request.contract,
    evaluator: request.evaluator,
    captureAnswer: request.captureAnswer,
    clientRetry: request.clientRetry,
    maxOutputChars: config.outputChecks.maxOutputChars,
    promptTokensEstimate: request.promptTokensEstimate,
    model: request.model,
    route: request.route,
    stream: request.stream,
    expectedChoices: request.expectedChoices,
    dropUsageChunk: request.dropUsageChunk,
    slo: config.slo.models[request.model] ?? config.slo.defaults,
    promptLenBoundaries: config.metrics.promptLenBoundaries,
    promptLenClasses: config.metrics.promptLenClasses,
    charsPerToken: config.metrics.charsPerToken,
  };
}

/** What the delivery machine needs of the configuration: deadlines, hold limits, retry rules. */
export function machineSettings(config: Config): MachineSettings {
  return {
    totalMs: config.timeouts.totalMs,
    firstOutputMs: config.timeouts.firstOutputMs,
    idleMs: config.timeouts.idleMs,
    drainGraceMs: config.streaming.drainGraceMs,
    maxEventBytes: config.streaming.maxEventBytes,
    maxHeldEvents: config.streaming.maxHeldEvents,
    maxAttempts: config.retries.maxAttempts,
    retry: config.retries,
  };
}
