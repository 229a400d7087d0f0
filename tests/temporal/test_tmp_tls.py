"""Logins to a cluster that requires them, through the real ``ctl --backend temporal`` processes.

The dev server has no TLS option, so a test-only gRPC front (tls_front.py: TLS, optionally a
required client certificate, optionally a required API key) sits before it, with throwaway
certificates made by ``openssl`` here. Two tiny real runs, at once:

- mTLS: ``ctl --tls-cert --tls-key --tls-ca ... train`` (its own worker, trainer, heartbeats: every
  call through the front) completes;
- API key: ``CTL_TEMPORAL_API_KEY`` with ``--tls-ca``: ``ctl train --detach``, then a ``ctl worker``
  process serves the run to the end; every call carried the key (the front refuses any without
  it); the key is in no output, no home file, not in the history or the server's state.

Both give the same loss bits. A login the front refuses (no client certificate, one it does not
trust, another CA, no TLS; a wrong or missing key) is one line saying which, exit 1, no
traceback, nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the [temporal] extra is not installed: pip install -e '.[temporal]'")
pytest.importorskip(
    "grpc",
    reason="the TLS front of these tests needs grpcio (the [tensorboard] extra brings it; "
    "CI installs it): pip install -c constraints.txt -e '.[tensorboard]'",
)
if shutil.which("openssl") is None:
    pytest.skip(
        "the TLS tests make throwaway certificates with the openssl command, which is not installed",
        allow_module_level=True,
    )

from click.testing import CliRunner  # noqa: E402
from no_leak import assert_secret_nowhere  # noqa: E402
from tls_front import TlsFront, make_certs  # noqa: E402

from ctl.cli import main  # noqa: E402

pytestmark = pytest.mark.slow  # a real Temporal dev server behind a TLS front, real ctl processes

SECRET = "ctl-tls-test-key-9d41c07a3e"
WRONG = "ctl-tls-wrong-key-5e2b8f"
SPEC = {
    "name": "tiny",
    "steps": 4,
    "seed": 5,
    "eval_every": 0,
    "checkpoint_every": 2,
    "batch_size": 4,
    "lr": 0.003,
    "warmup_steps": 1,
    "lr_decay_steps": 4,
    "threads": 1,
    "log_every": 2,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 16, "dropout": 0.0},
}
DEADLINE_S = 240


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def fronts(temporal_server, certs):
    mtls = TlsFront(temporal_server.address, certs, require_client_cert=True).start()
    keyed = TlsFront(temporal_server.address, certs, require_client_cert=False, api_key=SECRET).start()
    yield {"mtls": mtls, "key": keyed}
    mtls.stop()
    keyed.stop()


def mtls_args(fronts, certs, *, cert=None, key=None, ca=None) -> list[str]:
    return [
        "--backend",
        "temporal",
        "--address",
        fronts["mtls"].address,
        "--namespace",
        "mtls",
        "--tls-cert",
        str(cert or certs.client_cert),
        "--tls-key",
        str(key or certs.client_key),
        "--tls-ca",
        str(ca or certs.ca),
    ]


def key_env(fronts, key: str | None = SECRET) -> dict[str, str]:
    env = {
        **os.environ,
        "CTL_BACKEND": "temporal",
        "CTL_TEMPORAL_ADDRESS": fronts["key"].address,
        "CTL_TEMPORAL_NAMESPACE": "apikey",
        "PYTHONPATH": os.getcwd(),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("CTL_TEMPORAL_API_KEY", None)
    if key is not None:
        env["CTL_TEMPORAL_API_KEY"] = key
    return env


def ctl(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """ctl in this process (the quick commands)."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("CTL_")}
    r = CliRunner().invoke(main, args, env={**unset, **(env or {})}, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def home_with_spec(tmp_path_factory, label: str) -> tuple[Path, Path]:
    home = tmp_path_factory.mktemp(label)
    spec = home / "tiny.json"
    spec.write_text(json.dumps(SPEC))
    return home, spec


@pytest.fixture(scope="module")
def runs(fronts, certs, tmp_path_factory):
    """The two real runs, started at once: ctl train over mTLS; ctl train --detach + ctl worker over the key."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CTL_")}
    mtls_home, mtls_spec = home_with_spec(tmp_path_factory, "mtls")
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            *mtls_args(fronts, certs),
            "train",
            "--spec",
            str(mtls_spec),
            "--no-eval",
            "--json",
            "--home",
            str(mtls_home),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"},
    )
    key_home, key_spec = home_with_spec(tmp_path_factory, "apikey")
    outputs: list[str] = []
    code, out, err = ctl(
        [
            "--tls-ca",
            str(certs.ca),
            "train",
            "--spec",
            str(key_spec),
            "--no-eval",
            "--detach",
            "--json",
            "--home",
            str(key_home),
        ],
        key_env(fronts),
    )
    outputs += [out, err]
    assert code == 0 and json.loads(out)["state"] == "running", err
    worker = subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", "--tls-ca", str(certs.ca), "worker", "--home", str(key_home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=key_env(fronts),
    )
    yield {
        "trainer": trainer,
        "mtls_home": mtls_home,
        "worker": worker,
        "key_home": key_home,
        "outputs": outputs,
        "done": {},
    }
    for proc in (trainer, worker):
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def mtls_result(runs) -> dict:
    done = runs["done"]
    if "mtls" not in done:
        stdout, stderr = runs["trainer"].communicate(timeout=DEADLINE_S)
        assert runs["trainer"].returncode == 0, stderr[-2000:]
        done["mtls"] = json.loads(stdout)
        done["mtls outputs"] = [stdout, stderr]
    return done["mtls"]


@pytest.mark.ns("mtls")
def test_mtls_login_trains_through_the_front(runs, fronts, certs, temporal_server) -> None:
    out = mtls_result(runs)
    assert out["state"] == "completed" and out["workflow_id"] == "train/tiny"
    code, status, err = ctl(
        [*mtls_args(fronts, certs), "status", "train/tiny", "--json", "--home", str(runs["mtls_home"])]
    )
    assert code == 0 and json.loads(status)["state"] == "completed", err
    code, hist, err = ctl(
        [*mtls_args(fronts, certs), "history", "train/tiny", "--json", "--home", str(runs["mtls_home"])]
    )
    events = json.loads(hist)["events"]
    assert [e["attrs"]["activity_id"] for e in events if e["type"] == "activity_completed"] == [
        "corpus-default",
        "train-000004",
    ]
    assert fronts["mtls"].forwarded > 0  # the only way to the server: through the front's mTLS
    private = certs.client_key.read_text().splitlines()[2]  # a line of the private key itself (not its header)
    assert_secret_nowhere(
        private, [*runs["done"]["mtls outputs"], status, hist], runs["mtls_home"], temporal_server, "mtls", "train/tiny"
    )


@pytest.mark.ns("apikey")
def test_api_key_login_worker_through_the_front(runs, fronts, certs, temporal_server) -> None:
    env, home, worker, outputs = key_env(fronts), runs["key_home"], runs["worker"], runs["outputs"]
    status_args = ["--tls-ca", str(certs.ca), "status", "train/tiny", "--json", "--home", str(home)]
    deadline = time.monotonic() + DEADLINE_S
    while True:
        code, out, err = ctl(status_args, env)
        outputs += [out, err]
        if json.loads(out)["state"] != "running":
            break
        assert worker.poll() is None, f"ctl worker ended before the run: {worker.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.5)  # a poll interval, not a wait for the outcome
    assert code == 0 and json.loads(out)["state"] == "completed", err
    worker.send_signal(signal.SIGTERM)
    stdout, stderr = worker.communicate(timeout=60)
    outputs += [stdout, stderr]
    assert worker.returncode == 0, stderr[-2000:]
    assert "serving Temporal" in stderr and "(TLS, API key)" in stderr and "ctl worker: stopped" in stderr
    result = json.loads(out)["result"]
    assert result["final_loss_hex"] == mtls_result(runs)["result"]["final_loss_hex"]  # the same run, bit for bit
    assert result["digest"] == mtls_result(runs)["result"]["digest"]
    # every call of ctl and its worker (polls, heartbeats, completions) carried the key: none was refused
    assert fronts["key"].forwarded > 0 and fronts["key"].refused == 0
    assert_secret_nowhere(SECRET, outputs, home, temporal_server, "apikey", "train/tiny")


def refused(args: list[str], env: dict[str, str] | None, tmp_path: Path, needle: str, *secrets: str) -> None:
    """A login the front refuses: one line naming the problem, exit 1, no traceback, nothing written."""
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(SPEC))
    home = tmp_path / "home"
    code, out, err = ctl([*args, "train", "--spec", str(spec), "--no-eval", "--detach", "--home", str(home)], env)
    assert code == 1, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctl: cannot reach Temporal") and needle in lines[0], err
    assert "Traceback" not in out + err
    for secret in secrets:
        assert secret not in out + err
    assert not home.exists() or not any(home.rglob("*"))  # no work started


@pytest.mark.ns("mtls")
@pytest.mark.parametrize(
    "case",
    [
        "no client certificate",
        "untrusted client certificate",
        "other CA",
        "system roots",
        "no TLS",
        "TLS to a plain server",
    ],
)
def test_mtls_login_refused_is_one_line(case, fronts, certs, temporal_server, tmp_path: Path) -> None:
    args = mtls_args(fronts, certs)
    if case == "no client certificate":
        args = args[:6] + args[10:]  # --tls-ca only
        needle = "may require a client certificate (--tls-cert and --tls-key)"
    elif case == "untrusted client certificate":
        args = mtls_args(fronts, certs, cert=certs.other_client_cert, key=certs.other_client_key)
        needle = f"does not accept the client certificate --tls-cert {certs.other_client_cert}"
    elif case == "other CA":
        args = mtls_args(fronts, certs, ca=certs.other_ca)
        needle = f"not signed by a CA trusted here: --tls-ca {certs.other_ca}"
    elif case == "system roots":  # no --tls-ca: the server's certificate is checked against the system's CAs
        args = [*args[:6], "--tls"]
        needle = "not signed by a CA trusted here: the system's root CAs (name the cluster's CA with --tls-ca)"
    elif case == "no TLS":
        args = [*args[:6], "--no-tls"]
        needle = "it may require TLS"
    else:
        args = [*args[:2], "--address", temporal_server.address, *args[4:]]
        needle = "does not speak TLS on this port"
    refused(args, None, tmp_path, needle)


@pytest.mark.ns("apikey")
@pytest.mark.parametrize("key", [WRONG, None], ids=["wrong key", "no key"])
def test_api_key_login_refused_is_one_line(key, fronts, certs, tmp_path: Path) -> None:
    fix = "check $CTL_TEMPORAL_API_KEY" if key else "it needs an API key ($CTL_TEMPORAL_API_KEY)"
    before = fronts["key"].refused
    refused(
        ["--tls-ca", str(certs.ca)],
        key_env(fronts, key),
        tmp_path,
        f"the cluster refused the login (Unauthenticated: missing or invalid API key): {fix}",
        SECRET,
        WRONG,
    )
    assert fronts["key"].refused > before
