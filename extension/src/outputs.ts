/**
 * One rank's outputs rendered through the notebook's rendermime, with the notebook's trust.
 *
 * A saved notebook reopened tomorrow is untrusted: `preferredMimeType(data, 'ensure')` then
 * picks only safe renderers (and the html renderer sanitizes), exactly as for a cell's own
 * outputs. Text streams and tracebacks go through the stdout/stderr renderers (ANSI colours).
 *
 * Example:
 *   const widget = await renderOutput({output_type: 'stream', name: 'stdout', text: 'hi\n'}, registry, false);
 */

import { MimeModel, type IRenderMimeRegistry } from '@jupyterlab/rendermime';
import type { PartialJSONObject } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import type { IOutput } from './bundle';

const STDOUT = 'application/vnd.jupyter.stdout';
const STDERR = 'application/vnd.jupyter.stderr';

/** The MIME data an output shows: streams and errors as the stdout/stderr types. */
export function outputData(output: IOutput): PartialJSONObject {
  switch (output.output_type) {
    case 'stream':
      return { [output.name === 'stderr' ? STDERR : STDOUT]: joined(output.text ?? '') };
    case 'error':
      return { [STDERR]: (output.traceback ?? [`${output.ename}: ${output.evalue}`]).join('\n') };
    default:
      return output.data ?? {};
  }
}

/** A widget showing `output`: its best renderer the trust allows, else a line saying why not. */
export async function renderOutput(
  output: IOutput,
  registry: IRenderMimeRegistry | null,
  trusted: boolean
): Promise<Widget> {
  const data = normalised(outputData(output));
  const mimeType = registry?.preferredMimeType(data, trusted ? 'any' : 'ensure');
  if (!registry || !mimeType) {
    return textWidget(fallbackText(data, trusted), 'nbaccel-output nbaccel-output-fallback');
  }
  const renderer = registry.createRenderer(mimeType);
  const model = new MimeModel({ data, metadata: output.metadata ?? {}, trusted });
  await renderer.renderModel(model);
  renderer.addClass('nbaccel-output');
  renderer.addClass('jp-OutputArea-output');
  return renderer;
}

/** A widget of plain text (textContent: never parsed as HTML). */
export function textWidget(text: string, className: string): Widget {
  const widget = new Widget({ node: document.createElement('pre') });
  widget.node.textContent = text;
  widget.node.className = className;
  return widget;
}

function fallbackText(data: PartialJSONObject, trusted: boolean): string {
  const plain = data['text/plain'];
  if (plain !== undefined) {
    return joined(plain as string | string[]);
  }
  const kinds = Object.keys(data).join(', ') || 'nothing';
  return trusted
    ? `[an output of type ${kinds} that no renderer here shows]`
    : `[an output of type ${kinds}, not shown until the notebook is trusted]`;
}

/** nbformat may store a MIME value as a list of lines; renderers want one string. */
function normalised(data: PartialJSONObject): PartialJSONObject {
  const result: PartialJSONObject = {};
  for (const [mime, value] of Object.entries(data)) {
    result[mime] = Array.isArray(value) && value.every(v => typeof v === 'string') ? value.join('') : value;
  }
  return result;
}

function joined(text: string | string[]): string {
  return Array.isArray(text) ? text.join('') : text;
}
