import type { RequestInfo } from '../../src/accounting/ledger.js';
import { promptLenClasses } from '../../src/accounting/prompt-len.js';

const BOUNDARIES = [1024, 4096, 16384, 65536];

/** A ledger's request facts for tests: one streamed chat choice on model `m`, usage injected, default classes. */
export function requestInfo(overrides: Partial<RequestInfo> = {}): RequestInfo {
  return {
    model: 'm',
    route: 'chat_completions',
    stream: true,
    expectedChoices: 1,
    dropUsageChunk: true,
    slo: { ttftMs: 1000, tpotMs: 50, e2eMs: 5000, ttftByPromptLenMs: { '4k-16k': 3000 } },
    promptLenBoundaries: BOUNDARIES,
    promptLenClasses: promptLenClasses(BOUNDARIES),
    ...overrides,
  };
}
