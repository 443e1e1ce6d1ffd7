/**
 * The status-bar item: 'nbaccel: 4 ranks idle', 'nbaccel: 4 ranks busy (cell [12], 3:05)',
 * 'nbaccel: no workers'; hidden while the focused kernel has no nbaccel loaded. A click opens
 * the workers panel.
 *
 * Example:
 *   statusBar.registerStatusItem('nbaccel:workers', { item: new WorkersStatusItem(model, open), align: 'left',
 *     isActive: () => true });
 */

import { Widget } from '@lumino/widgets';

import type { WorkersModel } from './model';
import { statusWords } from './protocol';

export class WorkersStatusItem extends Widget {
  constructor(model: WorkersModel, onClick: () => void) {
    super({ node: document.createElement('button') });
    this._model = model;
    this.addClass('nbaccel-workers-status');
    this.addClass('jp-StatusBar-TextItem');
    (this.node as HTMLButtonElement).type = 'button';
    this.node.title = 'nbaccel workers: click for the panel';
    this.node.addEventListener('click', onClick);
    model.changed.connect(this.refresh, this);
    this.refresh();
  }

  /** The words shown now ('' while hidden). */
  get text(): string {
    return this.node.textContent ?? '';
  }

  refresh(): void {
    const connection = this._model.connection;
    if (!connection?.connected) {
      this.node.textContent = '';
      this.hide();
      this._tick(false);
      return;
    }
    const workers = connection.workers;
    this.node.textContent = statusWords(workers, (Date.now() - connection.receivedAt) / 1000);
    this.node.dataset.state = workers?.state ?? 'none';
    this.show();
    this._tick(workers?.state === 'busy');
  }

  dispose(): void {
    this._tick(false);
    this._model.changed.disconnect(this.refresh, this);
    super.dispose();
  }

  /** While busy, the clock moves once a second without the kernel sending anything. */
  private _tick(on: boolean): void {
    if (on && this._timer === null) {
      this._timer = window.setInterval(() => this.refresh(), 1000);
    } else if (!on && this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  private _model: WorkersModel;
  private _timer: number | null = null;
}
