/**
 * The saved rank tabs, rendered in jsdom through a real rendermime registry (JupyterLab's
 * standard renderers), from the bundles the kernel writes: all done, a failed rank, rich
 * outputs (trusted and not), a capped log, and a bundle from an unknown schema version.
 */

import { MimeModel, RenderMimeRegistry, standardRendererFactories } from '@jupyterlab/rendermime';
import { Widget } from '@lumino/widgets';

import { IRankEntry, IRanksBundle, RANKS_MIME } from '../bundle';
import { installRanksRenderer } from '../renderer';
import { RanksView } from '../ranksView';

function entry(rank: number, extra: Partial<IRankEntry> = {}): IRankEntry {
  return {
    rank,
    status: { kind: 'done', short: 'done', long: 'done' },
    elapsed: 1.5,
    outputs: [{ output_type: 'stream', name: 'stdout', text: `hello from rank ${rank}\n` }],
    dropped_lines: 0,
    log_path: null,
    ...extra
  };
}

function bundle(ranks: IRankEntry[], summary = 'done in 1.5 s'): IRanksBundle {
  return {
    version: 1,
    title: `${ranks.length} ranks`,
    summary,
    num_processes: ranks.length,
    log_dir: '/tmp/logs/launch-1',
    ranks
  };
}

function registry(): RenderMimeRegistry {
  const rendermime = new RenderMimeRegistry({ initialFactories: standardRendererFactories });
  installRanksRenderer(rendermime);
  return rendermime;
}

async function render(data: IRanksBundle | unknown, trusted = true): Promise<RanksView> {
  const rendermime = registry();
  const view = rendermime.createRenderer(RANKS_MIME) as RanksView;
  Widget.attach(view, document.body);
  await view.renderModel(new MimeModel({ data: { [RANKS_MIME]: data as any }, trusted }));
  return view;
}

const tabs = (view: Widget) => Array.from(view.node.querySelectorAll<HTMLElement>('[role="tab"]'));
const panels = (view: Widget) => Array.from(view.node.querySelectorAll<HTMLElement>('[role="tabpanel"]'));
const visible = (node: HTMLElement) => !node.classList.contains('lm-mod-hidden');

afterEach(() => {
  document.body.innerHTML = '';
});

