/**
 * The workers sidebar: each rank's pid, device, state, host and GPU memory (and GPU use, where
 * NVML answers the kernel), last cell and node,
 * with Interrupt, Restart and Stop (the last two ask first).
 *
 * Example:
 *   const panel = new WorkersPanel(model, confirmWithDialog);
 *   app.shell.add(panel, 'right', { rank: 900 });
 */

import { Widget } from '@lumino/widgets';

import type { WorkersModel } from './model';
import { bytesWords, IRankInfo, IWorkersStatus, statusWords } from './protocol';

/** Asks the user; resolves true to go ahead. */
export type Confirm = (title: string, body: string, action: string) => Promise<boolean>;

const COLUMNS: [string, (rank: IRankInfo) => string][] = [
  ['rank', r => String(r.rank)],
  ['pid', r => (r.pid === null ? '—' : String(r.pid))],
  ['device', r => r.device ?? '—'],
  ['state', r => r.state],
  ['cpu', r => (r.cpu_percent === null || r.cpu_percent === undefined ? '—' : `${Math.round(r.cpu_percent)}%`)],
  ['host memory', r => bytesWords(r.host_memory)],
  ['peak', r => bytesWords(r.peak_host_memory ?? null)],
  ['GPU memory', r => gpuWords(r)],
  ['GPU use', r => gpuUseWords(r)],
  ['last cell', r => r.last_cell ?? '—']
];

/** Allocated, and where known what torch reserved and the device uses: '1.0 GiB (2.0 GiB reserved, 3.5 GiB on device)'. */
function gpuWords(r: IRankInfo): string {
  const allocated = bytesWords(r.gpu_memory);
  const more = [
    typeof r.gpu_reserved === 'number' ? `${bytesWords(r.gpu_reserved)} reserved` : null,
    typeof r.gpu_device_used === 'number' ? `${bytesWords(r.gpu_device_used)} on device` : null
  ].filter(Boolean);
  return more.length ? `${allocated} (${more.join(', ')})` : allocated;
}

/** What NVML says of the rank, sampled by the kernel: '1.0 GiB (peak 2.0 GiB), 88% busy'; '—' without NVML. */
function gpuUseWords(r: IRankInfo): string {
  const held = typeof r.gpu_held === 'number' ? bytesWords(r.gpu_held) : null;
  const peak = typeof r.peak_gpu_held === 'number' ? ` (peak ${bytesWords(r.peak_gpu_held)})` : '';
  const busy = typeof r.gpu_util === 'number' ? `${Math.round(r.gpu_util)}% busy` : null;
  const words = [held === null ? null : `${held}${peak}`, busy].filter(Boolean);
  return words.length ? words.join(', ') : '—';
}

export class WorkersPanel extends Widget {
  constructor(model: WorkersModel, confirm: Confirm) {
    super();
    this._model = model;
    this._confirm = confirm;
    this.id = 'nbaccel-workers-panel';
    this.addClass('nbaccel-workers-panel');
    this.title.caption = 'nbaccel workers';
    this._summary = append(this.node, 'div', 'nbaccel-workers-summary');
    this._error = append(this.node, 'div', 'nbaccel-workers-error');
    this._table = append(this.node, 'table', 'nbaccel-workers-table') as HTMLTableElement;
    const buttons = append(this.node, 'div', 'nbaccel-workers-buttons');
    this._buttons = {
      interrupt: button(buttons, 'Interrupt', () => void this.interrupt()),
      restart: button(buttons, 'Restart', () => void this.ask('restart')),
      stop: button(buttons, 'Stop', () => void this.ask('stop'))
    };
    model.changed.connect(this.refresh, this);
    this.refresh();
  }

  refresh(): void {
    const connection = this._model.connection;
    const workers = connection?.connected ? connection.workers : null;
    this._summary.textContent = connection?.connected
      ? statusWords(workers, (Date.now() - connection.receivedAt) / 1000)
      : 'nbaccel is not loaded in this notebook’s kernel (run %load_ext nbaccel).';
    this._error.textContent = connection?.lastError ?? connection?.message ?? workers?.message ?? '';
    this._renderTable(workers);
    const busy = workers?.state === 'busy';
    this._buttons.interrupt.disabled = !busy;
    this._buttons.restart.disabled = !workers;
    this._buttons.stop.disabled = !workers;
  }

  /** The kernel's interrupt, as the notebook's stop button (the running cell gets KeyboardInterrupt). */
  async interrupt(): Promise<void> {
    await this._model.connection?.interrupt();
  }

  /** Restart or stop the workers once the user confirms. */
  async ask(request: 'restart' | 'stop'): Promise<void> {
    const connection = this._model.connection;
    const n = connection?.workers?.num_processes ?? 0;
    const body =
      request === 'stop'
        ? `Stop the ${n} nbaccel worker processes? Their state (models, data in memory) is lost.`
        : `Restart the ${n} nbaccel worker processes? Their state is lost; they come back empty.`;
    const verb = request === 'stop' ? 'Stop' : 'Restart';
    if (connection && (await this._confirm(`${verb} nbaccel workers`, body, verb))) {
      connection.request(request);
    }
  }

  dispose(): void {
    this._model.changed.disconnect(this.refresh, this);
    super.dispose();
  }

  private _renderTable(workers: IWorkersStatus | null): void {
    this._table.replaceChildren();
    if (!workers?.ranks.length) {
      return;
    }
    const columns = workers.ranks.some(r => r.node)
      ? [...COLUMNS, ['node', (r: IRankInfo) => r.node ?? '—'] as const]
      : COLUMNS;
    const head = append(append(this._table, 'thead', ''), 'tr', '');
    columns.forEach(([name]) => append(head, 'th', '', name));
    const body = append(this._table, 'tbody', '');
    for (const rank of workers.ranks) {
      const row = append(body, 'tr', '');
      row.dataset.rank = String(rank.rank);
      columns.forEach(([, cell]) => append(row, 'td', '', cell(rank)));
    }
  }

  private _model: WorkersModel;
  private _confirm: Confirm;
  private _summary: HTMLElement;
  private _error: HTMLElement;
  private _table: HTMLTableElement;
  private _buttons: Record<'interrupt' | 'restart' | 'stop', HTMLButtonElement>;
}

function append(parent: HTMLElement, tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  parent.append(node);
  return node;
}

function button(parent: HTMLElement, label: string, onClick: () => void): HTMLButtonElement {
  const node = append(parent, 'button', 'jp-Button nbaccel-workers-button', label) as HTMLButtonElement;
  node.type = 'button';
  node.dataset.action = label.toLowerCase();
  node.addEventListener('click', onClick);
  return node;
}
