"""Where a distributed run's ranks run (``TINYLLM_NNODES`` & co., tinyllm/distributed/launch.py) and which signals
stop it (``$DURABLE_STOP_SIGNAL``, tinyllm/errors.py): the torchrun command line each node gets, and bad
values as one line, exit 2, before any process starts. The real multi-node stop is in test_ddp_stop.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tinyllm.distributed.launch import Nodes, nodes_from_env, torchrun_argv, verdict
from tinyllm.errors import SpecError, stop_signals
from tinyllm.spec import parse_train_spec

SPEC = {
    "name": "n",
    "steps": 4,
    "batch_size": 4,
    "distributed": {"world_size": 4},
    "model": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
}
VARS = ("TINYLLM_NNODES", "TINYLLM_NODE_RANK", "TINYLLM_RDZV_ENDPOINT", "TINYLLM_RDZV_ID", "DURABLE_STOP_SIGNAL")


@pytest.fixture
def env(monkeypatch):
    for k in VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_one_node_keeps_standalone_and_two_nodes_get_the_c10d_rendezvous(env) -> None:
    spec = parse_train_spec(SPEC)
    assert nodes_from_env(spec) == Nodes()
    one = torchrun_argv(4, ["--spec", "s.json"])
    assert one[1:] == [
        "-m",
        "tinyllm.distributed.agent",
        "--standalone",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "0",
        "--signals-to-handle",
        "SIGHUP,SIGQUIT",
        "-m",
        "tinyllm.cli",
        "train",
        "--spec",
        "s.json",
    ]
    env.setenv("TINYLLM_NNODES", "2")
    env.setenv("TINYLLM_NODE_RANK", "1")
    env.setenv("TINYLLM_RDZV_ENDPOINT", "10.0.0.1:29500")
    nodes = nodes_from_env(spec)
    assert nodes == Nodes(2, 1, "10.0.0.1:29500", "tinyllm-n")
    argv = torchrun_argv(4, [], nodes)
    assert argv[3:17] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.0.1:29500",
        "--rdzv-id",
        "tinyllm-n",
        "--max-restarts",
        "0",
    ]


@pytest.mark.parametrize(
    "values, words",
    [
        ({"TINYLLM_NNODES": "two"}, "TINYLLM_NNODES='two': want a whole number >= 1"),
        ({"TINYLLM_NNODES": "0"}, "want a whole number >= 1"),
        ({"TINYLLM_NODE_RANK": "1"}, "with one node"),
        ({"TINYLLM_NNODES": "2", "TINYLLM_NODE_RANK": "2", "TINYLLM_RDZV_ENDPOINT": "h:1"}, "want 0..1"),
        ({"TINYLLM_NNODES": "3", "TINYLLM_RDZV_ENDPOINT": "h:1"}, "not a multiple of TINYLLM_NNODES=3"),
        ({"TINYLLM_NNODES": "2"}, "needs TINYLLM_RDZV_ENDPOINT=HOST:PORT"),
        ({"TINYLLM_NNODES": "2", "TINYLLM_RDZV_ENDPOINT": "no port"}, "needs TINYLLM_RDZV_ENDPOINT"),
    ],
)
def test_bad_node_settings_are_one_line(env, values, words) -> None:
    for k, v in values.items():
        env.setenv(k, v)
    with pytest.raises(SpecError, match=words.replace("(", r"\(").replace(".", r"\.")):
        nodes_from_env(parse_train_spec(SPEC))


def test_the_stop_signals_and_a_bad_name(env) -> None:
    assert stop_signals() == (signal.SIGTERM, signal.SIGINT)
    for name in ("SIGUSR1", "USR1", "usr1"):
        env.setenv("DURABLE_STOP_SIGNAL", name)
        assert stop_signals() == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    env.setenv("DURABLE_STOP_SIGNAL", "SIGTERM")
    assert stop_signals() == (signal.SIGTERM, signal.SIGINT)
    for bad in ("SIGKILL", "NOPE", "9", "SIG USR1"):
        env.setenv("DURABLE_STOP_SIGNAL", bad)
        with pytest.raises(SpecError, match="is not a signal a trainer can catch"):
            stop_signals()


def test_each_node_reports_its_own_ranks() -> None:
    """Node 1 of 2 holds rank 1 only: its verdict is rank 1's; a rank that never started is said."""
    res = {"steps": 9, "canceled": True}
    assert verdict(2, {1: {"code": 130, "result": res}}, 1, [1], 1) == (130, res, None)
    assert verdict(2, {0: {"code": 0, "result": res}, 1: {"code": 0, "result": {}}}, 0) == (0, res, None)
    code, _, message = verdict(4, {}, 1, [], 2)
    assert code == 1 and "2 rank(s) of this node never started" in message


@pytest.mark.slow  # two `tinyllm train` processes (no torch is imported before they refuse)
@pytest.mark.parametrize(
    "values, words",
    [
        ({"DURABLE_STOP_SIGNAL": "SIGKIL"}, "DURABLE_STOP_SIGNAL='SIGKIL'"),
        ({"TINYLLM_NNODES": "2"}, "needs TINYLLM_RDZV_ENDPOINT"),
    ],
)
def test_tinyllm_train_refuses_bad_settings_in_one_line_before_anything(tmp_path, values, words) -> None:
    spec_path = tmp_path / "n.json"
    spec_path.write_text(json.dumps(SPEC))
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    done = subprocess.run(
        [sys.executable, "-m", "tinyllm.cli", "train", "--spec", str(spec_path), "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, **values},
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("tinyllm: ") and words in line, line
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["n.json"]
