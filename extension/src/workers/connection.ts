/**
 * This frontend's end of the `nbaccel.workers` comm with one kernel.
 *
 * The frontend opens the comm (the kernel registers its target in `%load_ext nbaccel`), so a
 * reloaded page or a second browser tab finds it again: `requestCommInfo` lists an open one
 * to rejoin, else a fresh one is opened. A kernel without nbaccel loaded closes the comm at
 * once; the connection tries again after a cell that mentions nbaccel, and after a restart.
 * Interrupt is the kernel's own interrupt (as the notebook's stop button); restart and stop
 * are requests the kernel handles when it is idle.
 *
 * Example:
 *   const connection = new WorkersConnection(kernel);
 *   connection.changed.connect(() => console.log(connection.workers));
 *   await connection.connect();
 */

import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { COMM_TARGET, IWorkersStatus, parseMessage, Request } from './protocol';

// Cells after which a kernel may newly have nbaccel loaded (or workers started).
const MENTIONS_NBACCEL = /nbaccel|%distributed|notebook_launcher/;

export class WorkersConnection {
  constructor(kernel: Kernel.IKernelConnection) {
    this.kernel = kernel;
    kernel.anyMessage.connect(this._onAnyMessage, this);
    kernel.statusChanged.connect(this._onStatus, this);
  }

  readonly kernel: Kernel.IKernelConnection;

  /** Emitted on every status the kernel pushes and when the comm opens or closes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** True while a comm with nbaccel in the kernel is open. */
  get connected(): boolean {
    return this._comm !== null;
  }

  /** The workers as last pushed; null when none run (or not connected). */
  get workers(): IWorkersStatus | null {
    return this._workers;
  }

  /** The kernel's note on the last status ('the workers were stopped after a failure ...'). */
  get message(): string | null {
    return this._message;
  }

  /** Date.now() when the last status arrived (the busy clock counts on from it). */
  get receivedAt(): number {
    return this._receivedAt;
  }

  /** The kernel's words for the last request it could not do, until the next status. */
  get lastError(): string | null {
    return this._lastError;
  }

  /** Join the kernel's open comm, or open one; resolves once the attempt is sent. */
  async connect(): Promise<void> {
    if (this._comm || this._connecting || this._disposed) {
      return;
    }
    this._connecting = true;
    try {
      const reply = await this.kernel.requestCommInfo({ target_name: COMM_TARGET });
      const comms = reply.content.status === 'ok' ? reply.content.comms : {};
      const open = Object.keys(comms).find(id => comms[id].target_name === COMM_TARGET && !this.kernel.hasComm(id));
      const comm = this.kernel.createComm(COMM_TARGET, open);
      comm.onMsg = msg => this._onMessage(msg);
      comm.onClose = () => this._onClosed(comm);
      this._comm = comm;
      if (open) {
        comm.send({ request: 'status' });
      } else {
        comm.open({ request: 'status' });
      }
    } catch (error) {
      console.warn('nbaccel: could not reach the kernel for the workers panel', error);
    } finally {
      this._connecting = false;
    }
  }

  /** Interrupt the running cell, as the notebook's stop button does (SIGINT to the kernel). */
  interrupt(): Promise<void> {
    return this.kernel.interrupt();
  }

  /** Ask the kernel to restart or stop the workers (it does so when idle). */
  request(request: Request): void {
    if (!this._comm) {
      throw new Error('nbaccel: not connected to the kernel (run %load_ext nbaccel first)');
    }
    this._comm.send({ request });
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this.kernel.anyMessage.disconnect(this._onAnyMessage, this);
    this.kernel.statusChanged.disconnect(this._onStatus, this);
    // Local only: the comm stays open in the kernel for other tabs (a reload rejoins it).
    this._comm?.dispose();
    this._comm = null;
    Signal.clearData(this);
  }

  private _onMessage(msg: KernelMessage.ICommMsgMsg): void {
    const message = parseMessage(msg.content.data);
    if (message?.type === 'status') {
      this._workers = message.workers;
      this._message = message.message ?? null;
      this._receivedAt = Date.now();
      this._lastError = null;
    } else if (message?.type === 'error') {
      this._lastError = message.message;
    } else {
      return;
    }
    this._changed.emit();
  }

  private _onClosed(comm: Kernel.IComm): void {
    if (this._comm === comm) {
      this._comm = null;
      this._workers = null;
      this._changed.emit();
    }
  }

  private _onAnyMessage(_: Kernel.IKernelConnection, args: Kernel.IAnyMessageArgs): void {
    const msg = args.msg;
    if (args.direction === 'send' && msg.header.msg_type === 'execute_request') {
      const code = String((msg.content as { code?: unknown }).code ?? '');
      if (MENTIONS_NBACCEL.test(code)) {
        this._watched.add(msg.header.msg_id);
      }
    } else if (args.direction === 'recv' && msg.header.msg_type === 'execute_reply') {
      const parent = (msg.parent_header as { msg_id?: string }).msg_id ?? '';
      if (this._watched.delete(parent) && !this._comm) {
        void this.connect();
      }
    }
  }

  private _onStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._comm = null; // the kernel connection drops its comms on a restart
      this._workers = null;
      this._restarted = true;
      this._changed.emit();
    } else if (status === 'idle' && this._restarted) {
      this._restarted = false;
      void this.connect(); // nbaccel may be loaded from the IPython config
    }
  }

  private _changed = new Signal<this, void>(this);
  private _comm: Kernel.IComm | null = null;
  private _connecting = false;
  private _disposed = false;
  private _restarted = false;
  private _workers: IWorkersStatus | null = null;
  private _receivedAt = 0;
  private _lastError: string | null = null;
  private _message: string | null = null;
  private _watched = new Set<string>();
}
