"""Drive the course in JupyterLab inside headless Chromium, the way a learner sees it.

Used by tests/test_browser.py. Three pieces:

- ``LabServer``: JupyterLab from this project's own environment on a free
  localhost port, with a throw-away config/settings/workspace directory
  (windowing off so every cell is in the page, autosave off so the committed
  notebooks are never rewritten). Always stopped, kernels included.
- ``launch_chromium``: the system Chromium (Debian package ``chromium``)
  through Playwright; Playwright's own browser download is not used.
- ``LabPage`` / ``NotebookPage``: JupyterLab loaded once in a page; open a
  notebook in it, run all cells, wait for the kernel, then report error
  outputs, widgets that did not render, and whether moving each slider (or
  pressing Play) redraws the figure next to it.

Example::

    with LabServer(ROOT) as lab, launch_chromium() as browser:
        notebook = NotebookPage(LabPage(browser.new_page(), lab), "notebooks/00_welcome.ipynb")
        notebook.open()
        notebook.run_all()
        assert notebook.problems() == []
        assert all(i.changed for i in notebook.move_sliders())
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil

WIDGET_MANAGER = "@jupyter-widgets/jupyterlab-manager"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# Settings a learner would not change but a test needs: all cells in the DOM
# (JupyterLab 4 otherwise only renders cells near the viewport), no autosave
# (running a notebook in the test must not rewrite the committed file), and no
# news / update / extension-manager requests (there is no network in CI).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
}

def cells_widgets_need(notebook: dict) -> list[int]:
    """Indices (among all cells) of the code cells a chapter's widgets need: every cell whose committed outputs
    show a widget, the ``parameters`` cell, the first (imports, ``%matplotlib``), and -- read statically from
    the sources -- every earlier cell that defines a name one of those uses, and so on back.

    The browser suite runs only these (papermill runs every cell, nbval checks the committed outputs): what
    only a browser can see is a widget that does not render or a figure that does not redraw, and the
    training runs between the widgets cost minutes of a two-core machine without showing either. A missed
    dependency is loud, not silent: the cell that needs it fails with a ``NameError`` on the page.
    """
    def names(source: str) -> tuple[set[str], set[str]]:
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
        defined, used = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (defined if isinstance(node.ctx, ast.Store) else used).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        return defined, used

    code = [(i, c) for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code"]
    source = {i: "".join(c["source"]) for i, c in code}
    read = {i: names(source[i]) for i, _ in code}
    need = {code[0][0]} | {i for i, c in code if "parameters" in c.get("metadata", {}).get("tags", [])
                           or source[i].lstrip().startswith("%")
                           or any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", []))}
    todo = sorted(need)
    while todo:
        cell = todo.pop()
        for j, _ in code:
            if j < cell and j not in need and read[j][0] & read[cell][1]:
                need.add(j)
                todo.append(j)
    return sorted(need)


CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a learner's JupyterLab would have: pytest's MPLBACKEND=agg
    would silently turn off inline figures in the kernel, so it is dropped."""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND" and not k.startswith("PYTEST_")}
    env.update(extra)
    return env


