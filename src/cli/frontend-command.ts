import { Command } from 'commander';
import { createLogger } from '../common/logger.js';
import { startFrontend } from '../frontend/frontend.js';
import { discoveryDefault, intOption } from './options.js';

interface FrontendFlags {
  host: string;
  port: number;
  discovery: string;
}

export function frontendCommand(): Command {
  return new Command('frontend')
    .description('run the OpenAI-compatible frontend: routes requests to serving workers found through discovery')
    .option('--host <addr>', 'bind address', '127.0.0.1')
    .option('--port <n>', 'port (0 = any free port)', intOption(0), 8000)
    .option('--discovery <url>', 'memory:, file:///dir or etcd://host:2379[,host:2379] (env EBB_DISCOVERY)', discoveryDefault())
    .action(async (flags: FrontendFlags) => {
      const log = createLogger('frontend');
      const frontend = await startFrontend({ host: flags.host, port: flags.port, discoveryUrl: flags.discovery }, log);
      log.info({ event: 'frontend_ready', url: frontend.url, discovery: frontend.discovery.url }, `frontend ready: ${frontend.url}/v1`);
      let stopping = false;
      const stop = (signal: NodeJS.Signals) => {
        if (stopping) process.exit(130);
        stopping = true;
        log.info({ event: 'frontend_stopping', signal }, 'stopping: finishing open streams');
        frontend.close().then(
          () => process.exit(0),
          (err: unknown) => {
            log.error({ err }, 'stop failed');
            process.exit(1);
          },
        );
      };
      process.on('SIGTERM', stop);
      process.on('SIGINT', stop);
      process.once('disconnect', () => stop('SIGTERM')); // started by `ebb up`, which went away
    });
}
