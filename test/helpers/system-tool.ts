/**
 * Tests that need a program besides Node.js (promtool, prometheus). Where it is missing they skip, with one line on
 * stderr naming the tool and how to install it; with WAYBILL_REQUIRE_TOOLS=1 (as .ci/run sets) they fail instead.
 */
import { accessSync, constants, statSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { describe, it, TestRunner } from 'vitest';

/** The environment variable that makes a missing tool a failure rather than a skip. */
export const REQUIRE_TOOLS_ENV = 'WAYBILL_REQUIRE_TOOLS';

export interface SystemTool {
  /** A command looked up on PATH, or a path to the binary. */
  readonly command: string;
  /** How to get it, e.g. `Debian: apt-get install prometheus`. */
  readonly install: string;
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** Whether `command` runs here: a path to an executable file, or a name found on PATH. */
export function hasTool(command: string): boolean {
  if (command.includes('/')) return isExecutable(command);
  return (process.env.PATH ?? '').split(delimiter).some((dir) => dir !== '' && isExecutable(join(dir, command)));
}

export function toolsRequired(): boolean {
  return process.env[REQUIRE_TOOLS_ENV] === '1';
}

const announced = new Set<string>();

/**
 * `describe(name, factory)` when `tool` is there. When it is missing: with WAYBILL_REQUIRE_TOOLS=1, the block is a
 * single failing test naming it; otherwise the block is skipped and one line on stderr says so (once per file and
 * tool).
 */
export function describeWithTool(tool: SystemTool, name: string, factory: () => void): void {
  if (hasTool(tool.command)) {
    describe(name, factory);
    return;
  }
  const file = TestRunner.getCurrentSuite().file.name;
  const needs = `${file} needs ${tool.command} (${tool.install})`;
  if (toolsRequired()) {
    describe(name, () => {
      it(`needs ${tool.command}`, () => {
        throw new Error(`${needs}: not found on PATH, and ${REQUIRE_TOOLS_ENV}=1 makes it mandatory`);
      });
    });
    return;
  }
  if (!announced.has(needs)) {
    announced.add(needs);
    console.warn(`skipped: ${needs}`);
  }
  describe.skip(name, factory);
}
