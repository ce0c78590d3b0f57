import { Command, Option } from 'commander';
import { createLogger } from '../common/logger.js';
import { CliError } from './cli-error.js';
import { durationOption, portOption } from './options.js';

interface EvictionGuardFlags {
  host: string;
  port: number;
  tlsCertFile: string;
  tlsKeyFile: string;
  clientCaFile: string;
  kubeconfig?: string;
  drainDeadline?: number;
  apiTimeout: number;
}

/**
 * `ebb eviction-guard`: the validating admission webhook for `pods/eviction` (see
 * k8s/eviction-guard.ts for what it decides, deploy/kubernetes/eviction-guard.yaml for how the API
 * server is told to call it).
 */
export function evictionGuardCommand(): Command {
  return new Command('eviction-guard')
    .description('admission webhook for pods/eviction: a serving ebb worker is drained before a node drain or autoscaler may evict it')
    .option('--host <host>', 'address to listen on', '0.0.0.0')
    .option('--port <n>', 'HTTPS port the API server calls (0 = any free port)', portOption, 8443)
    .requiredOption('--tls-cert-file <path>', 'PEM certificate (chain) served to the API server; re-read when the file changes')
    .requiredOption('--tls-key-file <path>', 'PEM private key of the certificate; re-read when the file changes')
    .requiredOption('--client-ca-file <path>', "PEM CA that signs the API server's client certificate (AdmissionConfiguration kubeConfigFile); reviews from any other caller get 401/403. Re-read when the file changes")
    .option('--kubeconfig <path>', 'Kubernetes credentials (default: in-cluster service account, else KUBECONFIG / ~/.kube/config)')
    .addOption(new Option('--drain-deadline <duration>', 'written with the drain annotation: streams still running after this long are handed off to other workers (default: none, the drain waits for them)').argParser(durationOption))
    .addOption(
      new Option('--api-timeout <duration>', 'bound on reading and annotating the pod; past it the eviction is refused (429, retried). Keep it under the webhook\'s timeoutSeconds')
        .argParser(durationOption)
        .default(durationOption('5s'), '5s'),
    )
    .action(async (flags: EvictionGuardFlags) => {
      // Loaded here: the Kubernetes client is dozens of modules that `ebb --help` should not load.
      const [{ createPodApi, loadKubeConfig }, { EvictionGuard }, { startWebhookServer, EVICTION_PATH }] = await Promise.all([
        import('../k8s/client.js'),
        import('../k8s/eviction-guard.js'),
        import('../k8s/webhook-server.js'),
      ]);
      let api;
      try {
        api = createPodApi(loadKubeConfig(flags.kubeconfig));
      } catch (err) {
        throw new CliError(`eviction-guard: ${(err as Error).message}`);
      }
      const log = createLogger('eviction-guard');
      const guard = new EvictionGuard(api, { drainDeadlineMs: flags.drainDeadline, apiTimeoutMs: flags.apiTimeout }, log);
      let server;
      try {
        server = await startWebhookServer({ host: flags.host, port: flags.port, certFile: flags.tlsCertFile, keyFile: flags.tlsKeyFile, clientCaFile: flags.clientCaFile, review: (r) => guard.review(r) }, log);
      } catch (err) {
        throw new CliError(`eviction-guard: ${(err as Error).message}`);
      }
      log.info({ event: 'eviction_guard_ready', url: server.url, path: EVICTION_PATH, kube_api: api.server }, `eviction guard ready: ${server.url}${EVICTION_PATH} (pods read at ${api.server})`);
      let stopping = false;
      const stop = (signal: NodeJS.Signals) => {
        if (stopping) process.exit(130);
        stopping = true;
        log.info({ event: 'eviction_guard_stopping', signal }, 'stopping');
        server.close().then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.on('SIGTERM', () => stop('SIGTERM'));
      process.on('SIGINT', () => stop('SIGINT'));
    });
}
