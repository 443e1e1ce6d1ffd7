/**
 * The renderer factory of the rank tabs, bound to one rendermime registry (a notebook's own,
 * so nested outputs resolve links and respect trust as the notebook does).
 *
 * Rank 40: below JupyterLab's html renderer (50), so it wins over the bundle's text/html
 * fallback; `safe: true`, so it is picked in untrusted (reopened) notebooks too, where it
 * renders nested outputs only through safe renderers.
 *
 * Example:
 *   registry.addFactory(ranksFactory(registry), RANKS_RANK);
 */

import type { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { RANKS_MIME } from './bundle';
import { RanksView } from './ranksView';

export const RANKS_RANK = 40;

export function ranksFactory(registry: IRenderMimeRegistry | null): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [RANKS_MIME],
    defaultRank: RANKS_RANK,
    createRenderer: options => new RanksView(options, registry)
  };
}

/** Add (or rebind) the rank tabs' factory in `registry`, its nested outputs rendered by it. */
export function installRanksRenderer(registry: IRenderMimeRegistry): void {
  registry.addFactory(ranksFactory(registry), RANKS_RANK);
}
