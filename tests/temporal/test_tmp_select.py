"""Choosing the backend: the embedded engine stays the default and imports nothing of Temporal;
bad connection options are bad input (exit 2, one line); an unreachable cluster is one line, exit 1;
the API key is never in a repr. (No server needed.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctl.cli import main


def invoke(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), env=env or {}, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.slow
def test_embedded_default_imports_no_temporal(tmp_path: Path) -> None:
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"name": "mini", "steps": 4, "eval_every": 2}))
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from ctl.cli import main\n"
        f"r = CliRunner().invoke(main, ['train', '--spec', {str(spec)!r}, '--detach', '--home', {str(tmp_path)!r}])\n"
        "r2 = CliRunner().invoke(main, ['status', 'train/mini', '--home', " + repr(str(tmp_path)) + "])\n"
        "print(r.exit_code, r2.exit_code, any(m.split('.')[0] == 'temporalio' for m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["0", "0", "False"], out.stderr[-2000:]
    assert (tmp_path / ".ctl" / "engine.db").exists()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--address", "no-port"], "bad Temporal address"),
        (["--address", "h:1", "--tls-cert", "/nonexistent.pem"], "--tls-key go together"),
        (["--address", "h:1", "--tls-ca", "/nonexistent.pem"], "no such file"),
    ],
)
def test_bad_connection_options_are_bad_input(tmp_path: Path, args: list[str], needle: str) -> None:
    pytest.importorskip("temporalio", reason="the [temporal] extra is not installed")
    code, out, err = invoke("--backend", "temporal", *args, "list", "--home", str(tmp_path))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_backend_from_environment_and_unreachable_cluster(tmp_path: Path) -> None:
    pytest.importorskip("temporalio", reason="the [temporal] extra is not installed")
    from engine.temporal.server import free_port

    secret = "not-printed-0b5e1d"
    env = {
        "CTL_BACKEND": "temporal",
        "CTL_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "CTL_TEMPORAL_API_KEY": secret,
    }
    code, out, err = invoke("--no-tls", "status", "train/x", "--home", str(tmp_path), env=env)
    assert code == 1 and "cannot reach Temporal 127.0.0.1:" in err and "API key" in err
    assert "nothing listens at 127.0.0.1:" in err
    warning, line = err.strip().splitlines()  # the clear-text warning once, then the one error line
    assert (
        warning == f"ctl: warning: --no-tls sends $CTL_TEMPORAL_API_KEY to {env['CTL_TEMPORAL_ADDRESS']} in clear text"
    )
    assert secret not in out + err and "cannot reach Temporal" in line


def test_api_key_not_in_repr() -> None:
    from engine.temporal import TemporalConfig

    cfg = TemporalConfig(address="h:7233", api_key="s3cr3t-value")
    assert "s3cr3t" not in repr(cfg) and "s3cr3t" not in cfg.describe() and cfg.uses_tls


@pytest.mark.slow
def test_ctl_server_starts_a_local_dev_server(tmp_path: Path) -> None:
    pytest.importorskip("temporalio", reason="the [temporal] extra is not installed")
    import signal

    from engine.temporal import TemporalConfig, TemporalEngine
    from engine.temporal.server import _listening, free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", "server", "--port", str(port), "--home", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _listening("127.0.0.1", port):
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "ctl server did not listen"
            time.sleep(0.1)
        with TemporalEngine(TemporalConfig(address=f"127.0.0.1:{port}")) as eng:
            assert isinstance(eng.list_workflows(), list)
        assert (tmp_path / ".ctl" / "temporal-dev.db").is_file()  # its state, in the home by default
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
