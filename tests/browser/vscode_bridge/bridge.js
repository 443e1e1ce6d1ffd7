// The bridge page's script: VS Code's widget renderer (@vscode/jupyter-ipywidgets8) given a real
// kernel connection (@jupyterlab/services, over jupyter_server's websocket), as VS Code's notebook
// webview gives it a proxy of one.
import { KernelManager, ServerConnection } from '@jupyterlab/services';
import { activate } from '@vscode/jupyter-ipywidgets8';

window.bridgeLog = [];
window.startBridge = async function ({ baseUrl, token, kernelId, cells, cellId }) {
  const serverSettings = ServerConnection.makeSettings({ baseUrl, wsUrl: baseUrl.replace(/^http/, 'ws'), token, appendToken: true });
  const kernels = new KernelManager({ serverSettings });
  await kernels.ready;
  const kernel = kernels.connectTo({ model: { id: kernelId, name: 'python3' } });
  activate();
  window.vscIPyWidgets8.load();
  const out = document.getElementById('out');
  const scriptLoader = { widgetsRegisteredInRequireJs: new Set(), loadWidgetScript: async () => {}, successHandler() {}, errorHandler() {} };
  const manager = new window.vscIPyWidgets.WidgetManager(kernel, out, scriptLoader, (m) => window.bridgeLog.push(m));
  for (const code of cells) {
    const future = kernel.requestExecute({ code, silent: false, store_history: true }, true, { cellId });
    future.onIOPub = async (msg) => {
      const kind = msg.header.msg_type;
      if (kind !== 'display_data' && kind !== 'update_display_data') return;
      const data = msg.content.data;
      const widget = data['application/vnd.jupyter.widget-view+json'];
      if (widget) {
        const model = await manager.get_model(widget.model_id);
        const view = await manager.create_view(model, {});
        await manager.display_view(undefined, view, { node: out });
      } else if (data['text/html']) {
        out.innerHTML = data['text/html']; // what VS Code shows for the static view that replaces the widget
      }
    };
    await future.done;
  }
  window.bridgeDone = true;
};
