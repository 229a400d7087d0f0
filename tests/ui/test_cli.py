"""``ctl ui`` as a process: loopback by default, a warning for another host, GET/HEAD only, exit 0 on SIGTERM."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

import synth
from browser import Ui

pytestmark = pytest.mark.slow  # starts ctl ui processes


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("ui-cli") / "home"
    w = synth.Writer(home)
    try:
        synth.train_run(w, "x", segments=2)
    finally:
        w.close()
    return home


def test_loopback_by_default_read_only_methods_and_a_clean_stop(home: Path) -> None:
    with Ui(home) as ui:
        assert ui.url.startswith("http://127.0.0.1:") and "warning" not in ui.banner
        with urllib.request.urlopen(ui.url + "run/train/x", timeout=30) as r:
            assert r.status == 200 and "default-src 'self'" in r.headers["Content-Security-Policy"]
        for method in ("POST", "PUT", "DELETE"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(ui.url, data=b"x", method=method), timeout=30)
            assert e.value.code == 501
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(ui.url + "run/train/none", timeout=30)
        assert e.value.code == 404 and b"Traceback" not in e.value.read()
        ui.proc.terminate()
        assert ui.proc.wait(timeout=30) == 0


def test_another_host_is_served_with_a_warning(home: Path) -> None:
    with Ui(home, "--host", "0.0.0.0") as ui:
        assert "warning: listening on 0.0.0.0, not loopback" in ui.banner
