/**
 * The workers status item and panel, driven by comm messages as the kernel sends them.
 *
 * The kernel end is a small in-memory double of the JupyterLab kernel connection (comm_info,
 * comm open/send/close, interrupt, status): the real round trip is in tests/browser.
 */

import { Signal } from '@lumino/signaling';

import { WorkersModel } from '../workers/model';
import { WorkersPanel } from '../workers/panel';
import { bytesWords, IWorkersStatus, statusWords } from '../workers/protocol';
import { WorkersStatusItem } from '../workers/statusItem';

class FakeComm {
  constructor(
    readonly target: string,
    readonly commId: string
  ) {}
  opened: unknown[] = [];
  sent: unknown[] = [];
  onMsg: (msg: any) => void = () => undefined;
  onClose: (msg: any) => void = () => undefined;
  open(data: unknown) {
    this.opened.push(data);
  }
  send(data: unknown) {
    this.sent.push(data);
  }
  dispose() {}
  /** The kernel sends `data` on this comm. */
  deliver(data: unknown) {
    this.onMsg({ content: { comm_id: this.commId, data } });
  }
}

class FakeKernel {
  anyMessage = new Signal<this, any>(this);
  statusChanged = new Signal<this, string>(this);
  disposed = new Signal<this, void>(this);
  openComms: Record<string, { target_name: string }> = {};
  comms: FakeComm[] = [];
  interrupts = 0;
  async requestCommInfo() {
    return { content: { status: 'ok', comms: this.openComms } };
  }
  createComm(target: string, id?: string) {
    const comm = new FakeComm(target, id ?? `comm-${this.comms.length}`);
    this.comms.push(comm);
    return comm;
  }
  hasComm(id: string) {
    return this.comms.some(c => c.commId === id);
  }
  async interrupt() {
    this.interrupts += 1;
  }
}

const idle: IWorkersStatus = {
  state: 'idle',
  num_processes: 4,
  cell: null,
  busy_seconds: null,
  ranks: [0, 1, 2, 3].map(rank => ({
    rank,
    pid: 1000 + rank,
    device: 'cpu',
    state: 'idle',
    host_memory: 300 * 1024 * 1024,
    gpu_memory: null,
    last_cell: '[7]',
    node: null
  }))
};
const status = (workers: IWorkersStatus | null) => ({ type: 'status', version: 1, workers });
const settle = () => new Promise(resolve => setTimeout(resolve, 0));

async function connected(openComms: Record<string, { target_name: string }> = {}) {
  const kernel = new FakeKernel();
  kernel.openComms = openComms;
  const model = new WorkersModel();
  model.setKernel(kernel as any);
  await settle();
  return { kernel, model, comm: kernel.comms[0] };
}

describe('the workers status item', () => {
  it('opens a comm asking for the status; hidden once the kernel refuses it (no nbaccel loaded)', async () => {
    const { kernel, model, comm } = await connected();
    const item = new WorkersStatusItem(model, () => undefined);
    expect(comm.target).toBe('nbaccel.workers');
    expect(comm.opened).toEqual([{ request: 'status' }]);
    expect(item.text).toBe('nbaccel: no workers');
    comm.onClose({});
    expect(item.isHidden).toBe(true);
    expect(item.text).toBe('');
    expect(kernel.comms.length).toBe(1);
  });

  it('follows start, a busy cell with its clock, and stop', async () => {
    const { model, comm } = await connected();
    jest.useFakeTimers({ now: 1_000_000 });
    try {
      const item = new WorkersStatusItem(model, () => undefined);
      comm.deliver(status(idle));
      expect(item.text).toBe('nbaccel: 4 ranks idle');
      comm.deliver(status({ ...idle, state: 'busy', cell: 12, busy_seconds: 185 }));
      expect(item.text).toBe('nbaccel: 4 ranks busy (cell [12], 3:05)');
      jest.advanceTimersByTime(2000);
      expect(item.text).toBe('nbaccel: 4 ranks busy (cell [12], 3:07)');
      comm.deliver(status(null));
      expect(item.text).toBe('nbaccel: no workers');
      item.dispose();
    } finally {
      jest.useRealTimers();
    }
  });

  it('rejoins the comm a reloaded page left open instead of opening another', async () => {
    const { kernel, comm } = await connected({ 'abc-123': { target_name: 'nbaccel.workers' } });
    expect(kernel.comms.length).toBe(1);
    expect(comm.commId).toBe('abc-123');
    expect(comm.opened).toEqual([]);
    expect(comm.sent).toEqual([{ request: 'status' }]);
  });

  it('tries again after a cell that loads nbaccel, when the first attempt was refused', async () => {
    const { kernel, comm } = await connected();
    comm.onClose({}); // "No such comm target registered": nbaccel not loaded yet
    kernel.anyMessage.emit({
      direction: 'send',
      msg: { header: { msg_type: 'execute_request', msg_id: 'm1' }, content: { code: '%load_ext nbaccel' } }
    });
    kernel.anyMessage.emit({
      direction: 'recv',
      msg: { header: { msg_type: 'execute_reply', msg_id: 'r1' }, parent_header: { msg_id: 'm1' }, content: {} }
    });
    await settle();
    expect(kernel.comms.length).toBe(2);
    expect(kernel.comms[1].opened).toEqual([{ request: 'status' }]);
  });

  it('ignores cells that do not mention nbaccel', async () => {
    const { kernel, comm } = await connected();
    comm.onClose({});
    kernel.anyMessage.emit({
      direction: 'send',
      msg: { header: { msg_type: 'execute_request', msg_id: 'm1' }, content: { code: 'print(1)' } }
    });
    kernel.anyMessage.emit({
      direction: 'recv',
      msg: { header: { msg_type: 'execute_reply', msg_id: 'r1' }, parent_header: { msg_id: 'm1' }, content: {} }
    });
    await settle();
    expect(kernel.comms.length).toBe(1);
  });
});

