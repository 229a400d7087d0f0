"""Real processes for the UI's browser tests: ``ctl ui`` on a free port, headless Debian chromium via selenium."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("CTL_HOME", None)
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


class Ui:
    """``ctl ui --home HOME --port 0`` in its own process group; ``url`` once it listens."""

    def __init__(self, home: Path, *extra: str, timeout_s: float = 60):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ctl.cli", "ui", "--home", str(home), "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            start_new_session=True,
        )
        self.banner = ""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.2)
            if ready:  # raw reads: a buffered readline would hold the next line where select cannot see it
                chunk = os.read(self.proc.stderr.fileno(), 65536).decode("utf-8", "replace")
                self.banner += chunk
                m = re.search(r"at (http://\S+/) ", self.banner)
                if m:
                    self.url = m.group(1)
                    return
            if self.proc.poll() is not None:
                break
        self.close()
        raise AssertionError(
            f"ctl ui did not start: {self.banner}{self.proc.stderr.read() if self.proc.stderr else ''}"
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "Ui":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def chromium():
    """A headless chromium (selenium), with a fresh profile; skipped where chromium or selenium is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install -e '.[ui-test]'")
    binary = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    from selenium.webdriver.chrome.service import Service  # lazy: the optional [ui-test] extra

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    profile = tempfile.mkdtemp(prefix="ctl-ui-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    browser = webdriver.Chrome(options=opts, service=Service(executable_path=driver))
    browser.profile_dir = profile
    return browser


def quit_browser(browser) -> None:
    try:
        browser.quit()
    finally:
        shutil.rmtree(getattr(browser, "profile_dir", ""), ignore_errors=True)
