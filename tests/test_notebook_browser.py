"""Chapter 06's planner form in JupyterLab, in a real browser: it builds, two changed fields update its text and
its chart, and nothing lands in JupyterLab's Log Console.

What runs: JupyterLab on 127.0.0.1 (a free port, a known token, every Jupyter and IPython folder under the
test's temporary folder) serving a copy of ``notebooks/06_memory_tuning.ipynb``, and Debian's Chromium driven by
Playwright (``executable_path``: no browser is downloaded). The form's cell runs alone (it is self-contained);
the GPU count and the GPU are changed through the widgets as a user changes them. Screenshots are saved under the
test's folder (``screenshots/``). ``.ci/run`` installs Chromium; without it the test skips with the command to
install it, except under ``ECOMKIT_REQUIRE_BROWSER=1`` (set by ``.ci/run``), where it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "06_memory_tuning.ipynb"
CHROMIUM = os.environ.get("ECOMKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "ecomkit-browser-test"
# JupyterLab settings for a quiet, deterministic session: every cell in the DOM, no autosave, no news toast.
SETTINGS = {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
            "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
            "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}
FORM = ".ecomkit-planner-form"


def _needs_browser() -> None:
    missing = [what for what, ok in (("Chromium at " + CHROMIUM, Path(CHROMIUM).exists()),
                                     ("the playwright package", _importable("playwright"))) if not ok]
    if not missing:
        return
    why = (f"{' and '.join(missing)} missing: apt-get install chromium; pip install playwright "
           "(.ci/run does both)")
    if os.environ.get("ECOMKIT_REQUIRE_BROWSER") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(folder: Path) -> None:
    for name, values in SETTINGS.items():
        path = folder / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server serving a copy of the notebook; yields (url of the notebook, folder)."""
    _needs_browser()
    root = tmp_path_factory.mktemp("lab")
    (root / "notebooks").mkdir()
    shutil.copy(REPO / "notebooks" / NOTEBOOK, root / "notebooks" / NOTEBOOK)
    _write_settings(root / "settings")
    # The kernel imports ipywidgets at start, as one that has shown a widget has: JupyterLab's widget manager
    # opens its control channel when it connects, and a kernel without ipywidgets answers that on stderr ("No
    # such comm target registered: jupyter.widget.control"), a Log Console error before any cell runs.
    startup = root / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-ipywidgets.py").write_text("import ipywidgets  # registers jupyter.widget.control\n")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "JUPYTER_CONFIG_DIR": str(root / "jupyter-config"), "JUPYTER_DATA_DIR": str(root / "jupyter-data"),
           "JUPYTER_RUNTIME_DIR": str(root / "jupyter-runtime"), "IPYTHONDIR": str(root / "ipython"),
           "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "TMPDIR": str(root)}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip", "127.0.0.1", "--port", str(port),
           "--ServerApp.port_retries=0", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}",
           f"--LabApp.user_settings_dir={root / 'settings'}", f"--LabApp.workspaces_dir={root / 'workspaces'}",
           *(["--allow-root"] if os.geteuid() == 0 else [])]
    log = open(root / "jupyterlab.log", "w")
    server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_server(server, port, root / "jupyterlab.log")
        yield f"http://127.0.0.1:{port}/lab/tree/notebooks/{NOTEBOOK}?token={TOKEN}", root
    finally:
        os.killpg(server.pid, signal.SIGTERM)      # the server and the kernel it started (its own session)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _wait_for_server(server: subprocess.Popen, port: int, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"JupyterLab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={TOKEN}", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer on port {port} within {timeout} s:\n{log.read_text()[-3000:]}")


def _image_and_text(form) -> tuple[str, str]:
    """The chart's image source (a new blob URL per drawing) and the verdict's text."""
    return form.locator("img").get_attribute("src") or "", form.locator(".widget-html").first.inner_text()


def _wait_for_change(form, before: tuple[str, str], timeout_s: float = 90) -> tuple[str, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = _image_and_text(form)
        if now[0] != before[0] and now[1] != before[1] and now[0]:
            return now
        time.sleep(0.25)
    raise AssertionError(f"the form did not redraw both its chart and its text within {timeout_s} s: {before} → {now}")


@pytest.mark.slow
def test_the_planner_form_updates_its_text_and_chart_and_logs_nothing(lab):
    from playwright.sync_api import sync_playwright

    url, root = lab
    shots = root / "screenshots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(str(root / "chromium-profile"), executable_path=CHROMIUM,
                                                       headless=True, args=CHROMIUM_ARGS,
                                                       viewport={"width": 1400, "height": 1000})
        try:
            page = browser.new_page()
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            _open_log_console(page)
            cell = page.locator(".jp-CodeCell", has_text="planner_form(TrainConfig")
            cell.scroll_into_view_if_needed()
            cell.locator(".jp-InputPrompt").click()
            page.keyboard.press("Shift+Enter")                       # run the form's cell, and only it
            form = cell.locator(FORM)
            form.locator(".widget-html", has_text="Recommended").wait_for()
            first = _wait_for_change(form, ("", ""))
            page.screenshot(path=str(shots / "1-form-built.png"))
            _set_slider(form, "GPUs", 8)                             # field 1: the GPU count
            second = _wait_for_change(form, first)
            assert "The global batch changed: 32 → 64" in second[1], second[1]
            page.screenshot(path=str(shots / "2-gpus-8.png"))
            _field(form, "widget-dropdown", "GPU").locator("select").select_option("a100-80g")   # field 2: the GPU
            third = _wait_for_change(form, second)
            assert "over nvlink-a100, the GPU's own link" in third[1], third[1]   # the A100's link, not PCIe
            page.screenshot(path=str(shots / "3-a100.png"))
            assert _log_entries(page) == [], "the form wrote to JupyterLab's Log Console"
            page.screenshot(path=str(shots / "4-log-console.png"))
        finally:
            browser.close()
    print(f"screenshots: {shots}")


def _field(form, kind: str, label: str):
    """The widget of class ``kind`` whose label reads exactly ``label``."""
    return form.locator(f".{kind}", has=form.page.locator("label.widget-label",
                                                           has_text=re.compile(f"^{re.escape(label)}$")))


def _set_slider(form, label: str, value: int) -> None:
    """Type ``value`` into an IntSlider's readout, as a user edits the number beside the slider."""
    readout = _field(form, "widget-slider", label).locator(".widget-readout")
    readout.click()
    form.page.keyboard.press("Control+A")
    form.page.keyboard.type(str(value))
    form.page.keyboard.press("Enter")


def _open_log_console(page) -> None:
    """View → Show Log Console, at its default level (warning).

    What JupyterLab logs there at that level is output that reached no cell (a widget callback's prints or
    figures) and errors; every cell's own output is logged too, but at level info, below what it shows.
    """
    page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
    page.locator(".lm-Menu-itemLabel", has_text="Show Log Console").click()
    page.locator(".jp-LogConsolePanel").wait_for()
    assert page.locator(".jp-LogConsole-toolbarLogLevel select").input_value() == "warning"


def _log_entries(page) -> list[str]:
    return [t for t in page.locator(".jp-LogConsolePanel .jp-OutputArea-output").all_inner_texts() if t.strip()]
