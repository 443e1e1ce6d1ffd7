/**
 * The saved view of a `%%distributed` cell: a header with one status chip per rank, then one
 * tab per rank (the lowest first and selected), as the live widget view looked.
 *
 * A failed rank's tab says so in words and its panel starts with its traceback; each rank's
 * rich outputs render in its own panel through the notebook's rendermime (see outputs.ts);
 * a capped log says how much was dropped and where the full log is. All text goes in with
 * textContent, so the view is safe in an untrusted notebook.
 *
 * Example:
 *   const view = new RanksView(options, notebookRendermime);
 *   await view.renderModel(model);      // model.data['application/vnd.nbaccel.ranks+json']
 */

import type { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Panel, PanelLayout, Widget } from '@lumino/widgets';

import {
  BundleError,
  chipLabel,
  droppedWords,
  IRankEntry,
  IRanksBundle,
  isFailed,
  RANKS_MIME,
  readBundle,
  tabLabel
} from './bundle';
import { renderOutput, textWidget } from './outputs';

export class RanksView extends Widget implements IRenderMime.IRenderer {
  constructor(_options: IRenderMime.IRendererOptions, registry: IRenderMimeRegistry | null) {
    super();
    this._registry = registry;
    this.layout = new PanelLayout();
    this.addClass('nbaccel-ranks');
  }

  /** The rank whose tab is selected (null before the first render or with no ranks). */
  get selectedRank(): number | null {
    return this._ranks[this._selected] ?? null;
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this._clear();
    let bundle: IRanksBundle;
    try {
      bundle = readBundle(model.data[RANKS_MIME]);
    } catch (error) {
      const why = error instanceof BundleError ? error.message : String(error);
      this._add(textWidget(`nbaccel: cannot show the saved rank tabs (${why})`, 'nbaccel-ranks-error'));
      return;
    }
    this._ranks = bundle.ranks.map(entry => entry.rank);
    this._add(header(bundle));
    this._tabs = tabBar(bundle.ranks, index => this.select(index));
    this._add(this._tabs);
    for (const entry of bundle.ranks) {
      const panel = await this._rankPanel(entry, model.trusted);
      this._panels.push(panel);
      this._add(panel);
    }
    this.select(0);
  }

  /** Show the tab at `index` (in rank order) and hide the others. */
  select(index: number): void {
    if (index < 0 || index >= this._panels.length) {
      return;
    }
    this._selected = index;
    this._panels.forEach((panel, i) => (i === index ? panel.show() : panel.hide()));
    const buttons = this._tabs?.node.querySelectorAll<HTMLButtonElement>('[role="tab"]') ?? [];
    buttons.forEach((button, i) => {
      button.setAttribute('aria-selected', String(i === index));
      button.tabIndex = i === index ? 0 : -1;
      button.classList.toggle('nbaccel-selected', i === index);
    });
  }

  private async _rankPanel(entry: IRankEntry, trusted: boolean): Promise<Panel> {
    const panel = new Panel();
    panel.addClass('nbaccel-ranks-panel');
    panel.node.setAttribute('role', 'tabpanel');
    panel.node.dataset.rank = String(entry.rank);
    panel.node.setAttribute('aria-label', tabLabel(entry));
    if (entry.failure) {
      const failure = await renderOutput(entry.failure, this._registry, trusted);
      failure.addClass('nbaccel-failure');
      panel.addWidget(failure);
    }
    if (entry.progress?.length) {
      panel.addWidget(textWidget(entry.progress.join('\n'), 'nbaccel-progress'));
    }
    const dropped = droppedWords(entry);
    if (dropped) {
      panel.addWidget(textWidget(dropped, 'nbaccel-dropped'));
    }
    for (const output of entry.outputs) {
      panel.addWidget(await renderOutput(output, this._registry, trusted));
    }
    if (!panel.widgets.length) {
      panel.addWidget(textWidget('(no output)', 'nbaccel-empty'));
    }
    return panel;
  }

  private _add(widget: Widget): void {
    (this.layout as PanelLayout).addWidget(widget);
  }

  private _clear(): void {
    const layout = this.layout as PanelLayout;
    for (const widget of [...layout.widgets]) {
      widget.dispose();
    }
    this._panels = [];
    this._ranks = [];
    this._tabs = null;
    this._selected = 0;
  }

  private _registry: IRenderMimeRegistry | null;
  private _panels: Panel[] = [];
  private _ranks: number[] = [];
  private _tabs: Widget | null = null;
  private _selected = 0;
}

function header(bundle: IRanksBundle): Widget {
  const widget = new Widget();
  widget.addClass('nbaccel-ranks-header');
  const title = element('div', 'nbaccel-ranks-title');
  title.append(element('b', '', 'nbaccel'), element('span', '', ` ${bundle.title} · ${bundle.summary}`));
  widget.node.append(title);
  if (bundle.log_dir) {
    widget.node.append(element('div', 'nbaccel-ranks-logs', `full logs: ${bundle.log_dir}`));
  }
  const chips = element('div', 'nbaccel-ranks-chips');
  for (const entry of bundle.ranks) {
    const chip = element('span', 'nbaccel-chip', chipLabel(entry));
    chip.dataset.kind = entry.status.kind;
    chip.title = `rank ${entry.rank}: ${entry.status.long}`;
    chips.append(chip);
  }
  widget.node.append(chips);
  return widget;
}

function tabBar(entries: IRankEntry[], onSelect: (index: number) => void): Widget {
  const widget = new Widget();
  widget.addClass('nbaccel-ranks-tabs');
  widget.node.setAttribute('role', 'tablist');
  entries.forEach((entry, index) => {
    const button = element('button', 'nbaccel-ranks-tab', tabLabel(entry)) as HTMLButtonElement;
    button.type = 'button';
    button.setAttribute('role', 'tab');
    button.dataset.rank = String(entry.rank);
    button.dataset.kind = entry.status.kind;
    if (isFailed(entry)) {
      button.classList.add('nbaccel-failed');
    }
    button.addEventListener('click', () => onSelect(index));
    button.addEventListener('keydown', event => {
      const step = event.key === 'ArrowRight' ? 1 : event.key === 'ArrowLeft' ? -1 : 0;
      if (step) {
        const next = (index + step + entries.length) % entries.length;
        onSelect(next);
        (widget.node.children[next] as HTMLElement).focus();
      }
    });
    widget.node.append(button);
  });
  return widget;
}

function element(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}
