/**
 * The Kubernetes manifests, the load balancers' configs, the Dockerfile and the docs, checked offline
 * (no cluster, no Docker engine on the test machines): every YAML document parses and is a kind we
 * mean; every Secret, ConfigMap, Service, ServiceAccount, claim and Role it refers to exists (or
 * docs/kubernetes.md creates it, before the manifests that need it); Services select pods that
 * expose their target ports; every container asks for resources and is bounded; ebb's container
 * args are flags `ebb` accepts; every probe path answers on the listener its port names, asked of
 * real ebb processes started with the manifests' own args; nginx and HAProxy parse their configs;
 * the Dockerfile's entry point is a file the build makes; README and docs/ name only commands,
 * flags and files that exist.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import { Agent, fetch as fetchWith } from 'undici';
import { CLI, spawnEbb, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';
import { durationOption } from '../src/cli/options.js';
import { makeCert } from './helpers/tls.js';
import { skipWithout } from './helpers/required-tool.js';
import { EVICTION_PATH } from '../src/k8s/webhook-server.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const DEPLOY = join(ROOT, 'deploy', 'kubernetes');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
/** The page that creates the Secrets and applies the manifests. */
const KUBERNETES_DOC = 'docs/kubernetes.md';
const KUBERNETES = readFileSync(join(ROOT, KUBERNETES_DOC), 'utf8');
/** The walk-through docs/kubernetes.md links: it creates Secrets and applies manifests too. */
const WALKTHROUGH = 'docs/kubernetes-vllm.md';
/** README and every docs page (the generated flag reference aside: it is the CLI's own). */
const DOC_FILES = ['README.md', ...readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md') && f !== 'configuration.md').map((f) => `docs/${f}`)];
const DOCS = new Map(DOC_FILES.map((f) => [f, readFileSync(join(ROOT, f), 'utf8')]));
const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

/* eslint-disable @typescript-eslint/no-explicit-any -- manifests are untyped YAML */
type Doc = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> }; spec?: any; subjects?: any[]; roleRef?: any; rules?: any[]; webhooks?: any[] };
type Container = { name: string; image: string; args?: string[]; command?: string[]; env?: Array<{ name: string; valueFrom?: any }>; ports?: Array<{ name?: string; containerPort: number }>; livenessProbe?: any; readinessProbe?: any; startupProbe?: any; lifecycle?: any; volumeMounts?: Array<{ name: string }>; resources?: any };
type PodSpec = { containers: Container[]; initContainers?: Container[]; volumes?: any[]; serviceAccountName?: string };

const KINDS: Record<string, string[]> = {
  v1: ['Namespace', 'ServiceAccount', 'Service', 'ConfigMap', 'Secret', 'PersistentVolumeClaim'],
  'apps/v1': ['Deployment', 'StatefulSet'],
  'rbac.authorization.k8s.io/v1': ['Role', 'RoleBinding'],
  'admissionregistration.k8s.io/v1': ['ValidatingWebhookConfiguration'],
  'networking.k8s.io/v1': ['NetworkPolicy', 'Ingress'],
  'policy/v1': ['PodDisruptionBudget'],
  'gateway.networking.k8s.io/v1': ['HTTPRoute'],
  'inference.networking.k8s.io/v1': ['InferencePool'],
  'inference.networking.x-k8s.io/v1alpha2': ['InferenceObjective'],
  'monitoring.coreos.com/v1': ['PodMonitor', 'ServiceMonitor'],
  'autoscaling/v2': ['HorizontalPodAutoscaler'],
  'keda.sh/v1alpha1': ['ScaledObject'],
};
/** Kinds that live in no namespace. */
const CLUSTER_SCOPED = new Set(['Namespace', 'ValidatingWebhookConfiguration']);

const files = readdirSync(DEPLOY).filter((f) => f.endsWith('.yaml') || f.endsWith('.yml')).sort();
const docsOf = (file: string): Doc[] => (loadAll(readFileSync(join(DEPLOY, file), 'utf8')) as unknown[]).filter((d) => d !== null && d !== undefined) as Doc[];
const byFile = new Map(files.map((f) => [f, docsOf(f)]));
const docs = [...byFile.values()].flat();
const named = (kind: string, name: string) => docs.find((d) => d.kind === kind && d.metadata.name === name);
const workloads = docs.filter((d) => d.kind === 'Deployment' || d.kind === 'StatefulSet');
const podSpec = (w: Doc): PodSpec => w.spec.template.spec as PodSpec;
const allContainers = (p: PodSpec): Container[] => [...(p.initContainers ?? []), ...p.containers];
const ebbContainers = (p: PodSpec) => allContainers(p).filter((c) => /^ebb:/.test(c.image));

/**
 * The Secrets a page creates with `kubectl create secret generic NAME --from-literal=KEY=...` or
 * `kubectl create secret tls NAME --cert=... --key=...` (keys tls.crt and tls.key), with their keys,
 * line and literal values.
 */