describe('the workers panel', () => {
  it('lists each rank and asks before stopping', async () => {
    const { kernel, model, comm } = await connected();
    const answers: boolean[] = [false, true];
    const asked: string[] = [];
    const panel = new WorkersPanel(model, async (title, body) => {
      asked.push(`${title}: ${body}`);
      return answers.shift() ?? false;
    });
    comm.deliver(status({ ...idle, state: 'busy', cell: 3, busy_seconds: 1 }));
    const rows = Array.from(panel.node.querySelectorAll('tbody tr')).map(r =>
      Array.from(r.children).map(c => c.textContent)
    );
    expect(rows[1]).toEqual(['1', '1001', 'cpu', 'idle', '—', '300 MiB', '—', '—', '—', '[7]']); // an older kernel: no cpu, peak, GPU use
    comm.deliver(
      status({
        ...idle,
        ranks: idle.ranks.map(r => ({
          ...r,
          cpu_percent: 97.4,
          peak_host_memory: 400 * 1024 * 1024,
          gpu_memory: 2 ** 30,
          gpu_reserved: 2 ** 31,
          gpu_device_used: 3 * 2 ** 30,
          gpu_held: 1.5 * 2 ** 30,
          peak_gpu_held: 2 ** 31,
          gpu_util: 88.4
        }))
      })
    );
    const sampled = Array.from(panel.node.querySelectorAll('tbody tr')).map(r =>
      Array.from(r.children).map(c => c.textContent)
    );
    expect(sampled[1].slice(4, 9)).toEqual([
      '97%',
      '300 MiB',
      '400 MiB',
      `${bytesWords(2 ** 30)} (${bytesWords(2 ** 31)} reserved, ${bytesWords(3 * 2 ** 30)} on device)`,
      `${bytesWords(1.5 * 2 ** 30)} (peak ${bytesWords(2 ** 31)}), 88% busy`
    ]);
    comm.deliver(status({ ...idle, state: 'busy', cell: 3, busy_seconds: 1 }));
    const button = (action: string) => panel.node.querySelector<HTMLButtonElement>(`[data-action="${action}"]`)!;
    await panel.ask('stop');
    expect(comm.sent).toEqual([]); // the user said no
    await panel.ask('stop');
    expect(comm.sent).toEqual([{ request: 'stop' }]);
    expect(asked[0]).toContain('Stop nbaccel workers: Stop the 4 nbaccel worker processes?');
    expect(button('interrupt').disabled).toBe(false);
    button('interrupt').click();
    await settle();
    expect(kernel.interrupts).toBe(1);
    comm.deliver({ type: 'error', request: 'restart', message: 'a cell is running on the workers' });
    expect(panel.node.querySelector('.nbaccel-workers-error')?.textContent).toBe('a cell is running on the workers');
    comm.deliver({ ...status(null), message: 'the workers were stopped after a failure' });
    expect(panel.node.querySelector('.nbaccel-workers-error')?.textContent).toBe(
      'the workers were stopped after a failure'
    );
    expect(button('stop').disabled).toBe(true);
  });

  it('shows a node column only when ranks run on several nodes', async () => {
    const { model, comm } = await connected();
    const panel = new WorkersPanel(model, async () => false);
    comm.deliver(status(idle));
    expect(panel.node.querySelectorAll('th').length).toBe(10);
    comm.deliver(status({ ...idle, ranks: idle.ranks.map(r => ({ ...r, node: `node-${r.rank % 2}` })) }));
    expect(Array.from(panel.node.querySelectorAll('tbody tr:last-child td')).pop()?.textContent).toBe('node-1');
    expect(statusWords({ ...idle, num_processes: 1 }, 0)).toBe('nbaccel: 1 rank idle');
  });
});