def stop_process_tree(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group (the server then shuts its kernels down), and
    kill whatever of its descendants is still alive after ``timeout``."""
    if proc.poll() is not None:
        return
    try:
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    # Kernels run in their own sessions (jupyter_client), so the group signal
    # does not reach them; after a clean shutdown this list is empty.
    leftovers = []
    for pid in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                leftovers.append(p)
    for p in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(leftovers, timeout=5)


class LabServer:
    """JupyterLab serving ``root`` from this Python environment; a context manager.

    Only ``127.0.0.1`` and a random token; config, data, runtime, settings and
    workspace directories are temporary, so the user's own Jupyter setup cannot
    change the result (the environment's ``share/jupyter``, where the ipywidgets
    front end is installed, stays on the path).
    """

    def __init__(self, root: Path, log_path: Path | None = None, startup_timeout: float = 120.0):
        self.root = Path(root)
        self.token = secrets.token_hex(16)
        self.port = 0
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}?token={self.token}"

    def __enter__(self) -> "LabServer":
        self._tmp = tempfile.TemporaryDirectory(prefix="coursekit-lab-")
        tmp = Path(self._tmp.name)
        self.config_dir = tmp / "config"
        settings = tmp / "settings"
        for name, values in LAB_SETTINGS.items():
            path = settings / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        (tmp / "workspaces").mkdir()
        self.config_dir.mkdir()
        env = clean_env(JUPYTER_CONFIG_DIR=str(self.config_dir), JUPYTER_DATA_DIR=str(tmp / "data"),
                        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), IPYTHONDIR=str(tmp / "ipython"))
        self.port = free_port()
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
               f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
               # checkpoints in the temporary directory, not next to the course's notebooks
               f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}",
               "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        log = open(self.log_path, "w") if self.log_path else open(tmp / "server.log", "w")
        self._log = log
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_until_up()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with code {self.proc.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer on port {self.port} within {self.startup_timeout:.0f} s")

    def saved_files(self) -> list[str]:
        """Files the server wrote (autosave is off, so a test run must leave none)."""
        self._log.flush()
        lines = Path(self._log.name).read_text().splitlines()
        return [line.strip() for line in lines if "Saving file at" in line or "Uploading file to" in line]

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(f"{self.base_url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Stop every kernel (and so every coursekit rank it started)."""
        for session in self.api("sessions"):
            with contextlib.suppress(OSError):
                self.api(f"sessions/{session['id']}", method="DELETE")

    @contextlib.contextmanager
    def disabled_extensions(self, *names: str) -> Iterator[None]:
        """Pages loaded inside this block start with ``names`` disabled, exactly
        what ``jupyter labextension disable NAME`` does (labconfig/page_config.json,
        read by the server on every page load)."""
        path = self.config_dir / "labconfig" / "page_config.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"disabledExtensions": {n: True for n in names}}))
        try:
            yield
        finally:
            path.unlink()

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.shutdown_kernels()
            stop_process_tree(self.proc)
            self.proc = None
        if getattr(self, "_log", None):
            self._log.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


@contextlib.contextmanager
def launch_chromium():
    """Headless system Chromium through Playwright, with a fresh profile."""
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    if executable is None:
        raise RuntimeError("Chromium is not installed: run `make browser-deps` "
                           "(installs the Debian package `chromium`), or deselect with -m 'not browser'")
    with tempfile.TemporaryDirectory(prefix="coursekit-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900}, device_scale_factor=1)
        try:
            yield context
        finally:
            context.close()



# Helpers installed in every page. ``window.jupyterapp`` exists because the
# server runs with --LabApp.expose_app_in_browser (the hook JupyterLab's own
# UI tests use); everything else is read from the page as a learner sees it.
_PAGE_HELPERS = """
window.__ck = {
  panel(path) {
    const app = window.jupyterapp;
    if (!app) return null;
    for (const w of app.shell.widgets('main'))
      if (w.context && w.context.path === path && w.content && w.content.widgets) return w;
    return null;
  },
  idle(path) {
    const panel = this.panel(path);
    const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
    if (!kernel || kernel.status !== 'idle') return false;
    return !panel.content.widgets.some(c => c.model.type === 'code' && c.model.executionState === 'running');
  },
  // One record per cell: what the model holds next to what the page shows.
  cells(path) {
    return this.panel(path).content.widgets.map((cell, index) => {
      const m = cell.model;
      const rec = {index, type: m.type, source: m.sharedModel.getSource(),
                   tags: m.getMetadata('tags') || [], execution_count: null, outputs: []};
      if (m.type !== 'code') return rec;
      rec.execution_count = m.executionCount;
      const views = cell.outputArea.widgets;
      for (let k = 0; k < m.outputs.length; k++) {
        const o = m.outputs.get(k).toJSON();
        const node = views[k] ? views[k].node : null;
        const widget = node ? node.querySelector('.jupyter-widgets') : null;
        const box = widget ? widget.getBoundingClientRect() : null;
        rec.outputs.push({
          output_type: o.output_type, ename: o.ename || null, evalue: o.evalue || null,
          mime_types: Object.keys(o.data || {}),
          text: node ? node.innerText.slice(0, 300) : '',
          widget_rendered: !!widget && box.width > 0 && box.height > 0,
          // still waiting for the widget's model (a view that will never come stays so)
          widget_pending: 'application/vnd.jupyter.widget-view+json' in (o.data || {}) && !!node && !widget && (!node.innerText.trim() || node.innerText.includes('Loading widget')),
        });
      }
      return rec;
    });
  },
};
"""

# Interactive controls: masked when the whole output area is compared, since
# moving a slider changes its own handle and readout.
CONTROLS = ".widget-slider, .widget-play, .widget-button, .widget-dropdown, .widget-toggle-buttons, " \
           ".widget-text, .widget-checkbox, .widget-readout, .widget-label"
# A drawn figure: inline matplotlib <img>, a canvas (ipympl, bqplot) or an svg chart.
FIGURES = "img, canvas, svg"


def _slider_value(slider) -> str:
    """What the learner reads off a slider: its readout, else the handle's aria text
    (aria-valuenow alone is rounded to one decimal by noUiSlider)."""
    return slider.evaluate("""e => {
        const r = e.querySelector('.widget-readout'), h = e.querySelector('.noUi-handle');
        const shown = r && getComputedStyle(r).display !== 'none' ? r.innerText : '';
        return shown || (h.getAttribute('aria-valuetext') + ' ' + h.getAttribute('aria-valuenow')); }""")


@dataclass
class Interaction:
    """What happened when one control was moved."""
    control: str          # e.g. 'slider "GPUs" in cell 3'
    before: str
    after: str
    compared: str         # "figure" or "output area"
    changed: bool


class LabPage:
    """A browser page running JupyterLab, reused for one notebook after another
    (loading JupyterLab itself takes seconds; opening a notebook in it does not)."""

    def __init__(self, page, lab: LabServer):
        self.page, self.lab = page, lab
        self.console: list[str] = []
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        page.add_init_script(_PAGE_HELPERS)
        self.loaded = False

    def load(self, timeout: float = 120.0) -> None:
        # A fresh workspace, so the page restores no earlier tabs (nor their kernels).
        workspace = "ws" + secrets.token_hex(4)
        self.page.goto(self.lab.url(f"lab/workspaces/{workspace}"), timeout=timeout * 1000)
        self.page.wait_for_function("() => !!window.jupyterapp", timeout=timeout * 1000)
        self.page.evaluate("() => window.jupyterapp.restored")
        self.loaded = True


class NotebookPage:
    """One notebook, opened in JupyterLab in a browser page."""

    def __init__(self, lab_page: LabPage, path: str):
        self.lab_page, self.page, self.lab, self.path = lab_page, lab_page.page, lab_page.lab, path
        self._console_start = len(lab_page.console)

    @property
    def console(self) -> list[str]:
        """Browser console lines since this notebook was opened."""
        return self.lab_page.console[self._console_start:]

    def js(self, expression: str, *args):
        """Evaluate ``expression`` (with ``path`` and ``args`` in scope) in the page."""
        return self.page.evaluate(f"([path, args]) => {expression}", [self.path, list(args)])

    def open(self, timeout: float = 120.0) -> None:
        if not self.lab_page.loaded:
            self.lab_page.load(timeout)
        # A dialog left by an earlier notebook (say "kernel died") would block this one.
        for _ in range(5):
            if not self.page.locator(".jp-Dialog").count():
                break
            self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(200)
        self.js("void window.jupyterapp.commands.execute('docmanager:open', {path, factory: 'Notebook'})")
        self.page.wait_for_function("(path) => !!window.__ck.panel(path)", arg=self.path, timeout=timeout * 1000)
        self.js("(async () => { const p = window.__ck.panel(path); await p.context.ready;"
                " await p.sessionContext.ready; })()")
        self.wait_idle(timeout)

    def keep_only(self, indices: list[int]) -> None:
        """Delete every other cell from the open notebook (in the page only: nothing is saved)."""
        removed = self.js("""(() => {
            const model = window.__ck.panel(path).content.model.sharedModel, keep = new Set(args[0]);
            let removed = 0;
            for (let i = model.cells.length - 1; i >= 0; i--)
                if (!keep.has(i)) { model.deleteCell(i); removed++; }
            return removed; })()""", indices)
        assert removed >= 0, f"{self.path}: could not trim the notebook"

    def inject_parameters(self, parameters: dict) -> None:
        """What papermill does: a cell after the one tagged ``parameters`` that
        overrides its values (tagged ``injected-parameters``)."""
        if not parameters:
            return
        source = "# Parameters injected by the test (the notebook's CI sizes)\n" + \
            "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
        found = self.js("""(() => {
            const panel = window.__ck.panel(path);
            const at = panel.content.widgets.findIndex(c => (c.model.getMetadata('tags') || []).includes('parameters'));
            if (at < 0) return false;
            panel.content.model.sharedModel.insertCell(at + 1, {cell_type: 'code', source: args[0],
                                                                 metadata: {tags: ['injected-parameters']}});
            return true; })()""", source)
        assert found, f"{self.path} has CI parameters but no cell tagged 'parameters'"

    def close(self) -> None:
        """Close the tab without saving (dispose skips the 'save changes?' dialog)."""
        self.js("(() => { const p = window.__ck.panel(path); if (p) p.dispose(); })()")

    def run_all(self, timeout: float = 240.0, widget_timeout: float = 30.0) -> None:
        """Clear the stored outputs (so nothing stale can pass), run every cell, wait."""
        self.js("""(async () => {
            const app = window.jupyterapp;
            app.shell.activateById(window.__ck.panel(path).id);
            await app.commands.execute('notebook:clear-all-cell-outputs');
            app.commands.execute('notebook:run-all-cells');   // resolves only when done: don't await
        })()""")
        try:
            self.wait_idle(timeout)
        except Exception as error:   # playwright's TimeoutError: say which cells are stuck
            running = self.js("""window.__ck.panel(path).content.widgets
                .map((c, i) => [i, c.model.type === 'code' && c.model.executionState === 'running', c.model.sharedModel.getSource().slice(0, 60)])
                .filter(r => r[1]).map(r => `cell ${r[0]}: ${r[2]}`)""")
            raise AssertionError(f"{self.path}: cells still running after {timeout:.0f} s: {running}") from error
        self.wait_widgets(widget_timeout)

    def wait_widgets(self, timeout: float) -> None:
        """Give widget views that are still loading their model up to ``timeout``
        seconds (on a busy machine they can trail the kernel); problems() reports
        any that never render."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(o.get("widget_pending") for c in self.cells() for o in c["outputs"]):
                return
            self.page.wait_for_timeout(250)

    def wait_idle(self, timeout: float = 120.0, settle: float = 0.5) -> None:
        """Kernel idle and no cell running, still so ``settle`` seconds later (the
        kernel is idle for a moment between queued cells)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(deadline - time.monotonic(), 1.0)
            self.page.wait_for_function("(path) => window.__ck.idle(path)", arg=self.path,
                                        timeout=remaining * 1000, polling=200)
            self.page.wait_for_timeout(settle * 1000)
            if self.js("window.__ck.idle(path)"):
                return

    def cells(self) -> list[dict]:
        """Code cells: source, tags, execution_count and per output what rendered."""
        return [c for c in self.js("window.__ck.cells(path)") if c["type"] == "code"]

    def problems(self) -> list[str]:
        """Everything a learner would see as broken after running all cells."""
        found = []
        cells = self.cells()
        for c in cells:
            where = f"cell {c['index']} ({c['source'].strip().splitlines()[0][:60] if c['source'].strip() else ''!r})"
            if c["source"].strip() and c["execution_count"] is None:
                found.append(f"{where} did not run")
            for o in c["outputs"]:
                if o["output_type"] == "error" and "raises-exception" not in c["tags"]:
                    found.append(f"{where} shows an error: {o['ename']}: {o['evalue']}")
                if WIDGET_VIEW in o["mime_types"] and not o["widget_rendered"]:
                    found.append(f"{where}: a widget did not render, the page shows {o['text']!r} "
                                 f"(is the ipywidgets front end {WIDGET_MANAGER} installed and enabled?)")
        text = self.page.locator(".jp-NotebookPanel .jp-Notebook").inner_text()
        if "Error displaying widget" in text:
            found.append("the page shows 'Error displaying widget'")
        # Tracebacks printed inside widget Output areas (e.g. by a slider callback).
        for tb in self.page.locator(".jp-NotebookPanel .widget-output").all_inner_texts():
            if "Traceback (most recent call last)" in tb:
                found.append(f"a widget output shows a traceback: {tb[-300:]!r}")
        # The controls the source builds must be on the page.
        source = "\n".join(c["source"] for c in cells)
        for constructor, selector in (("Slider(", ".widget-slider"), ("Play(", ".widget-play"),
                                      ("Button(", ".widget-button")):
            if constructor in source and self.page.locator(f".jp-NotebookPanel {selector}").count() == 0:
                found.append(f"the notebook builds a {constructor[:-1]} but the page has no {selector}")
        return found

    # -- interactions ------------------------------------------------------------

    def _cell(self, index: int):
        return self.page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(index)

    def _region(self, cell_index: int):
        """The figures nearest to a control in ``cell_index``: its own cell's,
        else the next cell's; with none, its cell's whole output area."""
        n_cells = self.page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").count()
        for index in (cell_index, cell_index + 1):
            if index >= n_cells:
                break
            figures = self._cell(index).locator(".jp-Cell-outputArea .jp-OutputArea-output").locator(FIGURES)
            big = [i for i, (w, h) in enumerate(figures.evaluate_all(
                "els => els.map(e => { const b = e.getBoundingClientRect(); return [b.width, b.height]; })"))
                if w >= 50 and h >= 50]
            if big:
                return "figure", [figures.nth(i) for i in big], []
        area = self._cell(cell_index).locator(".jp-Cell-outputArea")
        return "output area", [area], [area.locator(CONTROLS)]

    def _snapshot(self, cell_index: int) -> tuple[str, list[bytes]]:
        kind, elements, masks = self._region(cell_index)
        return kind, [e.screenshot(mask=masks, animations="disabled") for e in elements]

    def _wait_for_change(self, cell_index: int, before: list[bytes], timeout: float,
                         stable: bool = True) -> tuple[str, bool]:
        """Changed only if two snapshots in a row agree and differ from ``before``
        (a figure caught half-replaced would otherwise count as redrawn);
        ``stable=False`` accepts the first differing snapshot."""
        deadline = time.monotonic() + timeout
        previous = None
        while True:
            kind, after = "", None
            with contextlib.suppress(Exception):   # a figure may be replaced mid-screenshot
                self.wait_idle(timeout=max(deadline - time.monotonic(), 1.0), settle=0.3)
                kind, after = self._snapshot(cell_index)
            if after is not None and after != before and (after == previous or not stable):
                return kind, True
            if time.monotonic() > deadline:
                return kind, False
            previous = after
            self.page.wait_for_timeout(300)

    def _controls(self, selector: str) -> list[dict]:
        return self.page.locator(f".jp-NotebookPanel .jp-Notebook {selector}").evaluate_all("""els => {
            const cells = [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')];
            return els.map(e => ({cell: cells.indexOf(e.closest('.jp-Cell')),
                                  label: (e.querySelector('.widget-label') || {}).innerText || '',
                                  disabled: !!e.querySelector('[disabled]')}));
        }""")

    def move_sliders(self, timeout: float = 30.0) -> list[Interaction]:
        """Move every enabled slider one step with the keyboard, as a learner
        would, and record whether the figure next to it was redrawn."""
        results = []
        sliders = self.page.locator(".jp-NotebookPanel .jp-Notebook .widget-slider")
        for i, info in enumerate(self._controls(".widget-slider")):
            if info["disabled"] or info["cell"] < 0:
                continue
            slider = sliders.nth(i)
            handle = slider.locator(".noUi-handle").first
            kind, before = self._snapshot(info["cell"])
            value = _slider_value(slider)
            for key in ("ArrowRight", "ArrowLeft", "ArrowUp", "ArrowDown"):
                handle.press(key)
                self.page.wait_for_timeout(200)      # the readout follows the handle
                if _slider_value(slider) != value:
                    break
            new_value = _slider_value(slider)
            kind, changed = self._wait_for_change(info["cell"], before, timeout) if new_value != value else (kind, False)
            results.append(Interaction(f"slider {info['label']!r} in cell {info['cell']}", value, new_value,
                                       kind, changed))
        return results

    def press_play(self, timeout: float = 30.0) -> list[Interaction]:
        """Press every Play button, wait for the figure to change, pause again."""
        results = []
        plays = self.page.locator(".jp-NotebookPanel .jp-Notebook .widget-play")
        for i, info in enumerate(self._controls(".widget-play")):
            if info["disabled"] or info["cell"] < 0:
                continue
            play_button = plays.nth(i).locator("button").first
            kind, before = self._snapshot(info["cell"])
            play_button.click()
            # While it plays the figure keeps changing: see one change, pause
            # (the play button toggles), then require a settled, different figure.
            self._wait_for_change(info["cell"], before, timeout, stable=False)
            play_button.click()
            kind, changed = self._wait_for_change(info["cell"], before, timeout)
            results.append(Interaction(f"play button in cell {info['cell']}", "stopped", "played", kind, changed))
        return results

    def screenshot(self, path: Path, max_height: int = 15000) -> None:
        """The whole notebook in one image: grow the viewport to the notebook's height."""
        path.parent.mkdir(parents=True, exist_ok=True)
        height = self.page.evaluate("""() => {
            const s = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
            if (!s) return window.innerHeight;
            s.scrollTop = 0;
            return s.scrollHeight - s.clientHeight + window.innerHeight; }""")
        size = self.page.viewport_size
        self.page.set_viewport_size({"width": size["width"], "height": min(int(height) + 20, max_height)})
        self.page.wait_for_timeout(300)
        self.page.screenshot(path=str(path), animations="disabled")
        self.page.set_viewport_size(size)
