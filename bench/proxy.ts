/**
 * What Waybill costs: the same fixed streaming workload straight to the simulated vLLM and through Waybill (and,
 * when nginx is installed, through nginx as a plain streaming reverse proxy that parses nothing), in one run.
 * Waybill runs its default configuration (request logs on); lean and tracing rows measure what those cost; the
 * CPU is split into a cost per request and a cost per event (bench/proxy/fit.ts); issue 15's targets end the report.
 *
 *   npm run bench                                   (= npm run build && node dist/bench/proxy.js)
 *   node dist/bench/proxy.js --seconds 2 --repeats 1 --scenarios c64s,req
 *   node dist/bench/proxy.js --profile --scenarios none      (CPU profiles of the gateway only)
 *
 * Pinning (2 cores): the proxy under test (Waybill or nginx) alone on core 0; the simulator and this process (the
 * load client) on core 1. docs/performance.md explains the method and holds the figures of a full run.
 *
 * The pieces (bench/proxy/): options.ts (the flags), run.ts (a scenario's processes and windows; procs.ts starts and
 * reads them), measure.ts (one window), compare.ts (against direct and nginx; nginx's reference figures are
 * bench/reference/nginx.json), targets.ts (each issue's targets as data), report.ts and format.ts (the output),
 * profiling.ts (--profile, --perf).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync, spawnSync } from 'node:child_process';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { compare, splitCosts } from './proxy/compare.js';
import { LOAD_CORE, PROXY_CORE, REPO } from './proxy/layout.js';
import { parseOptions, scenarioNamed, tokensOf, UsageError, USAGE, type Options } from './proxy/options.js';
import { perfAvailable } from './proxy/perf.js';
import { killAll, pinSelf } from './proxy/procs.js';
import { formatProfile, type ProfileSummary } from './proxy/profile.js';
import { formatPerf, profileScenario, type PerfResult } from './proxy/profiling.js';
import { readNginxReference } from './proxy/reference.js';
import { printChecks, printCostSplit, printReport } from './proxy/report.js';
import { runScenario, type ScenarioResult } from './proxy/run.js';
import { checkTargets, ISSUE_15, ISSUE_27, ISSUE_5 } from './proxy/targets.js';
import { formatSustained, sustainedStreams } from './proxy/sustained.js';

function gitState(): { commit: string; dirtySrc: boolean } {
  try {
    const commit = execFileSync('git', ['-C', REPO, 'rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['-C', REPO, 'status', '--porcelain', '--', 'src'], { encoding: 'utf8' }).trim() !== '';
    return { commit, dirtySrc: dirty };
  } catch {
    return { commit: 'unknown', dirtySrc: false };
  }
}

function nginxVersion(bin: string | undefined): string | undefined {
  if (bin === undefined) return undefined;
  // nginx -v prints to stderr.
  const result = spawnSync(bin, ['-v'], { encoding: 'utf8' });
  const text = `${result.stdout ?? ''}${result.stderr ?? ''}`.trim();
  return text === '' ? undefined : text.replace(/^nginx version:\s*/, '');
}

