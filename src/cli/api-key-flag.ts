import { Option } from 'commander';
import { createAdminGuard, loadAdminTokens, type AdminGuard } from '../common/admin-auth.js';

/** --api-key-file, on every listener that serves the OpenAI API (the frontend, a worker's --openai-port). */
export function apiKeyFileOption(where = ''): Option {
  return new Option('--api-key-file <path>', `clients must send one of these keys as Authorization: Bearer on /v1/ routes${where} (one key, or name:key lines); default: no client authentication`);
}

/** The keys' guard; none without a file. Not EBB_ADMIN_TOKEN: API keys come from their own file only. */
export async function loadApiGuard(file: string | undefined): Promise<AdminGuard | undefined> {
  return file === undefined ? undefined : createAdminGuard(await loadAdminTokens(file, {}), 'API');
}
