import { Command } from 'commander';
import type { TenantReport } from '../frontend/limits/limiter.js';
import type { LimitName } from '../frontend/limits/tenant-limits.js';
import { addSourceOptions, withClient, type SourceFlags } from './admin-client.js';
import { CliError } from './cli-error.js';
import { renderTable } from './workers-command.js';

interface TenantsFlags extends SourceFlags {
  json?: boolean;
}

/** GET /tenants on a frontend's admin listener. */
export interface TenantsAnswer {
  store: 'redis' | 'memory' | 'none';
  store_up?: boolean;
  store_down?: 'open' | 'closed';
  tenants: TenantReport[];
}

/** `used/limit` where the tenant has the limit, else what it used. */
function cell(t: TenantReport, limit: LimitName, used: number): string {
  const l = t.limits[limit];
  return l === undefined ? String(used) : `${used}/${l}`;
}

function row(t: TenantReport): string[] {
  const hits = Object.entries(t.hits).map(([limit, n]) => `${limit} ${n}`);
  return [
    t.tenant,
    t.from === '*' ? '*' : 'own',
    cell(t, 'requests_per_minute', t.usage.requests_last_minute),
    cell(t, 'tokens_per_minute', t.usage.tokens_last_minute),
    cell(t, 'concurrent_streams', t.usage.concurrent_streams),
    cell(t, 'tokens_per_day', t.usage.tokens_today),
    cell(t, 'tokens_per_month', t.usage.tokens_this_month),
    hits.join(', '),
  ];
}

export function tenantsCommand(): Command {
  return addSourceOptions(
    new Command('tenants').description("tenants' limits (--limits-file) and what each uses now: requests and tokens in the last minute, streams, tokens today and this month (UTC), and the requests a frontend refused by limit"),
  )
    .option('--json', "print the frontend's answer (GET /tenants) as JSON")
    .action(async (flags: TenantsFlags) => {
      await withClient(flags, async (client) => {
        const source = client.source;
        if (source.kind !== 'frontend') throw new CliError('ebb tenants reads a frontend\'s admin API: pass --frontend URL (e.g. http://127.0.0.1:8001), or run it beside a running `ebb up`');
        const res = await client.call<TenantsAnswer>(`${source.url}/tenants`, 'GET', 'the frontend admin API');
        if (res.statusCode !== 200) throw new CliError(`the frontend admin API at ${source.url} answered HTTP ${res.statusCode} to GET /tenants${res.statusCode === 404 ? ' (an ebb before tenant limits)' : ''}`);
        const answer = res.body;
        if (flags.json) {
          process.stdout.write(JSON.stringify(answer, null, 2) + '\n');
          return;
        }
        if (answer.store === 'none') {
          process.stdout.write(`the frontend at ${source.url} counts no limits (it runs without --limits-file)\n`);
          return;
        }
        const where = answer.store === 'redis' ? `counted in the fleet's Redis${answer.store_up === false ? ` (unreachable now: ${answer.store_down === 'open' ? "this frontend's own counts" : 'requests of limited tenants are refused'})` : ''}` : 'counted in this frontend';
        if (answer.tenants.length === 0) {
          process.stdout.write(`no tenants with limits (${where})\n`);
          return;
        }
        process.stdout.write(`${where}; used/limit, minute windows sliding, days and months UTC; hits: requests this frontend refused\n`);
        process.stdout.write(renderTable([['TENANT', 'LIMITS', 'REQUESTS/MIN', 'TOKENS/MIN', 'STREAMS', 'TOKENS TODAY', 'TOKENS THIS MONTH', 'HITS'], ...answer.tenants.map(row)]) + '\n');
      });
    });
}
