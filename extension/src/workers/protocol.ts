/**
 * The `nbaccel.workers` comm: what the kernel pushes and what the panel asks (docs/extension.md).
 *
 * Example:
 *   statusWords(parseMessage(msg.content.data), 0)   // 'nbaccel: 2 ranks idle'
 */

export const COMM_TARGET = 'nbaccel.workers';
export const PROTOCOL_VERSION = 1;

export interface IRankInfo {
  rank: number;
  pid: number | null;
  device: string | null;
  state: string;
  host_memory: number | null;
  gpu_memory: number | null;
  /** Percent of one core since the kernel's previous sample (null on another node); newer kernels only. */
  cpu_percent?: number | null;
  /** The most resident memory sampled since the workers started. */
  peak_host_memory?: number | null;
  /** GPU memory held by torch's caching allocator, and used on the whole device. */
  gpu_reserved?: number | null;
  gpu_device_used?: number | null;
  /** What NVML lists for the rank's pid on its GPU, its peak, and the GPU's utilisation (%), sampled by the kernel. */
  gpu_held?: number | null;
  peak_gpu_held?: number | null;
  gpu_util?: number | null;
  /** '[12]': the last cell it ran, as the notebook numbers it (or its first line). */
  last_cell: string | null;
  node: string | null;
}

export interface IWorkersStatus {
  /** 'starting' | 'idle' | 'busy' | 'stopping' | 'crashed' */
  state: string;
  num_processes: number;
  /** The execution count of the cell running on the workers, when busy. */
  cell: number | null;
  /** Seconds the current cell had been running when the kernel sent this. */
  busy_seconds: number | null;
  message?: string | null;
  ranks: IRankInfo[];
}

/** A status message: `workers` is null when none run. */
export interface IStatusMessage {
  type: 'status';
  version: number;
  workers: IWorkersStatus | null;
  /** Why none run, when that is news ('stopped after a failure ...'). */
  message?: string | null;
}

export interface IErrorMessage {
  type: 'error';
  request: string;
  message: string;
}

export type KernelMessage = IStatusMessage | IErrorMessage;

export type Request = 'status' | 'restart' | 'stop';

/** The message in a comm_msg's data, or null for one this frontend does not know. */
export function parseMessage(data: unknown): KernelMessage | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const message = data as KernelMessage;
  if (message.type === 'status' && (message as IStatusMessage).version === PROTOCOL_VERSION) {
    return message;
  }
  if (message.type === 'error' && typeof (message as IErrorMessage).message === 'string') {
    return message;
  }
  return null;
}

/** 'nbaccel: 4 ranks idle', 'nbaccel: 4 ranks busy (cell [12], 3:05)', 'nbaccel: no workers'. */
export function statusWords(workers: IWorkersStatus | null, sinceReceived: number): string {
  if (!workers) {
    return 'nbaccel: no workers';
  }
  const n = workers.num_processes;
  const ranks = `${n} rank${n === 1 ? '' : 's'}`;
  if (workers.state !== 'busy') {
    return `nbaccel: ${ranks} ${workers.state}`;
  }
  const parts: string[] = [];
  if (workers.cell !== null && workers.cell !== undefined) {
    parts.push(`cell [${workers.cell}]`);
  }
  if (workers.busy_seconds !== null && workers.busy_seconds !== undefined) {
    parts.push(clock(workers.busy_seconds + sinceReceived));
  }
  return `nbaccel: ${ranks} busy${parts.length ? ` (${parts.join(', ')})` : ''}`;
}

/** '3:05', '1:02:07' */
export function clock(seconds: number): string {
  const total = Math.max(0, Math.floor(seconds));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = String(total % 60).padStart(2, '0');
  return h ? `${h}:${String(m).padStart(2, '0')}:${s}` : `${m}:${s}`;
}

/** '1.2 GiB', '340 MiB', '—' for unknown. */
export function bytesWords(bytes: number | null): string {
  if (bytes === null || bytes === undefined) {
    return '—';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 10 || unit === 0 ? Math.round(value) : value.toFixed(1)} ${units[unit]}`;
}