describe('the rank tabs renderer', () => {
  it('wins over the text/html fallback, also in an untrusted notebook', () => {
    const rendermime = registry();
    const data = { [RANKS_MIME]: {}, 'text/html': '<b>x</b>', 'text/plain': 'x' };
    expect(rendermime.preferredMimeType(data, 'any')).toBe(RANKS_MIME);
    expect(rendermime.preferredMimeType(data, 'ensure')).toBe(RANKS_MIME);
  });

  it('shows all-done ranks as chips and tabs in words, rank 0 first and selected', async () => {
    const view = await render(bundle([entry(1), entry(0)]));
    expect(tabs(view).map(t => t.textContent)).toEqual(['rank 0 · done', 'rank 1 · done']);
    expect(tabs(view).map(t => t.getAttribute('aria-selected'))).toEqual(['true', 'false']);
    expect(view.selectedRank).toBe(0);
    const chips = Array.from(view.node.querySelectorAll('.nbaccel-chip')).map(c => c.textContent);
    expect(chips).toEqual(['✓ rank 0 · done (1.5 s)', '✓ rank 1 · done (1.5 s)']);
    expect(view.node.querySelector('.nbaccel-ranks-title')?.textContent).toBe('nbaccel 2 ranks · done in 1.5 s');
    expect(view.node.querySelector('.nbaccel-ranks-logs')?.textContent).toBe('full logs: /tmp/logs/launch-1');
    expect(panels(view).map(visible)).toEqual([true, false]);
    expect(panels(view)[0].textContent).toContain('hello from rank 0');
    tabs(view)[1].click();
    expect(panels(view).map(visible)).toEqual([false, true]);
    expect(view.selectedRank).toBe(1);
  });

  it("prefers the kernel's symbols and duration words the bundle carries", async () => {
    const failed = entry(1, {
      status: { kind: 'failed', symbol: '✘', short: 'failed (SIGKILL)', long: 'failed: killed by SIGKILL' },
      elapsed: 185.2,
      elapsed_words: '3 min 05 s (kernel)'
    });
    const view = await render(bundle([entry(0, { elapsed_words: '1.5 s' }), failed]));
    const chips = Array.from(view.node.querySelectorAll('.nbaccel-chip')).map(c => c.textContent);
    expect(chips).toEqual(['✓ rank 0 · done (1.5 s)', '✘ rank 1 · failed: killed by SIGKILL (3 min 05 s (kernel))']);
    expect(tabs(view).map(t => t.textContent)).toEqual(['rank 0 · done', '✘ rank 1 · failed (SIGKILL)']);
  });

  it('marks a failed rank in words and starts its panel with the traceback', async () => {
    const failed = entry(1, {
      status: { kind: 'failed', short: 'failed (ValueError)', long: 'failed: ValueError', exception: 'ValueError' },
      failure: {
        output_type: 'error',
        ename: 'ValueError',
        evalue: 'boom',
        traceback: [
          'rank 1 failed: ValueError: boom',
          'Traceback (most recent call last):',
          '\u001b[31mValueError\u001b[0m: boom'
        ]
      }
    });
    const stopped = entry(0, {
      status: { kind: 'stopped', short: 'stopped', long: 'stopped by nbaccel after another rank failed' }
    });
    const view = await render(bundle([stopped, failed], 'failed after 2.0 s'));
    expect(tabs(view).map(t => t.textContent)).toEqual(['rank 0 · stopped', '✗ rank 1 · failed (ValueError)']);
    expect(tabs(view)[1].classList.contains('nbaccel-failed')).toBe(true);
    const first = panels(view)[1].firstElementChild as HTMLElement;
    expect(first.classList.contains('nbaccel-failure')).toBe(true);
    expect(first.textContent).toContain('Traceback (most recent call last):');
    expect(first.textContent).toContain('ValueError: boom');
    expect(first.textContent).not.toContain('\u001b'); // ANSI colours became spans
    expect(view.node.querySelector('.nbaccel-chip[data-kind="failed"]')?.textContent).toBe(
      '✗ rank 1 · failed: ValueError (1.5 s)'
    );
  });

  it("renders rank 1's display(HTML) and image in rank 1's panel only", async () => {
    const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
    const rich = entry(1, {
      outputs: [
        {
          output_type: 'display_data',
          data: { 'text/html': ['<b class="from-rank">from ', 'rank 1</b>'], 'text/plain': 'x' },
          metadata: {}
        },
        { output_type: 'display_data', data: { 'image/png': png, 'text/plain': '<Figure>' }, metadata: {} }
      ]
    });
    const view = await render(bundle([entry(0), rich]));
    const [zero, one] = panels(view);
    expect(one.querySelector('b.from-rank')?.textContent).toBe('from rank 1');
    expect(one.querySelector('img')?.getAttribute('src')).toContain('data:image/png;base64,');
    expect(zero.querySelector('b.from-rank')).toBeNull();
  });

  it('renders an untrusted notebook safely: sanitized html, no script, javascript not run', async () => {
    const risky = entry(1, {
      outputs: [
        {
          output_type: 'display_data',
          data: { 'text/html': '<b>ok</b><img src=x onerror="window.pwned=1"><script>window.pwned=1</script>' }
        },
        { output_type: 'display_data', data: { 'application/javascript': 'window.pwned = 1' } }
      ]
    });
    const view = await render(bundle([entry(0), risky]), false);
    const one = panels(view)[1];
    expect(one.querySelector('b')?.textContent).toBe('ok');
    expect(one.querySelector('script')).toBeNull();
    expect(one.querySelector('[onerror]')).toBeNull();
    expect(one.textContent).toContain('application/javascript, not shown until the notebook is trusted');
    expect((window as any).pwned).toBeUndefined();
  });

  it('says how many lines a capped log dropped and where the full log is', async () => {
    const capped = entry(0, { dropped_lines: 1200, dropped_displays: 3, log_path: '/tmp/logs/launch-1/rank-0.log' });
    const view = await render(bundle([capped]));
    expect(view.node.querySelector('.nbaccel-dropped')?.textContent).toBe(
      '… 1,200 earlier lines and 3 earlier displays not shown; the full log is in /tmp/logs/launch-1/rank-0.log'
    );
  });

  it('says what is wrong with a bundle of another schema version', async () => {
    const view = await render({ version: 2, ranks: [] });
    expect(tabs(view)).toEqual([]);
    expect(view.node.textContent).toContain('bundle version 2 is not 1.x');
  });
});
