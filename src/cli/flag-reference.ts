import type { Command, Option } from 'commander';
import { fullProgram } from './program.js';

/**
 * The flag reference (docs/configuration.md), rendered from the program's own commander
 * definitions: every command, its arguments and every flag it takes (hidden aliases aside), with the
 * default and the help text `ebb COMMAND --help` prints. Nothing here is written by hand, so the page
 * cannot say a flag, a default or a choice the CLI does not have. src/build/configuration-doc.ts
 * writes it (npm run docs); test/configuration-doc.test.ts fails when the page is stale.
 */

/** Markdown table cells: one line, no column break. */
const cell = (text: string): string => text.replace(/\s*\n\s*/g, ' ').replaceAll('|', '\\|');

function defaultOf(opt: Option): string {
  if (opt.defaultValueDescription !== undefined) return opt.defaultValueDescription;
  const v: unknown = opt.defaultValue;
  if (v === undefined) return '';
  if (Array.isArray(v)) return v.length === 0 ? 'none' : v.join(', ');
  return String(v);
}

function optionRow(opt: Option): string {
  const choices = opt.argChoices ? ` One of: ${opt.argChoices.map((c) => `\`${c}\``).join(', ')}.` : '';
  const def = defaultOf(opt);
  return `| \`${cell(opt.flags)}\` | ${def === '' ? '' : `\`${cell(def)}\``} | ${cell(opt.description)}${choices} |`;
}

function commandSection(cmd: Command, path: string[]): string[] {
  const name = [...path, cmd.name()].join(' ');
  const lines = [`## \`${name}\``, '', `\`${name} ${cmd.usage()}\``, '', cell(cmd.description()), ''];
  const args = cmd.registeredArguments;
  if (args.length > 0) {
    lines.push('| argument | meaning |', '|---|---|');
    for (const a of args) lines.push(`| \`${a.name()}${a.variadic ? '...' : ''}\`${a.required ? '' : ' (optional)'} | ${cell(a.description)} |`);
    lines.push('');
  }
  const options = cmd.options.filter((o) => !o.hidden);
  if (options.length > 0) {
    lines.push('| flag | default | meaning |', '|---|---|---|', ...options.map(optionRow), '');
  }
  for (const sub of cmd.commands) lines.push(...commandSection(sub, [...path, cmd.name()]));
  return lines;
}

/** docs/configuration.md, as the program defines it now. */
export async function renderConfiguration(): Promise<string> {
  const program = await fullProgram();
  const global = program.options.filter((o) => !o.hidden);
  const lines = [
    '# Configuration reference',
    '',
    '<!-- Generated from the CLI\'s own definitions by `npm run docs` (src/cli/flag-reference.ts). Do not edit:',
    '     test/configuration-doc.test.ts fails when this page and the CLI disagree. -->',
    '',
    'Every `ebb` command and flag, as `ebb COMMAND --help` prints it. Flags named `*-ms` take',
    'milliseconds or a duration with a unit (`30s`); `--timeout`, `--deadline` and the like need the unit',
    '(`500ms`, `30s`, `10m`). What the flags do together is told in the guides: [operating a fleet](operating.md),',
    '[frontends](frontends.md), [engines](engines.md), [Kubernetes](kubernetes.md), [observability](observability.md).',
    '',
    '## Global options',
    '',
    'Before or after the command (`ebb --log-format json up`); they reach the components `ebb up` starts.',
    '',
    '| flag | default | meaning |',
    '|---|---|---|',
    ...global.map(optionRow),
    '',
  ];
  for (const cmd of program.commands) lines.push(...commandSection(cmd, ['ebb']));
  return `${lines.join('\n').trimEnd()}\n`;
}
