/**
 * Prompt-length classes for the `prompt_len` label, so long-prompt users are not hidden behind averages.
 * Boundaries [1024, 4096, 16384, 65536] give `0-1k`, `1k-4k`, `4k-16k`, `16k-64k`, `64k+` (k = 1024 tokens);
 * a prompt of exactly a boundary's size belongs to the class above it.
 */
import { promptLenClassNames, UNKNOWN_PROMPT_LEN } from '../telemetry/labels.js';

export { UNKNOWN_PROMPT_LEN };

/** The label values for the given boundaries, shortest class first, `unknown` last (named in telemetry/labels.ts). */
export const promptLenClasses: (boundaries: readonly number[]) => string[] = promptLenClassNames;

/** The class of a prompt of `promptTokens` tokens; `unknown` when usage did not say. */
export function classifyPromptLen(
  boundaries: readonly number[],
  classes: readonly string[],
  promptTokens: number | undefined,
): string {
  if (promptTokens === undefined) return UNKNOWN_PROMPT_LEN;
  let i = 0;
  while (i < boundaries.length && promptTokens >= (boundaries[i] ?? Infinity)) i++;
  return classes[i] ?? UNKNOWN_PROMPT_LEN;
}
