/**
 * The workers of the notebook in focus: one WorkersConnection per session's kernel, swapped
 * when the kernel changes (a restart keeps the same kernel connection, which rejoins).
 *
 * Example:
 *   const model = new WorkersModel();
 *   tracker.currentChanged.connect((_, panel) => model.setSession(panel?.sessionContext ?? null));
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { WorkersConnection } from './connection';

export class WorkersModel {
  /** Emitted when the focused notebook changes or its workers' status does. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get connection(): WorkersConnection | null {
    return this._connection;
  }

  /** Follow `session` (the focused notebook's), or nothing. */
  setSession(session: ISessionContext | null): void {
    if (session === this._session) {
      return;
    }
    this._session?.kernelChanged.disconnect(this._onKernelChanged, this);
    this._session = session;
    session?.kernelChanged.connect(this._onKernelChanged, this);
    this.setKernel(session?.session?.kernel ?? null);
  }

  /** Follow `kernel` directly (used by setSession, and by tests with a fake kernel). */
  setKernel(kernel: Kernel.IKernelConnection | null): void {
    if (this._connection?.kernel === kernel) {
      return;
    }
    this._connection?.changed.disconnect(this._emit, this);
    if (kernel) {
      let connection = this._connections.get(kernel);
      if (!connection) {
        connection = new WorkersConnection(kernel);
        this._connections.set(kernel, connection);
        kernel.disposed.connect(() => {
          connection?.dispose();
          this._connections.delete(kernel);
        });
        void connection.connect();
      }
      this._connection = connection;
      connection.changed.connect(this._emit, this);
    } else {
      this._connection = null;
    }
    this._emit();
  }

  private _onKernelChanged(_: ISessionContext, change: { newValue: Kernel.IKernelConnection | null }): void {
    this.setKernel(change.newValue);
  }

  private _emit(): void {
    this._changed.emit();
  }

  private _changed = new Signal<this, void>(this);
  private _session: ISessionContext | null = null;
  private _connection: WorkersConnection | null = null;
  private _connections = new Map<Kernel.IKernelConnection, WorkersConnection>();
}
