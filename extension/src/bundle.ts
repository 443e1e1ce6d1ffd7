/**
 * The per-rank bundle a finished `%%distributed` cell saves under RANKS_MIME (schema: docs/extension.md).
 *
 * The kernel writes it (nbaccel/output/widgets/bundle.py); this module only reads it and
 * says its parts in words, so a bundle from a newer nbaccel degrades to a clear message.
 *
 * Example:
 *   const bundle = readBundle(model.data[RANKS_MIME]);   // throws BundleError on a bad one
 *   tabLabel(bundle.ranks[0]);                           // 'rank 0 · done'
 */

import type { PartialJSONObject } from '@lumino/coreutils';

export const RANKS_MIME = 'application/vnd.nbaccel.ranks+json';

/** The schema versions this renderer understands (a newer major falls back to html). */
export const SCHEMA_VERSION = 1;

/** One Jupyter output, as nbformat stores it (stream, display_data, execute_result, error). */
export interface IOutput {
  output_type: string;
  name?: string;
  text?: string | string[];
  data?: PartialJSONObject;
  metadata?: PartialJSONObject;
  ename?: string;
  evalue?: string;
  traceback?: string[];
}

/** How a rank ended, in words: `kind` picks the colour, the words say it without colour. */
export interface IRankStatus {
  kind: 'waiting' | 'running' | 'done' | 'failed' | 'stopped';
  /** The kind's symbol as the kernel draws it; a bundle from before it carried one lacks it. */
  symbol?: string;
  short: string;
  long: string;
  exception?: string | null;
  exit_code?: number | null;
  signal?: string | null;
}

export interface IRankEntry {
  rank: number;
  status: IRankStatus;
  elapsed?: number | null;
  /** `elapsed` in the kernel's words ('1.5 s'); a bundle from before it carried them lacks it. */
  elapsed_words?: string | null;
  node?: string | null;
  failure?: IOutput | null;
  progress?: string[];
  outputs: IOutput[];
  dropped_lines: number;
  dropped_displays?: number;
  log_path?: string | null;
  /** The most resident bytes sampled, and on a GPU the most device bytes NVML listed for the
   *  rank's pid; a bundle from before they were sampled lacks them. */
  peak_rss?: number | null;
  peak_gpu_mem?: number | null;
}

export interface IRanksBundle {
  version: number;
  title: string;
  summary: string;
  num_processes: number;
  attempt?: number;
  log_dir?: string | null;
  ranks: IRankEntry[];
}

/** Raised for a bundle this renderer cannot show; its message says what was wrong. */
export class BundleError extends Error {}

/** The bundle in `value`, checked enough that rendering cannot trip over it. */
export function readBundle(value: unknown): IRanksBundle {
  if (typeof value !== 'object' || value === null) {
    throw new BundleError(`expected an object under ${RANKS_MIME}, got ${typeof value}`);
  }
  const bundle = value as IRanksBundle;
  if (typeof bundle.version !== 'number' || Math.floor(bundle.version) !== SCHEMA_VERSION) {
    throw new BundleError(
      `bundle version ${JSON.stringify(bundle.version)} is not ${SCHEMA_VERSION}.x: ` +
        'this extension is older or newer than the nbaccel that wrote the notebook'
    );
  }
  if (!Array.isArray(bundle.ranks)) {
    throw new BundleError('the bundle has no list of ranks');
  }
  for (const entry of bundle.ranks) {
    if (typeof entry?.rank !== 'number' || typeof entry.status?.short !== 'string' || !Array.isArray(entry.outputs)) {
      throw new BundleError(`a rank entry lacks rank, status or outputs: ${JSON.stringify(entry).slice(0, 200)}`);
    }
  }
  return { ...bundle, ranks: [...bundle.ranks].sort((a, b) => a.rank - b.rank) };
}

// For bundles written before they carried the kernel's symbols (nbaccel/output/status_words.py).
const SYMBOL: Record<string, string> = { waiting: '○', running: '●', done: '✓', failed: '✗', stopped: '■' };

/** The status symbol: the kernel's, else this renderer's table for an older bundle. */
export function statusSymbol(entry: IRankEntry): string {
  return entry.status.symbol ?? SYMBOL[entry.status.kind] ?? '';
}

/** How long the rank ran: the kernel's words, else worded here for an older bundle. */
export function durationWords(entry: IRankEntry): string | null {
  if (typeof entry.elapsed_words === 'string') {
    return entry.elapsed_words;
  }
  return typeof entry.elapsed === 'number' ? elapsedWords(entry.elapsed) : null;
}

export function isFailed(entry: IRankEntry): boolean {
  return entry.status.kind === 'failed';
}

/** The tab's label: a failed rank's says so in words ('✗ rank 1 · failed (ValueError)'). */
export function tabLabel(entry: IRankEntry): string {
  const marker = isFailed(entry) ? `${statusSymbol(entry)} ` : '';
  return `${marker}rank ${entry.rank} · ${entry.status.short}`;
}

/** A chip's words: symbol, rank, the long status, the node and time when known. */
export function chipLabel(entry: IRankEntry): string {
  const symbol = statusSymbol(entry);
  const extra = [entry.node, durationWords(entry)].filter(Boolean);
  const tail = extra.length ? ` (${extra.join(', ')})` : '';
  return `${symbol} rank ${entry.rank} · ${entry.status.long}${tail}`.trim();
}

/** '1,200 earlier lines and 3 earlier displays not shown; the full log is in /x/rank-1.log' */
export function droppedWords(entry: IRankEntry): string {
  const parts: string[] = [];
  const lines = entry.dropped_lines ?? 0;
  const displays = entry.dropped_displays ?? 0;
  if (lines) {
    parts.push(`${lines.toLocaleString('en-US')} earlier line${lines === 1 ? '' : 's'}`);
  }
  if (displays) {
    parts.push(`${displays.toLocaleString('en-US')} earlier display${displays === 1 ? '' : 's'}`);
  }
  if (!parts.length) {
    return '';
  }
  const where = entry.log_path ? `; the full log is in ${entry.log_path}` : '';
  return `… ${parts.join(' and ')} not shown${where}`;
}

/** '0.4 s', '12 s', '3 min 05 s', '1 h 02 min' (the kernel's words for a duration; for older bundles). */
export function elapsedWords(seconds: number): string {
  if (seconds < 10) {
    return `${seconds.toFixed(1)} s`;
  }
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  const minutes = Math.floor(seconds / 60);
  const secs = Math.floor(seconds % 60);
  if (minutes < 60) {
    return `${minutes} min ${String(secs).padStart(2, '0')} s`;
  }
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, '0')} min`;
}
