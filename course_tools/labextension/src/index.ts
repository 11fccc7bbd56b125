/**
 * The course's Validate button (replaces nbgrader's in a Lab started by `attn-course lab`).
 *
 * It saves the notebook and asks the server extension `course_tools.labcheck` to run
 * `attn-course check` on it: the grader's own sandbox and hidden checks. While the check runs,
 * the dialog says which exercise is running, for how long of its limit, and the time in all,
 * and its Cancel button stops the check (and the sandbox with it). Then the report: PASS / FAIL
 * (with the known mistake's hint) / TODO per exercise.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ToolbarButton } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

const CHECK_URL = 'attn-course/check'; // the server extension's jobs: POST, GET <id>, DELETE <id>
const POLL_MS = 500;

/** One check as the server reports it. */
interface CheckStatus {
  id: string;
  state: 'waiting' | 'running' | 'done' | 'cancelled' | 'failed';
  elapsed: number; // seconds since the button was pressed
  cell?: number | null; // index of the running cell, from 0
  cells?: number;
  what?: string; // the exercise (or "cell N") running now
  seconds?: number; // how long that cell has run
  limit?: number; // its time limit in seconds
  report_html?: string; // the report, escaped by the server, verdicts coloured
  message?: string; // why it failed, for a person
}

async function request(path: string, init: RequestInit): Promise<CheckStatus> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, CHECK_URL, path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  if (!response.ok) {
    let reason = text;
    try {
      reason = JSON.parse(text).message || text;
    } catch {
      // not JSON: the text itself
    }
    throw new Error(`the check could not start (${response.status}): ${reason}`);
  }
  return JSON.parse(text) as CheckStatus;
}

function seconds(value: number | undefined): string {
  return `${Math.round(value || 0)} s`;
}

/** What the dialog says while the check runs. */
export function progressText(status: CheckStatus): string {
  const total = `${seconds(status.elapsed)} in all`;
  if (status.state === 'waiting') {
    return `Waiting for your previous check to finish… ${total}`;
  }
  if (status.cell === undefined || status.cell === null || !status.cells) {
    return `Starting the grader's sandbox… ${total}`;
  }
  const where = `step ${status.cell + 1} of ${status.cells}`;
  const limit = status.limit ? ` of its ${seconds(status.limit)} limit` : '';
  return `Running: ${status.what || where}\n${seconds(status.seconds)}${limit} · ${where} · ${total}`;
}

function sleep(ms: number): Promise<void> {
  return new Promise(resolve => setTimeout(resolve, ms));
}

function htmlWidget(className: string, html: string): Widget {
  const widget = new Widget();
  widget.addClass(className);
  widget.node.innerHTML = html; // the server's report: every byte of student text escaped there
  return widget;
}

function textWidget(className: string, text: string): Widget {
  const widget = new Widget();
  widget.addClass(className);
  widget.node.textContent = text;
  return widget;
}

async function showResult(title: string, body: Widget): Promise<void> {
  await new Dialog({ title, body, buttons: [Dialog.okButton({ label: 'OK' })] }).launch();
}

/** Save, start the check, show its progress until it ends or the student cancels, then the report. */
export async function validate(panel: NotebookPanel): Promise<void> {
  await panel.context.save();
  const body = textWidget('attn-check-progress', 'Starting the check…');
  const dialog = new Dialog({
    title: `Validating ${panel.context.path.split('/').pop()}`,
    body,
    buttons: [Dialog.cancelButton({ label: 'Cancel check' })]
  });
  let finished = false;
  let cancelled = false;
  const closed = dialog.launch().then(() => {
    cancelled = !finished;
  });
  let status: CheckStatus;
  try {
    status = await request('', { method: 'POST', body: JSON.stringify({ path: panel.context.path }) });
    while (!cancelled && (status.state === 'waiting' || status.state === 'running')) {
      body.node.textContent = progressText(status);
      await sleep(POLL_MS);
      if (!cancelled) {
        status = await request(status.id, { method: 'GET' });
      }
    }
  } catch (error) {
    finished = true;
    dialog.resolve(0);
    await closed;
    await showResult('Validation failed', textWidget('attn-check-result', String(error)));
    return;
  }
  if (cancelled) {
    const stopped = await request(status.id, { method: 'DELETE' }).catch(() => status);
    await showResult('Check cancelled', textWidget('attn-check-result',
      `The check was stopped after ${seconds(stopped.elapsed)}; nothing was graded. ` +
      'Fix the cell that was running (a loop that never ends?), save, and press Validate again.'));
    return;
  }
  finished = true;
  dialog.resolve(0);
  await closed;
  if (status.state === 'done' && status.report_html) {
    await showResult('Validation Results', htmlWidget('attn-check-result', status.report_html));
  } else {
    await showResult('Validation failed', textWidget('attn-check-result', status.message || 'the check stopped'));
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@attention-course/validate:button',
  description: "A Validate button that runs the grader's own check, with progress and Cancel",
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel: NotebookPanel) => {
        const button = new ToolbarButton({
          className: 'attn-validate-button',
          label: 'Validate',
          tooltip: "Check this notebook as the grader will (your instructor's hidden checks)",
          onClick: () => {
            void validate(panel);
          }
        });
        panel.toolbar.insertItem(10, 'attnValidate', button);
        return button;
      }
    });
  }
};

export default plugin;