async function main(argv: string[]): Promise<number> {
  let options: Options;
  try {
    options = parseOptions(argv);
  } catch (error) {
    if (error instanceof UsageError) {
      console.error(`${error.message}\n\n${USAGE}`);
      return 2;
    }
    throw error;
  }
  if (cpus().length < 2) {
    console.error('needs at least 2 cores (the proxy on core 0, the simulator and the client on core 1)');
    return 2;
  }
  pinSelf(LOAD_CORE);
  const dir = mkdtempSync(join(tmpdir(), 'waybill-bench-'));
  const startedAt = new Date();
  const git = gitState();
  const nginx = nginxVersion(options.nginx);
  const loadBefore = loadavg();
  console.log(`Waybill proxy benchmark — ${startedAt.toISOString()}, node ${process.version}, ${cpus().length} cores (${cpus()[0]?.model ?? '?'})`);
  console.log(
    `pinning: the proxy under test (Waybill${options.nginx !== undefined ? ', nginx' : ''}) alone on core ${PROXY_CORE}; ` +
      `the simulator and this load client (pid ${process.pid}) on core ${LOAD_CORE} (taskset)`,
  );
  console.log(
    `workload: closed loop of chat completions, streamed with 1 output token per event (${options.outputTokens ?? 'the scenario\'s'} tokens each; reqs 1) unless ` +
      `the scenario says non-streaming; simulator jitter 0, seed ${options.seed}; ${options.seconds} s windows after a warm-up, ${options.repeats} repeat(s), medians reported`,
  );
  console.log(
    `rows: waybill = the default configuration (request log line on, level info, stdout to a file), tracing off` +
      `${options.lean ? '; waybill-lean = logging {level: warn, requests: false}' : ''}` +
      `${options.otel ? '; waybill+otel = default + OTLP traces to a closed port' : ''}`,
  );
  console.log(`nginx: ${nginx ?? 'not found (figures compared with peer-figures.md instead)'}; load average ${loadBefore.map((l) => l.toFixed(2)).join(' ')}`);
  if (git.dirtySrc) console.log(`note: src/ has uncommitted changes (HEAD ${git.commit.slice(0, 10)})`);

  const results: ScenarioResult[] = [];
  for (const scenario of options.scenarios) {
    console.log(`\n${scenario.name}: ${scenario.note} (TTFT ${scenario.ttftMs} ms, ${tokensOf(scenario, options)} tokens)`);
    results.push(await runScenario(scenario, options, dir));
  }
  const comparisons = compare(results, readNginxReference());
  const checks = checkTargets(ISSUE_5, comparisons);
  const costSplit = splitCosts(results);
  const issue15 = checkTargets(ISSUE_15, comparisons);
  const issue27 = checkTargets(ISSUE_27, comparisons);
  if (results.length > 0) {
    printReport(results, comparisons);
    printCostSplit(costSplit);
    printChecks('Targets (issue 5; waybill in its default configuration):', checks);
  }
  const sustained = sustainedStreams(results);
  if (sustained.length > 0) console.log(`\n${formatSustained(sustained)}`);

  const profiles: ProfileSummary[] = [];
  const perfResults: PerfResult[] = [];
  let profileDir: string | undefined;
  if (options.perf && !perfAvailable()) {
    console.log('\n--perf: perf is not on PATH or cannot read syscall tracepoints; skipped');
    options.perf = false;
  }
  if (options.profile.length > 0) {
    profileDir = options.profileDir ?? mkdtempSync(join(tmpdir(), 'waybill-cpuprof-'));
    for (const name of options.profile) {
      console.log(`\nprofiling the gateway under ${name} (node --cpu-prof, 500 µs sampling${options.perf ? '; then perf' : ''})`);
      const { summary, perf } = await profileScenario(scenarioNamed(name), options, dir, profileDir);
      profiles.push(summary);
      perfResults.push(...perf);
      console.log(formatProfile(summary, 20));
      if (perf.length > 0) console.log(formatPerf(perf));
    }
  }

  printChecks(`Issue 15 targets (waybill, default configuration; ${options.repeats} repeat(s), medians):`, issue15);
  printChecks(`Issue 27 targets (waybill against the bare Node relay, node-floor, in this run):`, issue27);

  const loadAfter = loadavg();
  const report = {
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    git,
    node: process.version,
    cpu: cpus()[0]?.model,
    cores: cpus().length,
    nginx: nginx ?? null,
    pinning: { proxy: PROXY_CORE, simulatorAndClient: LOAD_CORE },
    loadAverage: { before: loadBefore, after: loadAfter },
    options: { ...options, scenarios: options.scenarios.map((s) => s.name) },
    scenarios: results.map((r) => ({ ...r.scenario, targets: r.targets, windows: r.windows })),
    comparisons,
    /** Issue 15: CPU = a × requests + b × events per proxy (bench/proxy/fit.ts), and the non-streaming µs/request. */
    costSplit,
    targets: checks,
    issue15Targets: issue15,
    issue27Targets: issue27,
    sustained,
    profiles,
    perf: perfResults,
    profileDir: profileDir ?? null,
  };
  if (results.length > 0 || profiles.length > 0) {
    writeFileSync(options.out, `${JSON.stringify(report, (_k, v: unknown) => (typeof v === 'number' && !Number.isFinite(v) ? null : v), 2)}\n`);
    console.log(`\nresults: ${resolve(options.out)}${profileDir !== undefined ? `; profiles: ${profileDir}` : ''}`);
  }
  console.log(`load average after: ${loadAfter.map((l) => l.toFixed(2)).join(' ')}`);
  if (options.keep) console.log(`kept: ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
  return 0;
}

const invokedPath = process.argv[1];
if (invokedPath !== undefined && import.meta.url === pathToFileURL(invokedPath).href) {
  main(process.argv.slice(2)).then(
    (code) => {
      killAll();
      process.exit(code);
    },
    (error: unknown) => {
      console.error(error instanceof Error ? (error.stack ?? error.message) : error);
      killAll();
      process.exit(1);
    },
  );
}
