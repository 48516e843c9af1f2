/**
 * The container image and the Kubernetes manifests: the invariants issue 6 asks of them, read from the files
 * themselves. No Docker engine or cluster here; the build steps are plain npm commands (checked by hand and by CI's
 * own `npm ci && npm run build`), and the manifests are checked against the code they configure.
 */
import { once } from 'node:events';
import { readFileSync, readdirSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { parseAllDocuments } from 'yaml';
import { describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../src/config/load.js';
import { configSchema } from '../src/config/schema.js';
import { EXIT_FLUSH_TIMEOUT_MS } from '../src/telemetry/log-destination.js';
import { METRICS } from '../src/telemetry/metrics.js';

const ROOT = join(import.meta.dirname, '..');
const K8S = join(ROOT, 'deploy', 'kubernetes');

// ---------------------------------------------------------------------------------------------------------------
// Dockerfile

interface Instruction {
  readonly keyword: string;
  readonly args: string;
}

interface Stage {
  readonly from: string;
  readonly name: string | undefined;
  readonly instructions: Instruction[];
}

/** Instructions with line continuations joined and comments dropped, split into stages at each FROM. */
function parseDockerfile(text: string): { args: Map<string, string>; stages: Stage[] } {
  const lines = text.split('\n').filter((line) => !/^\s*#/.test(line));
  const joined = lines.join('\n').replace(/\\\n/g, ' ');
  const args = new Map<string, string>();
  const stages: Stage[] = [];
  for (const raw of joined.split('\n')) {
    const line = raw.trim();
    if (line === '') continue;
    const space = line.search(/\s/);
    const keyword = (space < 0 ? line : line.slice(0, space)).toUpperCase();
    const rest = space < 0 ? '' : line.slice(space + 1).trim();
    if (keyword === 'FROM') {
      const [image = '', as, name] = rest.split(/\s+/);
      const resolved = image.replace(/\$\{(\w+)\}|\$(\w+)/g, (_m, a?: string, b?: string) => args.get(a ?? b ?? '') ?? '');
      stages.push({ from: resolved, name: as?.toUpperCase() === 'AS' ? name : undefined, instructions: [] });
    } else if (keyword === 'ARG' && stages.length === 0) {
      const [key = '', value = ''] = rest.split('=');
      args.set(key, value);
    } else {
      stages.at(-1)?.instructions.push({ keyword, args: rest });
    }
  }
  return { args, stages };
}

const dockerfile = parseDockerfile(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'));
const build = dockerfile.stages[0];
const runtime = dockerfile.stages.at(-1);

function all(stage: Stage | undefined, keyword: string): string[] {
  return (stage?.instructions ?? []).filter((i) => i.keyword === keyword).map((i) => i.args);
}

function execForm(args: string): string[] {
  const parsed: unknown = JSON.parse(args);
  if (!Array.isArray(parsed) || !parsed.every((p) => typeof p === 'string')) throw new Error(`not exec form: ${args}`);
  return parsed;
}

/** Waybill's default listen port, as the schema says when a config leaves server.port out. */
function defaultPort(): number {
  return configSchema.parse({ pools: [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:9' }] }] }).server.port;
}

describe('Dockerfile', () => {
  it('builds in one stage and runs in another, both on a current Node LTS slim image', () => {
    expect(dockerfile.stages.length).toBeGreaterThanOrEqual(2);
    for (const stage of dockerfile.stages) {
      const match = /^node:(\d+)-[a-z]+-slim$/.exec(stage.from);
      expect(match, `base image ${stage.from}`).not.toBeNull();
      const major = Number(match?.[1]);
      // LTS lines are the even majors; package.json asks for >= 20.18.
      expect(major % 2).toBe(0);
      expect(major).toBeGreaterThanOrEqual(22);
    }
  });

  it('installs dev dependencies and builds only in the build stage', () => {
    const buildRuns = all(build, 'RUN');
    expect(buildRuns.some((r) => /\bnpm ci\b/.test(r) && !r.includes('--omit=dev'))).toBe(true);
    expect(buildRuns.some((r) => r.includes('npm run build'))).toBe(true);

    const runs = all(runtime, 'RUN');
    const installs = runs.filter((r) => /\bnpm (ci|install|i)\b/.test(r));
    expect(installs.length).toBeGreaterThan(0);
    for (const install of installs) {
      expect(install).toMatch(/\bnpm ci\b/);
      expect(install).toContain('--omit=dev');
    }
    expect(runs.some((r) => /npm run build|\btsc\b/.test(r))).toBe(false);
    // The runtime gets compiled output from the build stage, never the sources.
    const copies = all(runtime, 'COPY');
    expect(copies.some((c) => c.startsWith(`--from=${build?.name ?? ''}`) && c.includes('dist'))).toBe(true);
    for (const copy of copies.filter((c) => !c.startsWith('--from='))) {
      const sources = copy.split(/\s+/).slice(0, -1);
      expect(sources).not.toContain('.');
      expect(sources).not.toContain('src');
    }
    expect(all(runtime, 'ENV').some((e) => /NODE_ENV=production/.test(e))).toBe(true);
  });

  it('runs as a non-root user', () => {
    const users = all(runtime, 'USER');
    const user = users.at(-1);
    expect(user).toBeDefined();
    expect(user?.split(':')[0]).not.toMatch(/^(root|0)$/);
    // The USER comes before the process is defined (nothing later switches back).
    const keywords = runtime?.instructions.map((i) => i.keyword) ?? [];
    expect(keywords.lastIndexOf('USER')).toBeLessThan(keywords.lastIndexOf('ENTRYPOINT'));
  });

  it("exposes Waybill's default port", () => {
    expect(all(runtime, 'EXPOSE')).toEqual([String(defaultPort())]);
  });

  it('starts node directly in exec form, so SIGTERM reaches it and it drains', () => {
    const [entrypoint] = all(runtime, 'ENTRYPOINT');
    expect(execForm(entrypoint ?? '')).toEqual(['node', 'bin/waybill.js']);
    const [cmd] = all(runtime, 'CMD');
    expect(execForm(cmd ?? '')).toEqual(['serve', '--config', '/etc/waybill/config.yaml']);
  });

  it('checks /healthz with node itself, and the check works', async () => {
    const [healthcheck = ''] = all(runtime, 'HEALTHCHECK');
    const cmd = healthcheck.slice(healthcheck.indexOf('CMD ') + 4);
    const argv = execForm(cmd);
    expect(argv[0]).toBe('node');
    const script = argv.at(-1) ?? '';
    expect(script).toContain(`http://127.0.0.1:${defaultPort()}/healthz`);

    // The same script, pointed at a server answering /healthz 200 (and 503 elsewhere), then at a closed port.
    const server: Server = createServer((req, res) => res.writeHead(req.url === '/healthz' ? 200 : 503).end());
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const { port } = server.address() as AddressInfo;
    const run = async (url: string): Promise<number | null> => {
      const child = spawn(process.execPath, ['-e', script.replace(`http://127.0.0.1:${defaultPort()}/healthz`, url)], { stdio: 'ignore' });
      const [code] = (await once(child, 'exit')) as [number | null];
      return code;
    };
    try {
      expect(await run(`http://127.0.0.1:${port}/healthz`)).toBe(0);
      expect(await run(`http://127.0.0.1:${port}/readyz`)).toBe(1);
      // With server.admin_port, WAYBILL_HEALTHCHECK_URL points the check at the admin listener.
      const admin = spawn(process.execPath, ['-e', script], { stdio: 'ignore', env: { ...process.env, WAYBILL_HEALTHCHECK_URL: `http://127.0.0.1:${port}/healthz` } });
      expect(((await once(admin, 'exit')) as [number | null])[0]).toBe(0);
    } finally {
      server.close();
    }
    expect(await run(`http://127.0.0.1:${port}/healthz`)).toBe(1);
  });

  it('keeps local installs and builds out of the build context', () => {
    const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8').split('\n').map((l) => l.trim());
    for (const path of ['node_modules', 'dist', '.git']) expect(ignored).toContain(path);
    // bench/ compiles against test fixtures: the build stage needs them.
    expect(ignored).not.toContain('test');
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Kubernetes

interface Labels {
  [key: string]: string;
}

interface Probe {
  httpGet?: { path: string; port: string | number };
  periodSeconds?: number;
  failureThreshold?: number;
}

interface Container {
  name: string;
  image: string;
  args?: string[];
  command?: string[];
  ports: Array<{ name?: string; containerPort: number }>;
  env?: Array<{ name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string } } }>;
  volumeMounts: Array<{ name: string; mountPath: string; readOnly?: boolean }>;
  resources: { requests?: Record<string, string>; limits?: Record<string, string> };
  startupProbe?: Probe;
  livenessProbe?: Probe;
  readinessProbe?: Probe;
  lifecycle?: { preStop?: { exec?: { command: string[] }; sleep?: { seconds: number } } };
  securityContext?: { runAsNonRoot?: boolean; runAsUser?: number; readOnlyRootFilesystem?: boolean; allowPrivilegeEscalation?: boolean };
}

interface PodSpec {
  terminationGracePeriodSeconds?: number;
  securityContext?: { runAsNonRoot?: boolean; runAsUser?: number };
  containers: Container[];
  volumes: Array<{ name: string; configMap?: { name: string; items?: Array<{ key: string; path: string }> }; emptyDir?: object }>;
}

interface Manifest {
  apiVersion: string;
  kind: string;
  metadata: { name: string; labels?: Labels };
  spec?: unknown;
  data?: Record<string, string>;
  resources?: string[];
}

interface DeploymentSpec {
  selector: { matchLabels: Labels };
  template: { metadata: { labels: Labels }; spec: PodSpec };
}

/**
 * Manifests in deploy/kubernetes that kustomization.yaml leaves out on purpose: they belong next to something this
 * kustomization does not deploy (the vLLM engines), and are applied there.
 */
const OUTSIDE_KUSTOMIZATION = ['vllm-podmonitor.yaml'];

function loadManifests(files: readonly string[]): Manifest[] {
  const manifests: Manifest[] = [];
  for (const file of files) {
    for (const doc of parseAllDocuments(readFileSync(join(K8S, file), 'utf8'))) {
      expect(doc.errors, file).toEqual([]);
      const value = doc.toJS() as Manifest | null;
      if (value !== null) manifests.push(value);
    }
  }
  return manifests;
}

const manifestFiles = readdirSync(K8S).filter((f) => f.endsWith('.yaml')).sort();
/** The gateway's manifests: what `kubectl apply -k deploy/kubernetes` applies. */
const manifests = loadManifests(manifestFiles.filter((f) => !OUTSIDE_KUSTOMIZATION.includes(f)));

function only(kind: string): Manifest {
  const found = manifests.filter((m) => m.kind === kind);
  expect(found, kind).toHaveLength(1);
  return found[0] as Manifest;
}

const deployment = only('Deployment');
const deploymentSpec = deployment.spec as DeploymentSpec;
const pod = deploymentSpec.template.spec;
const podLabels = deploymentSpec.template.metadata.labels;
const container = pod.containers[0] as Container;
const configMap = only('ConfigMap');

function matches(selector: Labels | undefined, labels: Labels): boolean {
  const entries = Object.entries(selector ?? {});
  return entries.length > 0 && entries.every(([k, v]) => labels[k] === v);
}

/** The env the Deployment gives the container: secret-sourced values stand in as placeholders. */
function containerEnv(): Record<string, string> {
  return Object.fromEntries((container.env ?? []).map((e) => [e.name, e.value ?? `from-secret-${e.valueFrom?.secretKeyRef?.key ?? ''}`]));
}

function mountedConfig(): Config {
  const text = configMap.data?.['config.yaml'];
  expect(text, 'the ConfigMap holds config.yaml').toBeTypeOf('string');
  const [doc] = parseAllDocuments(text ?? '');
  return parseConfig(doc?.toJS(), 'deploy/kubernetes/configmap.yaml', containerEnv());
}

/** Where the mounted config serves /healthz, /readyz and /metrics: the admin listener if it has one. */
function operationsPort(): number {
  const { server } = mountedConfig();
  return server.admin_port ?? server.port;
}

function probePort(probe: Probe | undefined): number | undefined {
  const port = probe?.httpGet?.port;
  return typeof port === 'number' ? port : container.ports.find((p) => p.name === port)?.containerPort;
}

describe('Kubernetes manifests', () => {
  it('parse, and kustomization.yaml lists every other manifest', () => {
    for (const m of manifests) {
      expect(m.apiVersion, m.kind).toBeTypeOf('string');
      expect(m.kind).toBeTypeOf('string');
    }
    const kustomization = only('Kustomization');
    const files = manifestFiles.filter((f) => f !== 'kustomization.yaml' && !OUTSIDE_KUSTOMIZATION.includes(f));
    expect([...(kustomization.resources ?? [])].sort()).toEqual(files);
    for (const file of OUTSIDE_KUSTOMIZATION) expect(manifestFiles, file).toContain(file);
  });

  it("the ConfigMap's config is valid with the environment the Deployment sets, and not without it", () => {
    const config = mountedConfig();
    const keyEnvs = new Set(configMap.data?.['config.yaml']?.match(/api_key_env:\s*(\S+)/g)?.map((l) => l.split(/:\s*/)[1]) ?? []);
    expect(keyEnvs.size).toBeGreaterThan(0);
    for (const name of keyEnvs) {
      const entry = container.env?.find((e) => e.name === name);
      expect(entry?.valueFrom?.secretKeyRef, `${name} comes from a Secret`).toBeDefined();
    }
    expect(config.pools.every((p) => p.upstreams.every((u) => u.apiKey !== undefined))).toBe(true);
    const [doc] = parseAllDocuments(configMap.data?.['config.yaml'] ?? '');
    expect(() => parseConfig(doc?.toJS(), 'configmap', {})).toThrow(/api_key_env: environment variable/);
  });

  it('mounts the config where the image looks for it', () => {
    const cmd = execForm(all(runtime, 'CMD')[0] ?? '[]');
    const path = container.args?.[container.args.indexOf('--config') + 1] ?? cmd[cmd.indexOf('--config') + 1] ?? '';
    expect(path).toBe('/etc/waybill/config.yaml');
    const mount = container.volumeMounts.find((m) => m.mountPath === '/etc/waybill');
    expect(mount?.readOnly).toBe(true);
    const volume = pod.volumes.find((v) => v.name === mount?.name);
    expect(volume?.configMap?.name).toBe(configMap.metadata.name);
    const item = volume?.configMap?.items?.find((i) => i.key === 'config.yaml');
    expect(item === undefined || item.path === 'config.yaml').toBe(true);
  });

  it('probes readiness on /readyz, liveness and start-up on /healthz, on the port Waybill serves them on', () => {
    const { server } = mountedConfig();
    expect(container.ports.map((p) => p.containerPort)).toContain(server.port);
    const port = operationsPort();
    if (server.admin_port !== undefined) {
      // The admin listener: a named container port of its own, reachable from the kubelet (not loopback-only).
      expect(container.ports.find((p) => p.name === 'admin')?.containerPort).toBe(server.admin_port);
      expect(server.admin_port).not.toBe(server.port);
      expect(server.admin_host ?? server.host).not.toMatch(/^(127\.|localhost$|::1$)/);
    }
    expect(container.readinessProbe?.httpGet?.path).toBe('/readyz');
    expect(container.livenessProbe?.httpGet?.path).toBe('/healthz');
    expect(container.startupProbe?.httpGet?.path).toBe('/healthz');
    for (const probe of [container.readinessProbe, container.livenessProbe, container.startupProbe]) expect(probePort(probe)).toBe(port);
  });

  it('gives the drain time: preStop, then grace + drain_timeout and the log flush, within terminationGracePeriodSeconds', () => {
    const { shutdown } = mountedConfig();
    const preStop = container.lifecycle?.preStop;
    const sleep = preStop?.sleep?.seconds ?? (preStop?.exec?.command[0] === 'sleep' ? Number(preStop.exec.command[1]) : Number.NaN);
    expect(sleep).toBeGreaterThan(0);
    const needed = sleep + (shutdown.graceMs + shutdown.drainTimeoutMs + EXIT_FLUSH_TIMEOUT_MS) / 1000;
    expect(pod.terminationGracePeriodSeconds ?? 30).toBeGreaterThan(needed);
  });

  it('requests resources, caps memory, and runs non-root on a read-only root filesystem', () => {
    expect(container.resources.requests?.cpu).toBeDefined();
    expect(container.resources.requests?.memory).toBeDefined();
    expect(container.resources.limits?.memory).toBeDefined();
    expect(pod.securityContext?.runAsNonRoot ?? container.securityContext?.runAsNonRoot).toBe(true);
    expect(pod.securityContext?.runAsUser ?? container.securityContext?.runAsUser).not.toBe(0);
    expect(container.securityContext?.readOnlyRootFilesystem).toBe(true);
    expect(container.securityContext?.allowPrivilegeEscalation).toBe(false);
  });

  it('selects the Deployment pods from the Service, PodDisruptionBudget and PodMonitor', () => {
    expect(matches(deploymentSpec.selector.matchLabels, podLabels)).toBe(true);
    const service = only('Service').spec as { selector: Labels; ports: Array<{ port: number; targetPort: string | number }> };
    expect(matches(service.selector, podLabels)).toBe(true);
    const port = mountedConfig().server.port;
    // The API only: with an admin listener, metrics and probes stay off the Service.
    for (const p of service.ports) {
      const target = typeof p.targetPort === 'number' ? p.targetPort : container.ports.find((c) => c.name === p.targetPort)?.containerPort;
      expect(target).toBe(port);
      expect(p.port).toBe(port);
    }
    const pdb = only('PodDisruptionBudget').spec as { selector: { matchLabels: Labels }; minAvailable?: number };
    expect(matches(pdb.selector.matchLabels, podLabels)).toBe(true);
    expect(pdb.minAvailable).toBeGreaterThanOrEqual(1);

    const monitor = only('PodMonitor').spec as { jobLabel?: string; selector: { matchLabels: Labels }; podMetricsEndpoints: Array<{ port: string; path: string }> };
    expect(matches(monitor.selector.matchLabels, podLabels)).toBe(true);
    for (const endpoint of monitor.podMetricsEndpoints) {
      expect(endpoint.path).toBe('/metrics');
      expect(container.ports.find((p) => p.name === endpoint.port)?.containerPort).toBe(operationsPort());
    }
    // The job label the Prometheus rules select on.
    expect(podLabels[monitor.jobLabel ?? '']).toBe('waybill');
  });

  it('scales the Deployment on the in-flight gauge Waybill exports', () => {
    const hpa = only('HorizontalPodAutoscaler');
    expect(hpa.apiVersion).toBe('autoscaling/v2');
    const spec = hpa.spec as { scaleTargetRef: { kind: string; name: string }; minReplicas: number; metrics: Array<{ type: string; pods?: { metric: { name: string } } }> };
    expect(spec.scaleTargetRef).toMatchObject({ kind: 'Deployment', name: deployment.metadata.name });
    expect(spec.minReplicas).toBeGreaterThanOrEqual(2);
    const names = spec.metrics.map((m) => m.pods?.metric.name);
    expect(names).toContain(METRICS.inflight.name);
    expect(METRICS.inflight.type).toBe('gauge');
  });
});

describe('vLLM PodMonitor', () => {
  const [monitor, ...others] = loadManifests(['vllm-podmonitor.yaml']);
  const spec = monitor?.spec as {
    selector: { matchLabels?: Labels };
    podMetricsEndpoints: Array<{ port?: string; path?: string; relabelings?: Array<{ action?: string; targetLabel?: string; replacement?: string; sourceLabels?: string[] }> }>;
  };

  it('is one PodMonitor that selects pods other than the gateway', () => {
    expect(others).toEqual([]);
    expect(monitor?.kind).toBe('PodMonitor');
    expect(monitor?.apiVersion).toBe('monitoring.coreos.com/v1');
    expect(Object.keys(spec.selector.matchLabels ?? {}).length).toBeGreaterThan(0);
    expect(matches(spec.selector.matchLabels, podLabels)).toBe(false);
  });

  it('scrapes /metrics under job="vllm", the job deploy/prometheus/vllm-rules.yaml selects', () => {
    const rules = readFileSync(join(ROOT, 'deploy', 'prometheus', 'vllm-rules.yaml'), 'utf8');
    expect(rules).toContain('job="vllm"');
    expect(spec.podMetricsEndpoints.length).toBeGreaterThan(0);
    for (const endpoint of spec.podMetricsEndpoints) {
      expect(endpoint.path).toBe('/metrics');
      expect(endpoint.port).toBeTypeOf('string');
      // The operator sets job before the endpoint's relabelings, so a fixed replacement here is what stays.
      const job = endpoint.relabelings?.find((r) => r.targetLabel === 'job');
      expect(job).toMatchObject({ action: 'replace', replacement: 'vllm' });
      expect(job?.sourceLabels).toBeUndefined();
    }
  });

  it("labels each engine's series with Waybill's upstream name, the pod's (docs/observability.md)", () => {
    for (const endpoint of spec.podMetricsEndpoints) {
      const upstream = endpoint.relabelings?.find((r) => r.targetLabel === 'upstream');
      expect(upstream).toMatchObject({ action: 'replace', sourceLabels: ['__meta_kubernetes_pod_name'] });
    }
  });
});
