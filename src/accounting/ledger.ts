/**
 * The delivery ledger's public face: the types of one logical request's record of facts (record.ts, record-upstream.ts:
 * plain data the delivery machine updates through their functions) and of its settlement (settle.ts, exactly once,
 * by the machine's phases/ending.ts). Everything that reports on a request imports its types from here.
 */
export type { Failure, FailureCause } from '../delivery/failures.js';
export type { Anomaly, AttemptRecord, Ending, GatewayErrorCause, ProtocolViolation, RequestInfo, RequestRecord, SloThresholds, StreamEnd, Verdict } from './record.js';
export { crashSettlement, estimateCompletionTokens, type RelayedOutput, type RoutingOutcome, type Settlement } from './settle.js';