function readmeSecrets(text = KUBERNETES): Map<string, { keys: string[]; line: number; values: Map<string, string> }> {
  const out = new Map<string, { keys: string[]; line: number; values: Map<string, string> }>();
  text.split('\n').forEach((l, line) => {
    const m = /kubectl .*create secret generic ([a-z0-9-]+)(.*)$/.exec(l);
    if (m) {
      const values = new Map([...m[2]!.matchAll(/--from-literal=([a-z0-9.-]+)=(\S+)/g)].map((k) => [k[1]!, k[2]!.replace(/^["']|["']$/g, '')]));
      out.set(m[1]!, { keys: [...m[2]!.matchAll(/--from-(?:literal|file)=([a-z0-9.-]+)[=\s]/g)].map((k) => k[1]!), line, values });
    }
    const t = /kubectl .*create secret tls ([a-z0-9-]+) .*--cert[= ]\S+.*--key[= ]\S+/.exec(l);
    if (t) out.set(t[1]!, { keys: ['tls.crt', 'tls.key'], line, values: new Map() });
  });
  return out;
}

/** Secrets a set of documents needs, by name, with the keys they read. */
function secretsNeeded(ds: Doc[]): Map<string, Set<string>> {
  const need = new Map<string, Set<string>>();
  const add = (name: string, key?: string) => {
    const keys = need.get(name) ?? new Set<string>();
    if (key !== undefined) keys.add(key);
    need.set(name, keys);
  };
  for (const w of ds.filter((d) => workloads.includes(d))) {
    const p = podSpec(w);
    for (const v of p.volumes ?? []) if (v.secret) for (const item of v.secret.items ?? [undefined]) add(v.secret.secretName, item?.key);
    for (const c of allContainers(p)) for (const e of c.env ?? []) if (e.valueFrom?.secretKeyRef) add(e.valueFrom.secretKeyRef.name, e.valueFrom.secretKeyRef.key);
  }
  return need;
}

/** What `ebb COMMAND [SUBCOMMAND] --help` lists: its long flags ("--flag <value>", "--no-flag") and its subcommands. */
const helps = new Map<string, { flags: Set<string>; commands: Set<string> }>();
function helpOf(command: string): { flags: Set<string>; commands: Set<string> } {
  let help = helps.get(command);
  if (help === undefined) {
    const res = spawnSync(process.execPath, [CLI, ...command.split(' ').filter((w) => w !== ''), '--help'], { encoding: 'utf8', timeout: 30_000 });
    assert.equal(res.status, 0, `ebb ${command} --help: ${res.stderr}`);
    const at = res.stdout.search(/^(?:[A-Za-z ]+ )?[Cc]ommands:$/m);
    const [options, commands] = at < 0 ? [res.stdout, ''] : [res.stdout.slice(0, at), res.stdout.slice(at)];
    help = {
      flags: new Set([...options.matchAll(/(?:^|[\s,])(--[a-z0-9-]+)/g)].map((m) => m[1]!)),
      commands: new Set([...commands.matchAll(/^ {2}([a-z][a-z-]*)\b/gm)].map((m) => m[1]!)),
    };
    helps.set(command, help);
  }
  return help;
}
const flagsOf = (command: string): Set<string> => helpOf(command).flags;

/** Checks an `ebb` command line (args after the program name): a real command, only flags it accepts. */
function checkEbbArgs(args: string[], where: string, env: string[] = []): void {
  const [command, ...rest] = args;
  assert.ok(command !== undefined && !command.startsWith('-'), `${where}: the first arg names an ebb command`);
  const flags = flagsOf(command);
  for (const a of rest) {
    for (const v of a.matchAll(/\$\(([A-Z_]+)\)/g)) assert.ok(env.includes(v[1]!), `${where}: ${a} uses $(${v[1]}), which the container's env does not define`);
    if (!a.startsWith('--')) continue;
    const flag = a.split('=')[0]!;
    assert.ok(flags.has(flag), `${where}: ebb ${command} has no flag ${flag} (ebb ${command} --help)`);
  }
}

/** The value of `--flag=v` or `--flag v` in an arg list. */
function argValue(args: string[], flag: string): string | undefined {
  for (let i = 0; i < args.length; i++) {
    if (args[i] === flag) return args[i + 1];
    if (args[i]!.startsWith(`${flag}=`)) return args[i]!.slice(flag.length + 1);
  }
  return undefined;
}

/** Whether a pod template's labels satisfy a label selector (matchLabels, matchExpressions In / Exists). */
function selects(selector: { matchLabels?: Record<string, string>; matchExpressions?: Array<{ key: string; operator: string; values?: string[] }> }, labels: Record<string, string>): boolean {
  const byLabel = Object.entries(selector.matchLabels ?? {}).every(([k, v]) => labels[k] === v);
  const byExpression = (selector.matchExpressions ?? []).every((e) => (e.operator === 'In' ? e.values!.includes(labels[e.key] ?? '') : e.operator === 'Exists' ? e.key in labels : assert.fail(`selector operator ${e.operator}`)));
  return byLabel && byExpression;
}
const templateLabels = (w: Doc) => w.spec.template.metadata.labels as Record<string, string>;

/**
 * The RBAC verbs ebb's Kubernetes client can exercise, per "apiGroup/resource": read from the calls
 * src/k8s/client.ts makes (@kubernetes/client-node's readNamespacedPod is a get, and so on).
 */
function verbsTheCodeUses(): Map<string, Set<string>> {
  const source = readFileSync(join(ROOT, 'src', 'k8s', 'client.ts'), 'utf8');
  const verbOf: Record<string, string> = { read: 'get', list: 'list', patch: 'patch', delete: 'delete', create: 'create', replace: 'update' };
  const resourceOf: Record<string, string> = { Pod: '/pods', DeploymentScale: 'apps/deployments/scale' };
  const used = new Map<string, Set<string>>();
  const add = (resource: string, verb: string) => used.set(resource, (used.get(resource) ?? new Set()).add(verb));
  for (const [, call, kind] of source.matchAll(/\.(read|list|patch|delete|create|replace)Namespaced(Pod|DeploymentScale)\(/g)) add(resourceOf[kind!]!, verbOf[call!]!);
  if (/(?:\.watch\(|watchPath\(watcher,)\s*`\/api\/v1\/namespaces\/\$\{[^}]+\}\/pods`/.test(source)) add('/pods', 'watch');
  return used;
}

/** Metric names a file mentions (comments included): ebb's, and the vLLM names the pickers read. */
/**
 * Metric names a manifest reads. The Grafana dashboard's ConfigMap is left out: its queries span
 * pages no single manifest process serves (a worker's adapters), and grafana-dashboard.test.ts runs
 * every one of them against a real Prometheus scraping a fleet that serves them all.
 */
const metricNamesIn = (file: string) =>
  new Set(
    readFileSync(join(DEPLOY, file), 'utf8')
      .split(/^---$/m)
      .filter((doc) => !/^\s+grafana_dashboard:/m.test(doc))
      .flatMap((doc) => [...doc.matchAll(/\b(?:ebb_[a-z0-9_]*[a-z0-9]|vllm:[a-z_]*[a-z])\b(?!\*)/g)].map((m) => m[0])),
  );

describe('deploy/kubernetes: documents', () => {
  it('every file parses; every document is a kind we mean, named, in the ebb namespace', () => {
    assert.ok(files.length >= 5, `manifests found: ${files.join(', ')}`);
    for (const [file, ds] of byFile) {
      assert.ok(ds.length > 0, `${file}: no document`);
      for (const d of ds) {
        const where = `${file}: ${d.kind}/${d.metadata?.name}`;
        assert.ok(KINDS[d.apiVersion]?.includes(d.kind), `${where}: unexpected apiVersion/kind ${d.apiVersion} ${d.kind}`);
        assert.match(d.metadata?.name ?? '', /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, `${where}: a DNS-1123 name`);
        if (CLUSTER_SCOPED.has(d.kind)) assert.equal(d.metadata.namespace, undefined, `${where}: cluster-scoped, no namespace`);
        else assert.equal(d.metadata.namespace, 'ebb', `${where}: namespace`);
      }
    }
    assert.ok(named('Namespace', 'ebb'), 'the ebb Namespace');
  });

  it('workloads select their own pods, and every name they refer to exists', () => {
    const secrets = readmeSecrets();
    for (const w of workloads) {
      const where = `${w.kind}/${w.metadata.name}`;
      const labels = w.spec.template.metadata.labels as Record<string, string>;
      for (const [k, v] of Object.entries(w.spec.selector.matchLabels as Record<string, string>)) assert.equal(labels[k], v, `${where}: selector ${k}=${v} matches its template`);
      const p = podSpec(w);
      if (p.serviceAccountName !== undefined) assert.ok(named('ServiceAccount', p.serviceAccountName), `${where}: ServiceAccount ${p.serviceAccountName}`);
      const volumes = new Set((p.volumes ?? []).map((v: { name: string }) => v.name));
      for (const t of w.spec.volumeClaimTemplates ?? []) volumes.add(t.metadata.name);
      for (const c of allContainers(p)) for (const m of c.volumeMounts ?? []) assert.ok(volumes.has(m.name), `${where}/${c.name}: volume ${m.name}`);
      for (const v of p.volumes ?? []) {
        if (v.persistentVolumeClaim) assert.ok(named('PersistentVolumeClaim', v.persistentVolumeClaim.claimName), `${where}: claim ${v.persistentVolumeClaim.claimName}`);
        if (v.configMap) assert.ok(named('ConfigMap', v.configMap.name), `${where}: ConfigMap ${v.configMap.name}`);
      }
      for (const [name, keys] of secretsNeeded([w])) {
        const made = named('Secret', name) ? undefined : secrets.get(name);
        assert.ok(named('Secret', name) || made, `${where}: Secret ${name} is neither a manifest nor created in ${KUBERNETES_DOC}`);
        for (const key of keys) if (made) assert.ok(made.keys.includes(key), `${where}: ${KUBERNETES_DOC}'s Secret ${name} has no key ${key} (it has ${made.keys.join(', ')})`);
      }
      if (w.kind === 'StatefulSet') {
        const svc = named('Service', w.spec.serviceName);
        assert.ok(svc, `${where}: serviceName ${w.spec.serviceName}`);
        assert.equal(svc.spec.clusterIP, 'None', `${where}: its serviceName Service is headless (clusterIP: None)`);
      }
    }
    for (const rb of docs.filter((d) => d.kind === 'RoleBinding')) {
      assert.ok(named(rb.roleRef.kind, rb.roleRef.name), `RoleBinding/${rb.metadata.name}: ${rb.roleRef.kind} ${rb.roleRef.name}`);
      for (const s of rb.subjects ?? []) assert.ok(named(s.kind, s.name), `RoleBinding/${rb.metadata.name}: ${s.kind} ${s.name}`);
    }
  });

  it('every Service selects pods that expose its target ports', () => {
    for (const svc of docs.filter((d) => d.kind === 'Service')) {
      const selector = svc.spec.selector as Record<string, string>;
      const pods = workloads.filter((w) => Object.entries(selector).every(([k, v]) => w.spec.template.metadata.labels?.[k] === v));
      assert.ok(pods.length > 0, `Service/${svc.metadata.name}: selects no pod`);
      for (const port of svc.spec.ports as Array<{ port: number; targetPort?: string | number }>) {
        const target = port.targetPort ?? port.port;
        for (const w of pods) {
          const exposed = allContainers(podSpec(w)).flatMap((c) => c.ports ?? []);
          assert.ok(exposed.some((p) => p.name === target || p.containerPort === target), `Service/${svc.metadata.name}: ${w.kind}/${w.metadata.name} exposes no port ${target}`);
        }
      }
    }
  });

  for (const doc of [KUBERNETES_DOC, WALKTHROUGH])
  it(`${doc} creates the Secret after the namespace and before applying any manifest that needs it`, () => {
    const text = readFileSync(join(ROOT, doc), 'utf8');
    const lines = text.split('\n');
    const secrets = readmeSecrets(text);
    const namespaceAt = lines.findIndex((l) => /kubectl .*apply .*deploy\/kubernetes\/namespace\.yaml/.test(l));
    assert.ok(namespaceAt >= 0, `${doc} applies namespace.yaml`);
    let applies = 0;
    lines.forEach((l, at) => {
      if (!/kubectl .*apply /.test(l)) return;
      for (const [, path] of l.matchAll(/-f\s+(deploy\/kubernetes\/[^\s]*)/g)) {
        const name = path!.replace('deploy/kubernetes/', '').replace(/\/$/, '');
        const ds = name === '' ? docs : (byFile.get(name) ?? assert.fail(`${doc} applies ${path}, which does not exist`));
        applies++;
        for (const secret of secretsNeeded(ds).keys()) {
          const made = secrets.get(secret);
          assert.ok(made !== undefined && made.line < at, `${doc} line ${at + 1} applies ${path}, which needs Secret ${secret}, before creating it`);
          assert.ok(namespaceAt < made.line, 'the Secret is created in a namespace that exists: after namespace.yaml');
        }
      }
    });
    assert.ok(applies > 1, `${doc} applies the manifests`);
  });

  it(`README links ${KUBERNETES_DOC}, which links ${WALKTHROUGH}`, () => {
    assert.ok(README.includes(`(${KUBERNETES_DOC})`), `README links ${KUBERNETES_DOC}`);
    assert.ok(KUBERNETES.includes(`(${WALKTHROUGH.replace('docs/', '')})`), `${KUBERNETES_DOC} links ${WALKTHROUGH}`);
  });
});

describe('deploy/kubernetes: the InferencePool (GA: inference.networking.k8s.io/v1)', () => {
  const pools = docs.filter((d) => d.kind === 'InferencePool');

  it("has v1's schema: selector.matchLabels, one of targetPorts, endpointPickerRef to the picker's Service port; no alpha pool left", () => {
    assert.ok(pools.length >= 1, 'an example InferencePool');
    for (const pool of pools) {
      const where = `InferencePool/${pool.metadata.name}`;
      assert.equal(pool.apiVersion, 'inference.networking.k8s.io/v1', where);
      assert.deepEqual(Object.keys(pool.spec).sort(), ['endpointPickerRef', 'selector', 'targetPorts'], `${where}: v1's spec fields only (v1alpha2's targetPortNumber and extensionRef are gone)`);
      assert.deepEqual(Object.keys(pool.spec.selector), ['matchLabels'], `${where}: v1's selector is matchLabels alone`);
      assert.equal(pool.spec.targetPorts.length, 1, `${where}: v1 takes exactly one target port`);
      assert.ok(Number.isInteger(pool.spec.targetPorts[0].number), `${where}: targetPorts[0].number`);
      const ref = pool.spec.endpointPickerRef;
      assert.match(ref.name, /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, `${where}: endpointPickerRef.name`);
      if ((ref.kind ?? 'Service') === 'Service') assert.ok(Number.isInteger(ref.port?.number), `${where}: a Service picker needs endpointPickerRef.port.number`);
      assert.ok(['FailOpen', 'FailClose'].includes(ref.failureMode ?? 'FailClose'), `${where}: failureMode`);
    }
    assert.ok(!docs.some((d) => d.kind === 'InferencePool' && d.apiVersion !== 'inference.networking.k8s.io/v1'), 'no v1alpha2 pool: every supported gateway reads v1');
  });

  it('has InferenceObjectives (InferenceModel\'s successor) naming a pool of the manifests', () => {
    const objectives = docs.filter((d) => d.kind === 'InferenceObjective');
    assert.ok(objectives.length >= 1, 'an example InferenceObjective');
    for (const o of objectives) {
      const where = `InferenceObjective/${o.metadata.name}`;
      assert.ok(Number.isInteger(o.spec.priority), `${where}: an integer priority`);
      assert.equal(o.spec.poolRef.group, 'inference.networking.k8s.io', `${where}: names the v1 pool's group`);
      assert.equal(o.spec.poolRef.kind ?? 'InferencePool', 'InferencePool');
      assert.ok(named('InferencePool', o.spec.poolRef.name), `${where}: pool ${o.spec.poolRef.name}`);
    }
  });

  it("selects ebb worker pods and targets the OpenAI port they expose and serve (--openai-port, off loopback, aggregated); the picker's metrics are on their system port", () => {
    for (const pool of pools) {
      const where = `InferencePool/${pool.metadata.name}`;
      const target = pool.spec.targetPorts[0].number as number;
      const selected = workloads.filter((w) => Object.entries(pool.spec.selector.matchLabels as Record<string, string>).every(([k, v]) => w.spec.template.metadata.labels?.[k] === v));
      assert.ok(selected.length > 0, `${where}: selects no pod`);
      for (const w of selected) {
        const worker = ebbContainers(podSpec(w)).find((c) => c.args?.[0] === 'worker') ?? assert.fail(`${where}: ${w.metadata.name} runs no ebb worker`);
        const args = worker.args!;
        const port = (worker.ports ?? []).find((p) => p.containerPort === target) ?? assert.fail(`${where}: ${w.metadata.name} exposes no port ${target}`);
        assert.ok(port.name, `${where}: ${w.metadata.name}'s port ${target} is named`);
        // The picker forwards the client's OpenAI request: the target must be the worker's OpenAI listener, not its request plane.
        assert.equal(argValue(args, '--openai-port'), String(target), `${where}: ${w.metadata.name} serves the OpenAI API (--openai-port) on the target port`);
        assert.notEqual(argValue(args, '--port'), String(target), `${where}: the target is not the request plane`);
        assert.ok(!/^(127\.|localhost$|::1$)/.test(argValue(args, '--host') ?? '127.0.0.1'), `${where}: ${w.metadata.name} binds --openai-port (on --host) off loopback, where the Gateway reaches it`);
        assert.equal(argValue(args, '--mode') ?? 'aggregated', 'aggregated', `${where}: --openai-port needs an aggregated worker`);
        assert.ok(argValue(args, '--system-port'), `${where}: ${w.metadata.name} serves /metrics on a system port`);
      }
    }
    const comment = readFileSync(join(DEPLOY, 'inference-pool.yaml'), 'utf8').replace(/\n# ?/g, ' ');
    for (const said of [/--model-server-metrics-port=9090/, /helm install \S+ oci:\/\/registry\.k8s\.io\/gateway-api-inference-extension\/charts\/inferencepool/, /not migrated/, /handed off/, /not resumable/, /drain-aware/, /Which to use/])
      assert.match(comment, said, "the comment names the picker's install, where it reads metrics, what it gives up compared with the frontend, and when to use which");
  });
});

describe('deploy/kubernetes: monitoring, autoscaling and the operator\'s RBAC', () => {
  it('every PodMonitor and ServiceMonitor selects ebb pods (or Services) that expose the port it scrapes; scrape annotations name an exposed port', () => {
    const monitors = docs.filter((d) => d.kind === 'PodMonitor' || d.kind === 'ServiceMonitor');
    assert.ok(monitors.some((m) => m.kind === 'PodMonitor'), 'a PodMonitor');
    for (const m of monitors) {
      const where = `${m.kind}/${m.metadata.name}`;
      if (m.kind === 'PodMonitor') {
        const pods = workloads.filter((w) => selects(m.spec.selector, templateLabels(w)));
        assert.ok(pods.length > 0, `${where}: selects no pod`);
        for (const w of pods) for (const e of m.spec.podMetricsEndpoints) assert.ok(ebbContainers(podSpec(w)).some((c) => (c.ports ?? []).some((p) => p.name === e.port)), `${where}: ${w.metadata.name} has no ebb port named ${e.port}`);
      } else {
        const services = docs.filter((d) => d.kind === 'Service' && selects(m.spec.selector, d.metadata.labels ?? {}));
        assert.ok(services.length > 0, `${where}: selects no Service`);
        for (const svc of services) for (const e of m.spec.endpoints) assert.ok((svc.spec.ports as Array<{ name?: string }>).some((p) => p.name === e.port), `${where}: Service ${svc.metadata.name} has no port ${e.port}`);
      }
    }
    const annotated = workloads.filter((w) => w.spec.template.metadata.annotations?.['prometheus.io/scrape'] === 'true');
    assert.ok(annotated.length >= 4, 'the workers and the frontend carry scrape annotations');
    for (const w of annotated) {
      const port = Number(w.spec.template.metadata.annotations['prometheus.io/port']);
      assert.ok(ebbContainers(podSpec(w)).some((c) => (c.ports ?? []).some((p) => p.containerPort === port)), `${w.metadata.name}: prometheus.io/port ${port} is an ebb container's port`);
    }
  });

  it('every HPA and ScaledObject scales a Deployment of ebb workers, on metrics of the model those workers serve', () => {
    const scalers = docs.filter((d) => d.kind === 'HorizontalPodAutoscaler' || d.kind === 'ScaledObject');
    assert.deepEqual(scalers.map((d) => d.kind).sort(), ['HorizontalPodAutoscaler', 'ScaledObject']);
    for (const a of scalers) {
      const where = `${a.kind}/${a.metadata.name}`;
      const target = named('Deployment', a.spec.scaleTargetRef.name) ?? assert.fail(`${where}: Deployment ${a.spec.scaleTargetRef.name}`);
      const models = ebbContainers(podSpec(target)).filter((c) => c.args?.[0] === 'worker').map((c) => argValue(c.args!, '--model'));
      assert.ok(models.length > 0, `${where}: ${target.metadata.name} runs ebb workers`);
      const asked = a.kind === 'HorizontalPodAutoscaler'
        ? (a.spec.metrics as any[]).map((m) => m.external?.metric?.selector?.matchLabels?.model as string | undefined)
        : (a.spec.triggers as any[]).map((t) => /model="([^"]+)"/.exec(t.metadata.query as string)?.[1]);
      for (const model of asked) assert.ok(models.includes(model), `${where}: a metric for model ${model}, which ${target.metadata.name} does not serve (${models.join(', ')})`);
      assert.ok(a.kind === 'ScaledObject' ? a.spec.minReplicaCount >= 2 : a.spec.minReplicas >= 2, `${where}: never below the 2 replicas a rollout needs`);
    }
  });

  it('every Role verb is one ebb\'s Kubernetes client uses; the operator\'s Role has exactly what rollout and scale-down call', () => {
    const used = verbsTheCodeUses();
    assert.deepEqual([...(used.get('/pods') ?? [])].sort(), ['delete', 'get', 'list', 'patch', 'watch'], 'the calls read from src/k8s/client.ts');
    const granted = (role: Doc) => {
      const out = new Map<string, Set<string>>();
      for (const rule of role.rules ?? []) for (const g of rule.apiGroups) for (const r of rule.resources) out.set(`${g}/${r}`, new Set([...(out.get(`${g}/${r}`) ?? []), ...rule.verbs]));
      return out;
    };
    for (const role of docs.filter((d) => d.kind === 'Role')) {
      for (const [resource, verbs] of granted(role)) for (const v of verbs) assert.ok(used.get(resource)?.has(v), `Role/${role.metadata.name}: ${v} on ${resource}, which ebb never calls`);
    }
    const operator = named('Role', 'ebb-operator') ?? assert.fail('a Role for the operator commands');
    assert.deepEqual(new Map([...granted(operator)].map(([r, v]) => [r, [...v].sort()])), new Map([...used].map(([r, v]) => [r, [...v].sort()])), 'the operator Role: the calls ebb rollout and ebb scale-down (--k8s-scale) make');
    assert.ok(docs.some((d) => d.kind === 'RoleBinding' && d.roleRef.name === 'ebb-operator'), 'bound');
  });
});

describe('deploy/kubernetes: the eviction guard webhook', () => {
  const hooks = docs.filter((d) => d.kind === 'ValidatingWebhookConfiguration').flatMap((d) => (d.webhooks ?? []).map((w: any) => ({ where: `ValidatingWebhookConfiguration/${d.metadata.name} webhook ${w.name}`, w })));
  const guard = workloads.find((w) => ebbContainers(podSpec(w)).some((c) => c.args?.[0] === 'eviction-guard')) ?? assert.fail('a workload runs `ebb eviction-guard`');
  const guardContainer = ebbContainers(podSpec(guard)).find((c) => c.args?.[0] === 'eviction-guard')!;
  const guardArgs = guardContainer.args!;

  it("calls the guard: its Service, a Service port that reaches the guard's --port, the path the guard serves", () => {
    assert.ok(hooks.length >= 1, 'a webhook for the guard');
    for (const { where, w } of hooks) {
      assert.equal(w.clientConfig.url, undefined, `${where}: called through its Service, not a URL`);
      const ref = w.clientConfig.service;
      const svc = named('Service', ref.name);
      assert.ok(svc && svc.metadata.namespace === ref.namespace, `${where}: Service ${ref.namespace}/${ref.name} exists`);
      const labels = guard.spec.template.metadata.labels as Record<string, string>;
      assert.ok(Object.entries(svc.spec.selector as Record<string, string>).every(([k, v]) => labels[k] === v), `${where}: Service ${ref.name} selects the guard's pods`);
      const port = (svc.spec.ports as Array<{ port: number; targetPort?: string | number }>).find((p) => p.port === (ref.port ?? 443)) ?? assert.fail(`${where}: Service ${ref.name} has port ${ref.port ?? 443}`);
      const target = port.targetPort ?? port.port;
      const containerPort = (guardContainer.ports ?? []).find((p) => p.name === target || p.containerPort === target) ?? assert.fail(`${where}: the guard exposes ${target}`);
      assert.equal(String(containerPort.containerPort), argValue(guardArgs, '--port'), `${where}: the Service reaches the guard's --port`);
      assert.equal(ref.path, EVICTION_PATH, `${where}: the path the guard serves`);
    }
  });

  it('asks for CREATE pods/eviction in the ebb namespace only, v1 reviews, NoneOnDryRun, a timeout above the guard\'s, an explicit failurePolicy', () => {
    const apiTimeoutS = durationOption(argValue(guardArgs, '--api-timeout') ?? '5s') / 1000;
    for (const { where, w } of hooks) {
      assert.ok(w.admissionReviewVersions.includes('v1'), `${where}: AdmissionReview v1`);
      assert.deepEqual(w.rules, [{ apiGroups: [''], apiVersions: ['v1'], operations: ['CREATE'], resources: ['pods/eviction'], scope: 'Namespaced' }], `${where}: rules`);
      assert.equal(w.sideEffects, 'NoneOnDryRun', `${where}: the guard annotates pods, except on a dry run`);
      assert.ok(['Ignore', 'Fail'].includes(w.failurePolicy), `${where}: failurePolicy chosen, not defaulted`);
      assert.ok(Number.isInteger(w.timeoutSeconds) && w.timeoutSeconds <= 30 && w.timeoutSeconds > apiTimeoutS, `${where}: timeoutSeconds ${w.timeoutSeconds} leaves room above the guard's --api-timeout (${apiTimeoutS} s)`);
      // For pods/eviction the objectSelector sees the Eviction's labels, never the pod's.
      assert.ok(w.objectSelector === undefined || Object.keys(w.objectSelector).length === 0, `${where}: no objectSelector (it would match the Eviction object, which carries no pod labels)`);
      assert.equal(w.namespaceSelector?.matchLabels?.['kubernetes.io/metadata.name'], 'ebb', `${where}: only the ebb namespace`);
    }
  });

  it("admits only the API server: a NetworkPolicy on the guard's pods lets in ipBlocks alone, on the webhook port", () => {
    const labels = guard.spec.template.metadata.labels as Record<string, string>;
    const policies = docs.filter((d) => d.kind === 'NetworkPolicy' && Object.entries((d.spec.podSelector?.matchLabels ?? {}) as Record<string, string>).every(([k, v]) => labels[k] === v));
    assert.ok(policies.length >= 1, "a NetworkPolicy selects the guard's pods");
    const webhookPorts = (guardContainer.ports ?? []).flatMap((p) => [p.name, p.containerPort]);
    for (const np of policies) {
      const where = `NetworkPolicy/${np.metadata.name}`;
      assert.ok(Object.keys(np.spec.podSelector.matchLabels).length > 0, `${where}: selects by label, not every pod`);
      assert.ok((np.spec.policyTypes as string[]).includes('Ingress'), `${where}: restricts ingress`);
      assert.ok(np.spec.ingress.length > 0, `${where}: lets the API server in`);
      for (const rule of np.spec.ingress) {
        assert.ok(rule.from?.length > 0 && rule.from.every((f: any) => f.ipBlock?.cidr && !f.podSelector && !f.namespaceSelector), `${where}: from the API server's addresses only (ipBlock), no pod`);
        assert.ok(rule.ports?.length > 0 && rule.ports.every((p: any) => webhookPorts.includes(p.port)), `${where}: the guard's webhook port only`);
      }
    }
  });

  it("the API server's admission config presents a client certificate to the webhook's Service name", () => {
    const dir = join(DEPLOY, 'apiserver');
    const [config] = loadAll(readFileSync(join(dir, 'admission-config.yaml'), 'utf8')) as any[];
    assert.equal(config.kind, 'AdmissionConfiguration');
    const plugin = config.plugins.find((p: any) => p.name === 'ValidatingAdmissionWebhook') ?? assert.fail('a ValidatingAdmissionWebhook plugin configuration');
    const kubeconfigFile = plugin.configuration.kubeConfigFile as string;
    const [kubeconfig] = loadAll(readFileSync(join(dir, kubeconfigFile.slice(kubeconfigFile.lastIndexOf('/') + 1)), 'utf8')) as any[];
    for (const { where, w } of hooks) {
      const ref = w.clientConfig.service;
      const name = `${ref.name}.${ref.namespace}.svc${(ref.port ?? 443) === 443 ? '' : `:${ref.port}`}`;
      const user = kubeconfig.users.find((u: any) => u.name === name) ?? assert.fail(`${where}: the kubeconfig has a user named ${name}, which the API server matches to the webhook`);
      assert.ok((user.user['client-certificate'] || user.user['client-certificate-data']) && (user.user['client-key'] || user.user['client-key-data']), `${where}: ${name} presents a client certificate`);
    }
  });

  it('runs with RBAC to get and patch pods, and the TLS files its flags name mounted from a Secret', () => {
    const sa = podSpec(guard).serviceAccountName ?? assert.fail('the guard has its own ServiceAccount');
    const roles = docs.filter((d) => d.kind === 'RoleBinding' && d.subjects?.some((s) => s.kind === 'ServiceAccount' && s.name === sa)).map((rb) => named(rb.roleRef.kind, rb.roleRef.name)!);
    const verbs = new Set(roles.flatMap((r) => (r.rules ?? []).filter((rule) => rule.apiGroups.includes('') && rule.resources.includes('pods')).flatMap((rule) => rule.verbs as string[])));
    for (const v of ['get', 'patch']) assert.ok(verbs.has(v), `ServiceAccount ${sa} may ${v} pods`);
    for (const flag of ['--tls-cert-file', '--tls-key-file', '--client-ca-file']) {
      const file = argValue(guardArgs, flag) ?? assert.fail(flag);
      const mount = ((guardContainer.volumeMounts ?? []) as Array<{ name: string; mountPath: string }>).find((m) => file.startsWith(`${m.mountPath}/`)) ?? assert.fail(`${flag} ${file} is on a mount`);
      const volume = podSpec(guard).volumes?.find((v) => v.name === mount.name);
      assert.ok(volume?.secret, `${flag}: from a Secret`);
      const items = (volume.secret.items ?? []) as Array<{ path: string }>;
      assert.ok(items.length === 0 || items.some((i) => `${mount.mountPath}/${i.path}` === file), `${flag}: the Secret volume has ${file}`);
    }
  });
});

/** A Kubernetes quantity ("500m", "2", "512Mi", "1Gi") as a number (cores, bytes). */
function quantity(q: string | number): number {
  const m = /^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G)?$/.exec(String(q)) ?? assert.fail(`not a quantity: ${q}`);
  const unit = { m: 1e-3, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9 }[m[2] ?? ''] ?? 1;
  return Number(m[1]) * unit;
}

/** A Go duration ("0s", "3600s", "1h") in seconds. */
function seconds(d: string): number {
  const m = /^(\d+)(ms|s|m|h)$/.exec(d) ?? assert.fail(`not a duration: ${d}`);
  return Number(m[1]) * { ms: 1e-3, s: 1, m: 60, h: 3600 }[m[2] as 'ms' | 's' | 'm' | 'h'];
}

describe('deploy/kubernetes: what a cluster accepts as it is', () => {
  const frontend = workloads.find((w) => ebbContainers(podSpec(w)).some((c) => c.args?.[0] === 'frontend')) ?? assert.fail('a frontend workload');
  const frontendContainer = ebbContainers(podSpec(frontend)).find((c) => c.args?.[0] === 'frontend')!;
  const frontendArgs = frontendContainer.args!;
  const frontendService = docs.find((d) => d.kind === 'Service' && selects({ matchLabels: d.spec.selector }, templateLabels(frontend)) && (d.spec.ports as Array<{ targetPort?: string | number }>).some((p) => (frontendContainer.ports ?? []).some((c) => c.name === p.targetPort && String(c.containerPort) === argValue(frontendArgs, '--port')))) ?? assert.fail("a Service to the frontend's public port");
  const publicPort = (frontendService.spec.ports as Array<{ name: string; port: number; targetPort: string }>).find((p) => (frontendContainer.ports ?? []).some((c) => c.name === p.targetPort && String(c.containerPort) === argValue(frontendArgs, '--port')))!;

  it('every container (sidecars and init containers too) has CPU and memory requests and limits, requests within limits', () => {
    let checked = 0;
    for (const w of workloads) {
      for (const c of allContainers(podSpec(w))) {
        const where = `${w.metadata.name}/${c.name}`;
        for (const kind of ['requests', 'limits'] as const) for (const r of ['cpu', 'memory']) assert.ok(c.resources?.[kind]?.[r] !== undefined, `${where}: resources.${kind}.${r}`);
        for (const r of ['cpu', 'memory', 'nvidia.com/gpu']) {
          if (c.resources.requests[r] === undefined) continue;
          assert.ok(quantity(c.resources.requests[r]) <= quantity(c.resources.limits[r] ?? assert.fail(`${where}: a limit for ${r}`)), `${where}: ${r} requested within its limit`);
        }
        checked++;
      }
    }
    assert.ok(checked >= 8, `containers checked: ${checked}`);
  });

  it("an Ingress and an HTTPRoute route /v1 alone to the frontend's public port, SSE-safe: no buffering, no timeout a stream runs into", () => {
    const ingresses = docs.filter((d) => d.kind === 'Ingress');
    const routes = docs.filter((d) => d.kind === 'HTTPRoute');
    assert.ok(ingresses.length >= 1 && routes.length >= 1, 'an Ingress and an HTTPRoute');
    for (const ing of ingresses) {
      const where = `Ingress/${ing.metadata.name}`;
      const paths = (ing.spec.rules as any[]).flatMap((r) => r.http.paths);
      for (const p of paths) {
        assert.equal(p.path, '/v1', `${where}: only the OpenAI API is public (not /metrics, /health)`);
        assert.equal(p.backend.service.name, frontendService.metadata.name, `${where}: the frontend's Service`);
        assert.ok(p.backend.service.port.name === publicPort.name || p.backend.service.port.number === publicPort.port, `${where}: the Service port that reaches the frontend's --port`);
      }
      const a = ing.metadata.annotations ?? {};
      assert.equal(a['nginx.ingress.kubernetes.io/proxy-buffering'], 'off', `${where}: events pass as they come`);
      assert.ok(Number(a['nginx.ingress.kubernetes.io/proxy-read-timeout']) >= 3600, `${where}: a stream may be silent for minutes`);
      assert.ok(Number(a['nginx.ingress.kubernetes.io/proxy-send-timeout']) >= 3600, `${where}: send timeout`);
      assert.doesNotMatch(a['nginx.ingress.kubernetes.io/proxy-next-upstream'] ?? '', /non_idempotent/, `${where}: a POST (a generation) is never sent twice`);
      assert.equal(a['nginx.ingress.kubernetes.io/affinity'], undefined, `${where}: no stickiness: any frontend serves a resume`);
    }
    for (const route of routes) {
      const where = `HTTPRoute/${route.metadata.name}`;
      assert.ok(route.spec.parentRefs?.length > 0, `${where}: attached to a Gateway`);
      for (const rule of route.spec.rules) {
        assert.deepEqual(rule.matches, [{ path: { type: 'PathPrefix', value: '/v1' } }], `${where}: /v1 alone`);
        assert.deepEqual(rule.backendRefs.map((b: any) => [b.kind ?? 'Service', b.name, b.port]), [['Service', frontendService.metadata.name, publicPort.port]], `${where}: the frontend's Service port`);
        const t = seconds(rule.timeouts?.request ?? assert.fail(`${where}: timeouts.request (a gateway's default would cut long streams)`));
        assert.ok(t === 0 || t >= 3600, `${where}: timeouts.request off (0s) or an hour at least`);
      }
    }
  });

  it('the API keys are a Secret mounted where --api-key-file points, as the file every flag names is', () => {
    assert.ok(argValue(frontendArgs, '--api-key-file'), 'the frontend takes clients\' keys');
    for (const w of workloads) {
      for (const c of ebbContainers(podSpec(w))) {
        for (const [i, a] of (c.args ?? []).entries()) {
          const m = /^(--[a-z-]+-file)(?:=(.*))?$/.exec(a);
          if (!m) continue;
          const file = m[2] ?? c.args![i + 1]!;
          const where = `${w.metadata.name}/${c.name} ${m[1]} ${file}`;
          const mount = ((c.volumeMounts ?? []) as Array<{ name: string; mountPath: string }>).find((v) => file.startsWith(`${v.mountPath}/`)) ?? assert.fail(`${where}: on no mount`);
          const volume = podSpec(w).volumes?.find((v) => v.name === mount.name);
          assert.ok(volume?.secret, `${where}: from a Secret`);
          const items = (volume.secret.items ?? []) as Array<{ key: string; path: string }>;
          assert.ok(items.length === 0 || items.some((it) => `${mount.mountPath}/${it.path}` === file), `${where}: the Secret volume has the file`);
        }
      }
    }
    const keyFile = argValue(frontendArgs, '--api-key-file')!;
    const keyMount = (frontendContainer.volumeMounts as Array<{ name: string; mountPath: string }>).find((m) => keyFile.startsWith(`${m.mountPath}/`))!;
    const secret = podSpec(frontend).volumes!.find((v) => v.name === keyMount.name)!.secret.secretName as string;
    const made = readmeSecrets().get(secret) ?? assert.fail(`${KUBERNETES_DOC} creates the API keys' Secret ${secret}`);
    assert.match([...made.values.values()].join('\n'), /^[A-Za-z0-9_.-]+:/, `${KUBERNETES_DOC} gives the keys names (name:key), the tenants of the admission queue`);
  });

  it('frontends drain like workers: 300 s for open streams, a grace period above it, rollouts with surge, a PodDisruptionBudget', () => {
    const grace = durationOption(argValue(frontendArgs, '--shutdown-grace-ms') ?? '5s');
    const timeout = durationOption(argValue(frontendArgs, '--shutdown-timeout-ms') ?? '300s');
    assert.ok(timeout >= 300_000, `--shutdown-timeout-ms ${timeout} ms: agent-length streams need minutes`);
    const termination = podSpec(frontend) as PodSpec & { terminationGracePeriodSeconds?: number };
    assert.ok((termination.terminationGracePeriodSeconds ?? 30) * 1000 > grace + timeout, `terminationGracePeriodSeconds ${termination.terminationGracePeriodSeconds} above grace + timeout (${(grace + timeout) / 1000} s)`);
    assert.equal(frontend.spec.strategy?.type, 'RollingUpdate');
    assert.equal(frontend.spec.strategy.rollingUpdate.maxUnavailable, 0, 'a new frontend is ready before an old one stops');
    assert.ok(frontend.spec.strategy.rollingUpdate.maxSurge >= 1, 'rollouts surge');
    assert.ok(frontend.spec.replicas >= 2, 'two frontends, so one takes the other\'s streams');
    const pdb = docs.find((d) => d.kind === 'PodDisruptionBudget' && selects(d.spec.selector, templateLabels(frontend))) ?? assert.fail("a PodDisruptionBudget for the frontend's pods");
    assert.ok((pdb.spec.minAvailable ?? 0) >= 1 || (pdb.spec.maxUnavailable !== undefined && pdb.spec.maxUnavailable < frontend.spec.replicas), 'one frontend stays through node drains');
  });

  it("the frontends share a stream store: --stream-store names a Redis the docs point at one of the manifests' Services", () => {
    const store = argValue(frontendArgs, '--stream-store') ?? assert.fail('--stream-store');
    const fromEnv = /^\$\(([A-Z_]+)\)$/.exec(store);
    let url = store;
    if (fromEnv) {
      const ref = (frontendContainer.env ?? []).find((e) => e.name === fromEnv[1])?.valueFrom?.secretKeyRef ?? assert.fail(`${fromEnv[1]} comes from a Secret (a managed Redis's URL carries its password)`);
      url = readmeSecrets().get(ref.name)?.values.get(ref.key) ?? assert.fail(`${KUBERNETES_DOC} creates Secret ${ref.name} with a literal ${ref.key}`);
    }
    const u = new URL(url);
    assert.match(u.protocol, /^rediss?:$/, `a Redis URL: ${url}`);
    const [svcName, ns] = u.hostname.split('.');
    const svc = named('Service', svcName!) ?? assert.fail(`${url} names Service ${svcName}, which no manifest makes`);
    assert.equal(ns, 'ebb');
    assert.ok((svc.spec.ports as Array<{ port: number }>).some((p) => p.port === Number(u.port || 6379)), `Service ${svcName} has port ${u.port}`);
    const redis = workloads.find((w) => selects({ matchLabels: svc.spec.selector }, templateLabels(w))) ?? assert.fail(`Service ${svcName} selects a workload`);
    assert.ok(allContainers(podSpec(redis)).some((c) => /^redis:/.test(c.image)), `${redis.metadata.name} runs Redis`);
  });
});

describe('deploy/kubernetes: ebb containers', () => {
  it('run the image the Dockerfile builds, with args and preStop commands ebb accepts', () => {
    let seen = 0;
    for (const w of workloads) {
      for (const c of ebbContainers(podSpec(w))) {
        seen++;
        const where = `${w.metadata.name}/${c.name}`;
        const gpu = c.resources?.limits?.['nvidia.com/gpu'] !== undefined;
        assert.equal(c.image, gpu ? `ebb:${VERSION}-cuda` : `ebb:${VERSION}`, `${where}: the image README builds (the -cuda one where the container has the GPU)`);
        assert.equal(c.command, undefined, `${where}: the image's entry point runs ebb`);
        const env = (c.env ?? []).map((e) => e.name);
        checkEbbArgs(c.args ?? [], where, env);
        if (argValue(c.args ?? [], '--gpu') === 'cuda') assert.ok(gpu, `${where}: --gpu=cuda asks for an nvidia.com/gpu`);
        const hook = c.lifecycle?.preStop?.exec?.command as string[] | undefined;
        if (hook?.[0] === 'ebb') checkEbbArgs(hook.slice(1), `${where} preStop`, env);
        for (const probe of [c.livenessProbe, c.readinessProbe, c.startupProbe]) {
          if (probe?.httpGet) assert.ok((c.ports ?? []).some((p) => p.name === probe.httpGet.port || p.containerPort === probe.httpGet.port), `${where}: probe port ${probe.httpGet.port}`);
        }
      }
    }
    assert.ok(seen >= 4, 'the frontend and the mocker, llama-cpp and vLLM workers');
  });

  it('the workers cover a llama-cpp worker on a GPU with a model volume, and an openai worker with vLLM as a sidecar', () => {
    const pods = workloads.map(podSpec);
    const llama = pods.find((p) => ebbContainers(p).some((c) => argValue(c.args ?? [], '--engine') === 'llama-cpp'));
    assert.ok(llama, 'a llama-cpp worker');
    const lc = ebbContainers(llama).find((c) => argValue(c.args ?? [], '--engine') === 'llama-cpp')!;
    const modelPath = argValue(lc.args!, '--model-path') ?? assert.fail('--model-path');
    const mounts = (lc.volumeMounts ?? []) as Array<{ name: string; mountPath: string }>;
    assert.ok(mounts.some((m) => modelPath.startsWith(`${m.mountPath}/`) && llama.volumes?.some((v) => v.name === m.name && v.persistentVolumeClaim)), 'the model file is on a mounted claim');
    const vllm = pods.find((p) => ebbContainers(p).some((c) => argValue(c.args ?? [], '--engine-kind') === 'vllm'));
    assert.ok(vllm, 'an openai worker for vLLM');
    // A native sidecar: started first, stopped after the worker drained.
    const engine = vllm.initContainers?.find((c) => /vllm/.test(c.image)) as (Container & { restartPolicy?: string }) | undefined;
    assert.equal(engine?.restartPolicy, 'Always', 'vLLM runs as a native sidecar');
    const port = engine.ports?.[0]?.containerPort;
    const wc = ebbContainers(vllm)[0]!;
    assert.equal(argValue(wc.args!, '--engine-url'), `http://127.0.0.1:${port}`, "the worker calls its pod's vLLM");
  });

  it('the vLLM workers keep the model up through a rollout, keep their weights, read a gated model\'s token from a Secret, and wire prefix-cache routing', () => {
    const w = workloads.find((d) => ebbContainers(podSpec(d)).some((c) => argValue(c.args ?? [], '--engine-kind') === 'vllm')) ?? assert.fail('a vLLM worker');
    const where = `${w.kind}/${w.metadata.name}`;
    assert.ok(w.spec.replicas >= 2, `${where}: at least 2 replicas (one serves while the other rolls)`);
    const rolling = w.spec.strategy?.rollingUpdate ?? {};
    assert.equal(w.spec.strategy?.type, 'RollingUpdate');
    assert.equal(rolling.maxUnavailable, 0, `${where}: maxUnavailable 0`);
    assert.ok(rolling.maxSurge >= 1, `${where}: a surge pod loads before an old one goes`);
    const p = podSpec(w);
    const engine = (p.initContainers ?? []).find((c) => /vllm/.test(c.image)) ?? assert.fail('the vLLM sidecar');
    const cacheMount = (engine.volumeMounts as Array<{ name: string; mountPath: string }>).find((m) => /huggingface/.test(m.mountPath)) ?? assert.fail('a Hugging Face cache mount');
    const cache = p.volumes?.find((v) => v.name === cacheMount.name);
    assert.ok(cache?.persistentVolumeClaim || cache?.hostPath, `${where}: the weights' cache persists (a claim or a node's disk), not an emptyDir`);
    if (cache.persistentVolumeClaim) {
      const claim = named('PersistentVolumeClaim', cache.persistentVolumeClaim.claimName)!;
      assert.ok((claim.spec.accessModes as string[]).some((m) => m === 'ReadWriteMany'), `${where}: replicas on several nodes share the claim (ReadWriteMany)`);
    }
    const token = (engine.env ?? []).find((e) => e.name === 'HF_TOKEN');
    assert.ok(token?.valueFrom?.secretKeyRef, `${where}: HF_TOKEN from a Secret, not inlined`);
    // vLLM's flags, and the worker's that must agree with them.
    const vargs = engine.args ?? [];
    assert.ok(vargs.includes('--enable-prompt-tokens-details'), 'vLLM reports cached prompt tokens');
    const kvConfig = JSON.parse(argValue(vargs, '--kv-events-config') ?? assert.fail('--kv-events-config')) as { enable_kv_cache_events: boolean; publisher: string; endpoint: string; replay_endpoint?: string };
    assert.equal(kvConfig.enable_kv_cache_events, true);
    assert.equal(kvConfig.publisher, 'zmq');
    const wargs = ebbContainers(p)[0]!.args!;
    const port = (url: string | undefined) => url?.split(':').at(-1);
    assert.equal(port(argValue(wargs, '--engine-kv-events')), port(kvConfig.endpoint), "the worker subscribes to vLLM's publisher");
    assert.equal(port(argValue(wargs, '--engine-kv-events-replay')), port(kvConfig.replay_endpoint), "and asks its replay socket for lost batches");
    assert.equal(argValue(wargs, '--engine-kv-block-size') ?? '16', argValue(vargs, '--block-size') ?? '16', 'one block size on both sides');
    assert.match(readFileSync(join(DEPLOY, 'worker-vllm.yaml'), 'utf8'), /ONE GPU/, 'the file says what a one-GPU cluster gives up');
  });

  describe('probe paths answer on the listeners their ports name (real processes, the manifests\' args)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebb-manifests-'));
    const discovery = tempDiscoveryUrl();
    const procs: EbbProcess[] = [];
    /** listener -> base URL, from the running processes' ready lines, e.g. "worker:--system-port" */
    const listeners = new Map<string, string>();

    /** The container's args made runnable here: loopback, port 0, file discovery, token files under `dir`, no Kubernetes API. */
    const localArgs = (args: string[]) =>
      args
        .filter((a) => a !== '--k8s-self-pod')
        .map((a) => {
          const [flag] = a.split('=');
          if (flag === '--host' || flag === '--system-host' || flag === '--admin-host') return `${flag}=127.0.0.1`;
          if (flag === '--port' || flag === '--system-port' || flag === '--admin-port') return `${flag}=0`;
          if (flag === '--discovery') return `--discovery=${discovery}`;
          if (flag === '--advertise-host') return '--advertise-host=127.0.0.1';
          if (flag === '--worker-id') return '--worker-id=manifest-worker';
          // The Redis is the cluster's: here the frontend keeps its streams in memory.
          if (flag === '--stream-store') return '--stream-store=memory';
          // Every file from a Secret mount (tokens, API keys, TLS) is a file of the same name under `dir`.
          return a.replace(/\/etc\/ebb[a-z-]*\//, `${dir}/`);
        });

    const container = (deployment: string) => ebbContainers(podSpec(named('Deployment', deployment)!))[0]!;

    let guardCa = '';
    /** The API server's client certificate, signed by (here: itself) the CA the guard's --client-ca-file names. */
    let apiServerClient = { cert: '', key: '' };

    before(async () => {
      writeFileSync(join(dir, 'admin-token'), 'manifest-admin-token\n', { mode: 0o600 });
      writeFileSync(join(dir, 'api-keys'), 'app:manifest-api-key\n', { mode: 0o600 });
      guardCa = makeCert(dir, 'guard', 'tls').cert; // tls.crt / tls.key, as the guard's Secret mounts them
      const client = makeCert(dir, 'apiserver-client', 'ca'); // ca.crt, as the client CA Secret mounts it
      apiServerClient = { cert: client.cert, key: client.key };
      // The guard reads no pod until a review needs one: any cluster in its kubeconfig will do.
      const kubeconfig = join(dir, 'kubeconfig.json');
      writeFileSync(kubeconfig, JSON.stringify({ apiVersion: 'v1', kind: 'Config', clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1' } }], users: [{ name: 'u', user: { token: 't' } }], contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }], 'current-context': 'c' }));
      const guard = spawnEbb(localArgs(container('ebb-eviction-guard').args!), 'manifest eviction guard', { KUBECONFIG: kubeconfig });
      procs.push(guard);
      listeners.set('eviction-guard:--port', String((await guard.waitForEvent('eviction_guard_ready')).url));
      writeFileSync(join(dir, 'request-token'), 'manifest-request-token\n', { mode: 0o600 });
      const worker = spawnEbb(localArgs(container('ebb-worker').args!), 'manifest worker');
      procs.push(worker);
      const w = await worker.waitForEvent('worker_ready');
      listeners.set('worker:--system-port', String(w.system_url));
      listeners.set('worker:--port', String(w.request_url));
      const frontend = spawnEbb(localArgs(container('ebb-frontend').args!), 'manifest frontend');
      procs.push(frontend);
      const f = await frontend.waitForEvent('frontend_ready');
      listeners.set('frontend:--port', String(f.url));
      listeners.set('frontend:--admin-port', String(f.admin_url));
      // /health is 200 once the frontend routes to the worker (registered before the frontend started).
      await frontend.waitForLog((l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes('manifest-worker')) || (l.event === 'worker_added' && l.worker_id === 'manifest-worker'), 'the worker in the routing view');
      // The worker's /ready is 200 once the frontend marks it as one it routes to.
      await worker.waitForLog((l) => l.event === 'routing_changed' && l.to === 'routed' && (l.frontends as number) >= 1, 'the frontend to mark the worker');
    });
    after(async () => {
      await Promise.all(procs.map((p) => p.terminate()));
    });

    it('every httpGet probe of every ebb container answers 200', async () => {
      let probed = 0;
      for (const w of workloads) {
        for (const c of ebbContainers(podSpec(w))) {
          const args = c.args ?? [];
          for (const [kind, probe] of [['liveness', c.livenessProbe], ['readiness', c.readinessProbe], ['startup', c.startupProbe]] as const) {
            if (!probe?.httpGet) continue;
            const port = (c.ports ?? []).find((p) => p.name === probe.httpGet.port || p.containerPort === probe.httpGet.port)!;
            // Which listener the port is: the flag whose value is that port number.
            const flag = ['--port', '--system-port', '--admin-port'].find((f) => argValue(args, f) === String(port.containerPort));
            const base = listeners.get(`${args[0]}:${flag}`);
            assert.ok(base, `${w.metadata.name}/${c.name}: port ${port.containerPort} is no ebb ${args[0]} listener`);
            const https = probe.httpGet.scheme === 'HTTPS';
            assert.equal(new URL(base).protocol, https ? 'https:' : 'http:', `${w.metadata.name}/${c.name} ${kind} probe: scheme ${probe.httpGet.scheme ?? 'HTTP'} on a ${new URL(base).protocol} listener`);
            const res = https ? await fetchWith(`${base}${probe.httpGet.path}`, { dispatcher: new Agent({ connect: { ca: guardCa } }) }) : await fetch(`${base}${probe.httpGet.path}`);
            await res.arrayBuffer();
            assert.equal(res.status, 200, `${w.metadata.name}/${c.name} ${kind} probe GET ${probe.httpGet.path} on ${flag}`);
            probed++;
          }
        }
      }
      assert.ok(probed >= 10, `probes checked: ${probed}`);
    });

    it('every metric the monitoring, autoscaling and InferencePool manifests name is on a page ebb serves; every scraped port serves /metrics', async () => {
      const served = new Set<string>();
      for (const base of [listeners.get('worker:--system-port'), listeners.get('frontend:--port')]) {
        const text = await fetch(`${base}/metrics`).then((r) => r.text());
        for (const m of text.matchAll(/^# TYPE (\S+) /gm)) served.add(m[1]!);
      }
      const files = ['monitoring.yaml', 'autoscaling-hpa.yaml', 'autoscaling-keda.yaml', 'inference-pool.yaml'];
      const named = files.flatMap((f) => [...metricNamesIn(f)].map((name) => ({ f, name })));
      assert.ok(named.length >= 6, `metric names found: ${named.map((n) => n.name).join(', ')}`);
      for (const { f, name } of named) {
        const base = name.replace(/_(bucket|sum|count)$/, '');
        assert.ok(served.has(name) || served.has(base), `${f} names ${name}, which no ebb page serves`);
      }
      for (const w of workloads.filter((d) => d.spec.template.metadata.annotations?.['prometheus.io/scrape'] === 'true')) {
        const a = w.spec.template.metadata.annotations;
        const c = ebbContainers(podSpec(w))[0]!;
        const flag = ['--port', '--system-port', '--admin-port'].find((f) => argValue(c.args!, f) === a['prometheus.io/port']);
        const base = listeners.get(`${c.args![0]}:${flag}`) ?? assert.fail(`${w.metadata.name}: prometheus.io/port ${a['prometheus.io/port']} is no listener`);
        const res = await fetch(`${base}${a['prometheus.io/path']}`);
        assert.equal(res.status, 200, `${w.metadata.name}: ${a['prometheus.io/path']} on ${flag}`);
        assert.match(await res.text(), /^# HELP /m);
      }
    });

    it("the guard started with its manifest's args answers an AdmissionReview at the webhook's path from the API server's client certificate only (401, 403 otherwise)", async () => {
      const hook = docs.find((d) => d.kind === 'ValidatingWebhookConfiguration')!.webhooks![0];
      const review = { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { uid: 'manifest-uid', resource: { group: '', version: 'v1', resource: 'pods' }, subResource: 'eviction', name: 'x', namespace: 'ebb', operation: 'UPDATE' } };
      const other = makeCert(dir, 'forger');
      const postAs = (client: { cert: string; key: string } | Record<string, never>) =>
        fetchWith(`${listeners.get('eviction-guard:--port')}${hook.clientConfig.service.path}`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(review),
          dispatcher: new Agent({ connect: { ca: guardCa, ...client } }),
        });
      for (const [what, client, status] of [
        ['no client certificate', {}, 401],
        ['a client certificate of another CA', { cert: other.cert, key: other.key }, 403],
      ] as const) {
        const refused = await postAs(client);
        assert.equal(refused.status, status, what);
        assert.equal(((await refused.json()) as { response?: unknown }).response, undefined, `${what}: no verdict`);
      }
      const res = await postAs(apiServerClient);
      assert.equal(res.status, 200);
      assert.deepEqual(await res.json(), { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', response: { uid: 'manifest-uid', allowed: true } });
    });
  });
});

describe('Dockerfile and Dockerfile.cuda', () => {
  type Stage = { name: string; from: string; lines: string[] };
  /** A Dockerfile's global ARG lines (before the first FROM) and its stages, comments dropped, continuations joined. */
  const parse = (file: string) => {
    const raw = readFileSync(join(ROOT, file), 'utf8');
    const lines = raw.replace(/\\\n/g, ' ').split('\n').filter((l) => l.trim() !== '' && !l.trim().startsWith('#'));
    const globals: string[] = [];
    const stages: Stage[] = [];
    for (const l of lines) {
      const from = /^FROM\s+(\S+)(?:\s+AS\s+(\S+))?/i.exec(l);
      if (from) stages.push({ name: from[2] ?? '', from: from[1]!, lines: [] });
      else (stages.at(-1)?.lines ?? globals).push(l);
    }
    const stage = (name: string) => stages.find((s) => s.name === name) ?? assert.fail(`${file}: no stage ${name}`);
    return { file, raw, globals, stages, stage };
  };
  const cpuFile = parse('Dockerfile');
  const cudaFile = parse('Dockerfile.cuda');
  const json = (s: Stage, instr: string) => {
    const l = s.lines.find((x) => x.startsWith(`${instr} `));
    return l === undefined ? undefined : (JSON.parse(l.slice(instr.length + 1)) as string[]);
  };

  it('the CPU image (Dockerfile\'s default: last) and the CUDA image run ebb as a non-root user, with `ebb` on the PATH', () => {
    assert.equal(cpuFile.stages.at(-1)?.name, 'cpu', 'Dockerfile\'s default target is the CPU image');
    assert.equal(cudaFile.stages.at(-1)?.name, 'cuda', 'Dockerfile.cuda\'s default target is the CUDA image');
    const bin = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { bin: { ebb: string } }).bin.ebb;
    for (const s of [cpuFile.stage('cpu'), cudaFile.stage('cuda')]) {
      const target = s.name;
      const entry = json(s, 'ENTRYPOINT') ?? assert.fail(`${target}: ENTRYPOINT`);
      assert.equal(entry[0], 'node');
      const workdir = s.lines.find((l) => l.startsWith('WORKDIR '))!.slice(8).trim();
      const script = entry[1]!;
      assert.ok(script.startsWith(`${workdir}/`), `${target}: the entry point is under WORKDIR ${workdir}`);
      const inRepo = script.slice(workdir.length + 1);
      assert.equal(inRepo, bin, `${target}: the entry point is package.json's bin`);
      assert.ok(existsSync(join(ROOT, inRepo)), `${target}: ${inRepo} is a file the build makes`);
      assert.ok(s.lines.some((l) => l.includes(`COPY --from=build ${workdir}/dist/src ./dist/src`)), `${target}: copies the build's dist/src (the precompiled validators)`);
      assert.ok(s.lines.some((l) => l.includes(`COPY --from=build ${workdir}/dist/bin ./dist/bin`)), `${target}: copies the bundle`);
      assert.ok(s.lines.some((l) => l.includes(`COPY --from=deps ${workdir}/node_modules ./node_modules`)), `${target}: copies the pruned production node_modules`);
      assert.ok(s.lines.some((l) => new RegExp(`ln -s ${script} /usr/local/bin/ebb`).test(l)), `${target}: ebb on the PATH (preStop runs it)`);
      const user = s.lines.find((l) => l.startsWith('USER '))?.slice(5).trim() ?? assert.fail(`${target}: USER`);
      assert.match(user, /^[1-9]\d*(:\d+)?$/, `${target}: a numeric non-root user (runAsNonRoot can check it)`);
      checkEbbArgs(json(s, 'CMD') ?? [], `${target} CMD`);
    }
  });

  it('the CPU build names no image it does not run on; the legacy builder reads both, BuildKit needs no frontend image', () => {
    // The legacy builder (Debian's docker.io, DOCKER_BUILDKIT=0) builds every stage in file order and pulls every FROM.
    const names = new Set(cpuFile.stages.map((s) => s.name));
    for (const s of cpuFile.stages) assert.ok(s.from === '${NODE_IMAGE}' || names.has(s.from), `Dockerfile: stage ${s.name} is FROM \${NODE_IMAGE} or a stage (not ${s.from})`);
    assert.doesNotMatch([...cpuFile.globals, ...cpuFile.stages.flatMap((s) => [s.from, ...s.lines])].join('\n'), /cuda|nvidia/i, 'Dockerfile names no CUDA image');
    assert.ok(cudaFile.stages.some((s) => s.from === '${CUDA_IMAGE}'), 'Dockerfile.cuda runs on ${CUDA_IMAGE}');
    for (const f of [cpuFile, cudaFile]) {
      // BuildKit would pull a `# syntax=` frontend image from a registry; the legacy builder knows no RUN flags or heredocs.
      assert.doesNotMatch(f.raw, /^#\s*syntax\s*=/im, `${f.file}: no # syntax= directive`);
      for (const l of f.stages.flatMap((s) => s.lines)) {
        assert.doesNotMatch(l, /^RUN\s+--|<<[A-Z'"-]|^(COPY|ADD)\s.*--(link|parents|exclude|chmod)/, `${f.file}: the legacy builder reads "${l}"`);
      }
    }
  });

  it('npm in the build takes NPM_REGISTRY and NPM_CA and is never forced; Dockerfile.cuda\'s build stages are Dockerfile\'s; the docs pass only args they declare', () => {
    const npm = cpuFile.stage('npm');
    assert.equal(npm.from, '${NODE_IMAGE}');
    for (const a of ['NPM_REGISTRY', 'NPM_CA']) assert.ok(npm.lines.includes(`ARG ${a}=`), `npm stage: ARG ${a}, empty by default`);
    assert.match(npm.lines.join('\n'), /npm config set --global registry "\$NPM_REGISTRY"/);
    assert.match(npm.lines.join('\n'), /npm config set --global cafile/);
    for (const f of [cpuFile, cudaFile]) {
      for (const s of f.stages.filter((x) => x.lines.some((l) => /\bnpm (ci|install|rebuild)\b/.test(l)))) {
        assert.equal(s.from, 'npm', `${f.file}: stage ${s.name} installs packages through the npm stage's registry and CA`);
      }
      assert.notEqual(f.stages.at(-1)?.from, 'npm', `${f.file}: the image itself carries no npm configuration`);
      // npm answers --force with "Recommended protections disabled", a warning every build would print.
      for (const l of f.stages.flatMap((x) => x.lines).filter((x) => /\bnpm\b/.test(x))) assert.doesNotMatch(l, /--force\b|\bcache clean\b/, `${f.file}: no forced npm step (${l.trim()})`);
    }
    const prebuilts = /^ARG LLAMA_PREBUILTS=.*$/m;
    for (const name of ['npm', 'build', 'deps']) {
      const [a, b] = [cpuFile.stage(name), cudaFile.stage(name)];
      assert.equal(b.from, a.from, `Dockerfile.cuda's ${name} stage is FROM what Dockerfile's is`);
      assert.equal(b.lines.join('\n').replace(prebuilts, ''), a.lines.join('\n').replace(prebuilts, ''), `Dockerfile.cuda's ${name} stage is Dockerfile's but for LLAMA_PREBUILTS`);
    }
    const declared = (f: typeof cpuFile) => new Set([...f.globals, ...f.stages.flatMap((s) => s.lines)].map((l) => /^ARG\s+([A-Z_]+)/.exec(l)?.[1]).filter((x) => x !== undefined));
    let builds = 0;
    let legacy = false;
    for (const [doc, text] of DOCS) {
      for (const l of text.replace(/\\\n\s*/g, ' ').split('\n').filter((x) => /^\s*(DOCKER_BUILDKIT=\d\s+)?docker build\b/.test(x))) {
        const f = /\s-f\s+Dockerfile\.cuda\b/.test(l) ? cudaFile : cpuFile;
        for (const m of l.matchAll(/--build-arg\s+([A-Z_]+)=/g)) assert.ok(declared(f).has(m[1]!), `${doc}: ${f.file} declares ARG ${m[1]} (${l.trim()})`);
        assert.doesNotMatch(l, /--target/, `${doc}: ${l.trim()} builds a file's default target`);
        legacy ||= /DOCKER_BUILDKIT=0/.test(l) && /NPM_CA=/.test(l);
        builds++;
      }
    }
    assert.ok(builds >= 3, 'the docs build the CPU and the CUDA image, and with a registry and CA');
    assert.ok(legacy, "the docs show the legacy builder's build (Debian's docker.io) with the CA");
  });

  it('copies only what exists and .dockerignore keeps; keeps only real node-llama-cpp prebuilt packages', () => {
    const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
    for (const f of [cpuFile, cudaFile]) {
      for (const s of f.stages) {
        for (const l of s.lines.filter((x) => x.startsWith('COPY ') && !x.includes('--from='))) {
          const sources = l.split(/\s+/).slice(1, -1).filter((p) => !p.startsWith('--'));
          for (const src of sources) {
            assert.ok(existsSync(join(ROOT, src)), `${f.file} ${s.name}: COPY ${src} exists`);
            assert.ok(!ignored.includes(src), `${f.file} ${s.name}: COPY ${src} is not in .dockerignore`);
          }
        }
      }
    }
    const optional = Object.keys((JSON.parse(readFileSync(join(ROOT, 'node_modules', 'node-llama-cpp', 'package.json'), 'utf8')) as { optionalDependencies: Record<string, string> }).optionalDependencies);
    const kept = (f: typeof cpuFile) => f.stage('deps').lines.find((l) => l.startsWith('ARG LLAMA_PREBUILTS='))?.match(/"([^"]+)"/)?.[1] ?? assert.fail(`${f.file}: LLAMA_PREBUILTS`);
    for (const f of [cpuFile, cudaFile]) {
      for (const p of kept(f).split(' ')) assert.ok(optional.includes(`@node-llama-cpp/${p}`), `${f.file}: @node-llama-cpp/${p} is a node-llama-cpp prebuilt`);
      assert.ok(f.stage('deps').lines.some((l) => /npm ci --omit=dev/.test(l)), `${f.file}: production dependencies only`);
    }
    assert.match(kept(cudaFile), /\blinux-x64-cuda\b/, 'the CUDA image keeps the CUDA prebuilt');
    assert.doesNotMatch(kept(cpuFile), /cuda|vulkan/, 'the CPU image keeps no GPU prebuilt');
  });
});

describe('deploy/load-balancer: nginx and HAProxy in front of several frontends', () => {
  const LB = join(ROOT, 'deploy', 'load-balancer');
  /** A Debian binary: on root's PATH, else in /usr/sbin (a user's PATH often lacks it). */
  const binary = (name: string) => [spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' }).stdout.trim(), `/usr/sbin/${name}`].find((p) => p !== '' && existsSync(p));
  const nginx = binary('nginx');
  const haproxy = binary('haproxy');
  /** The two frontends of the step-by-step (docs/frontends.md): ports 8000 and 8010 on one machine. */
  const GUIDE_FRONTENDS = ['127.0.0.1:8000', '127.0.0.1:8010'];

  it('nginx.conf parses (nginx -t) and is what SSE needs: no buffering, hour-long timeouts, retries that never repeat a POST, no stickiness', { skip: skipWithout(nginx !== undefined, 'nginx is not installed (Debian nginx): deploy/load-balancer/nginx.conf is not parsed') }, () => {
    const file = join(LB, 'nginx.conf');
    const prefix = mkdtempSync(join(tmpdir(), 'ebb-nginx-'));
    const res = spawnSync(nginx!, ['-t', '-c', file, '-p', prefix, '-g', `pid ${prefix}/nginx.pid; error_log stderr;`], { encoding: 'utf8', timeout: 30_000 });
    assert.equal(res.status, 0, `nginx -t: ${res.stderr}`);
    assert.match(res.stderr, /test is successful/);
    const conf = readFileSync(file, 'utf8').replace(/#.*$/gm, '');
    assert.match(conf, /\bproxy_buffering off;/);
    assert.match(conf, /\bproxy_cache off;/);
    for (const t of ['proxy_read_timeout', 'proxy_send_timeout']) assert.ok(Number(new RegExp(`\\b${t} (\\d+)s;`).exec(conf)?.[1]) >= 3600, `${t} an hour at least`);
    assert.match(conf, /\bproxy_http_version 1\.1;/, 'HTTP/1.1 to the frontends (keep-alive, chunked streams)');
    assert.match(conf, /\bproxy_next_upstream [^;]*\berror\b/, 'a connection that fails goes to the other frontend');
    assert.doesNotMatch(conf, /non_idempotent/, 'a POST (a generation) is never sent twice');
    assert.doesNotMatch(conf, /\b(ip_hash|hash|sticky)\b/, 'no stickiness: any frontend serves a resume');
    assert.deepEqual([...conf.matchAll(/^\s*server (\d+\.\d+\.\d+\.\d+:\d+)/gm)].map((m) => m[1]), GUIDE_FRONTENDS, "the step-by-step's two frontends");
  });

  it('haproxy.cfg parses (haproxy -c) without a warning and is what SSE needs: hour-long timeouts, answers retried for a GET only, /health checks, no stickiness', { skip: skipWithout(haproxy !== undefined, 'haproxy is not installed (Debian haproxy): deploy/load-balancer/haproxy.cfg is not parsed') }, () => {
    const file = join(LB, 'haproxy.cfg');
    const res = spawnSync(haproxy!, ['-c', '-f', file], { encoding: 'utf8', timeout: 30_000 });
    assert.equal(res.status, 0, `haproxy -c: ${res.stdout}${res.stderr}`);
    assert.doesNotMatch(`${res.stdout}${res.stderr}`, /\[WARNING\]|\[ALERT\]/, `haproxy -c: ${res.stdout}${res.stderr}`);
    const cfg = readFileSync(file, 'utf8').replace(/#.*$/gm, '');
    for (const t of ['client', 'server']) assert.match(cfg, new RegExp(`\\btimeout ${t} (1h|[6-9]\\dm|\\d{4,}s)\\b`), `timeout ${t}: an hour at least`);
    assert.match(cfg, /\bretry-on\b/, 'answers a resume may be retried on');
    assert.match(cfg, /\bhttp-request disable-l7-retry unless METH_GET\b/, 'only a GET (a resume) is retried on an answer; a POST only when its connection failed');
    assert.match(cfg, /\boption httpchk GET \/health\b/, "a frontend leaves the rotation when its /health fails (its shutdown's grace)");
    assert.doesNotMatch(cfg, /\b(stick|cookie|balance source|balance uri)\b/, 'no stickiness: any frontend serves a resume');
    assert.doesNotMatch(cfg, /\bcompression\b/, 'no compression: events are not held for a block');
    assert.deepEqual([...cfg.matchAll(/^\s*server \S+ (\S+)/gm)].map((m) => m[1]), GUIDE_FRONTENDS, "the step-by-step's two frontends");
  });
});

describe('README and docs/: a front door, and every command, flag and file they name exists', () => {
  it('README is a front door (under 400 lines) that links every docs page', () => {
    const lines = README.split('\n').length;
    assert.ok(lines < 400, `README.md has ${lines} lines`);
    for (const page of readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md'))) assert.ok(README.includes(`(docs/${page}`), `README links docs/${page}`);
  });

  it('every relative link resolves, and every repository path they name in backticks exists', () => {
    let links = 0;
    for (const [doc, text] of DOCS) {
      const base = doc.includes('/') ? join(ROOT, doc, '..') : ROOT;
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:|^#/.test(target!)) continue;
        const path = target!.split('#')[0]!;
        assert.ok(existsSync(join(base, path)), `${doc}: the link (${target}) resolves`);
        links++;
      }
      for (const [, path] of text.matchAll(/`((?:src|test|bench|deploy|docs)\/[A-Za-z0-9_./-]+)`/g)) {
        if (/[*<{]/.test(path!)) continue;
        assert.ok(existsSync(join(ROOT, path!)), `${doc}: \`${path}\` exists`);
      }
    }
    assert.ok(links > 20, `links checked: ${links}`);
  });

  it("every ebb command line in their code blocks is a command ebb has, with flags it accepts", () => {
    let checked = 0;
    for (const [doc, text] of DOCS) {
      for (const block of text.matchAll(/^```[a-z]*\n([\s\S]*?)^```/gm)) {
        for (const raw of block[1]!.replace(/\\\n\s*/g, ' ').split('\n')) {
          // `$ ebb ...` (a console), `npx ebb ...`, `node dist/bin/ebb.js ...`; the rest of a pipeline or a comment is not ebb's.
          const m = /^\s*(?:\$\s+)?(?:[A-Z_]+=\S+\s+)*(?:npx\s+ebb|ebb|node\s+dist\/bin\/ebb\.js)\s+(.*)$/.exec(raw);
          if (!m) continue;
          const line = m[1]!.split(/\s(?:#|\||&&|;|&)(?:\s|$)/)[0]!.trim();
          const words = line.split(/\s+/);
          // Global options first, then the command (and a subcommand: `ebb intents clear`).
          while (words[0] === '--log-format' || words[0] === '--log-level') words.splice(0, 2);
          const command = words.shift();
          if (command === undefined || command === '--help' || command === '--version') continue;
          assert.ok(helpOf('').commands.has(command), `${doc}: "ebb ${line}": ebb has no command ${command}`);
          const path = words[0] !== undefined && helpOf(command).commands.has(words[0]) ? `${command} ${words.shift()}` : command;
          const flags = flagsOf(path);
          for (const [, flag] of line.matchAll(/(?:^|[\s[(|])(--[a-z][a-z0-9-]*)/g)) {
            if (flag === '--log-format' || flag === '--log-level') continue;
            assert.ok(flags.has(flag!), `${doc}: "ebb ${line}": ebb ${path} has no flag ${flag}`);
          }
          checked++;
        }
      }
    }
    assert.ok(checked >= 30, `ebb command lines checked: ${checked}`);
  });
});
