/**
 * nbaccel's JupyterLab 4 plugins (also loaded by Notebook 7):
 * - `nbaccel:ranks`: the saved rank tabs of `%%distributed` cells (RANKS_MIME), added to the
 *   app's rendermime and rebound to each notebook's own (its trust and link resolver);
 * - `nbaccel:workers`: the status-bar item and the sidebar panel of the focused notebook's
 *   persistent workers, over the `nbaccel.workers` comm.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { installRanksRenderer } from './renderer';
import { WorkersModel } from './workers/model';
import { Confirm, WorkersPanel } from './workers/panel';
import { WorkersStatusItem } from './workers/statusItem';

import '../style/index.css';

const ranksPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbaccel:ranks',
  description: 'Saved per-rank tabs of %%distributed cells.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  optional: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, rendermime: IRenderMimeRegistry, tracker: INotebookTracker | null) => {
    installRanksRenderer(rendermime);
    // A notebook clones the app's registry; rebind so nested outputs use the notebook's own.
    tracker?.widgetAdded.connect((_, panel) => installRanksRenderer(panel.content.rendermime));
  }
};

const workersIcon = new LabIcon({
  name: 'nbaccel:workers',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<rect x="3" y="4" width="8" height="7" rx="1"/><rect x="13" y="4" width="8" height="7" rx="1"/>' +
    '<rect x="3" y="13" width="8" height="7" rx="1"/><rect x="13" y="13" width="8" height="7" rx="1"/></g></svg>'
});

const confirmWithDialog: Confirm = async (title, body, action) => {
  const result = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: action })]
  });
  return result.button.accept;
};

const workersPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbaccel:workers',
  description: 'Status-bar item and sidebar panel of nbaccel persistent workers.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker, statusBar: IStatusBar | null) => {
    const model = new WorkersModel();
    const follow = () => model.setSession(tracker.currentWidget?.sessionContext ?? null);
    tracker.currentChanged.connect(follow);
    follow();
    const panel = new WorkersPanel(model, confirmWithDialog);
    panel.title.icon = workersIcon;
    app.shell.add(panel, 'right', { rank: 900 });
    const open = () => app.shell.activateById(panel.id);
    if (statusBar) {
      const item = new WorkersStatusItem(model, open);
      statusBar.registerStatusItem('nbaccel:workers-status', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => true,
        activeStateChanged: model.changed
      });
    }
  }
};

export default [ranksPlugin, workersPlugin];
