/**
 * The delivery ledger's public face: the types of one logical request's record of facts (record.ts, record-upstream.ts:
 * plain data the delivery machine updates through their functions) and of its settlement (settle.ts: exactly once,
 * by the machine's phases/ending.ts or its crash path in step.ts, and by http/answers.ts for the answers the gateway
 * gives itself). Everything that reports on a request imports its types from here.
 */
export type { Failure } from '../delivery/failures.js';
export type { AttemptRecord, GatewayErrorCause, ProtocolViolation, RequestInfo, StreamEnd, Verdict } from './record.js';
export type { RoutingOutcome, Settlement } from './settle.js';

