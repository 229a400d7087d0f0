"""A trainer's own output under ``ctl train`` (issue 40 item 8): each attempt's stdout and stderr are kept in
the run's home (``runs/<name>/activity/<id>/logs/g<G>-a<N>/``), on failure and on success, and ``ctl logs``
prints them; ``--follow`` follows a live attempt until it ends. Real ``ctl train``, a real trainer held at a
step (TINYLLM_FAULT=trainer.hold, so the attempt is live however fast the machine) and a real SIGKILL; the
bound on the files is checked with a real child process writing 2 MiB through the files the runner gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bi_helpers import ctl, env, one_line_error, write_json

pytestmark = pytest.mark.slow

SPEC = {
    "name": "mini",
    "steps": 6,
    "eval_every": 0,
    "checkpoint_every": 3,
    "batch_size": 2,
    "threads": 1,
    "log_every": 1,
    "model": {"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8},
}
DEADLINE_S = 240.0
LOGS = "runs/mini/activity/train-000006/logs"


def _wait(cond, what: str, *procs: subprocess.Popen):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.args} ended (exit {p.returncode}) before {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _trainer_pids(home: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tinyllm.cli" in argv and b"train" in argv and str(home).encode() in argv:
                out.append(int(d.name))
    return out


def test_each_attempts_output_is_kept_and_followed_live(tmp_path: Path) -> None:
    """Held at step 3, the attempt is live: ``ctl logs -f`` prints its lines and keeps following; a cancel ends
    the attempt and the follower with it (one line on stderr). The same command continues the run as
    train/mini/2, whose attempt is the newest; the first workflow's canceled attempt is still there."""
    home = tmp_path / "home"
    home.mkdir()
    write_json(home / "s.json", SPEC)
    train = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctl.cli",
            "train",
            "--spec",
            str(home / "s.json"),
            "--no-eval",
            "--quiet",
            "--home",
            str(home),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**env(), "TINYLLM_FAULT": "trainer.hold@3"},
    )
    try:
        _wait(lambda: "step      3/6" in _read(home / LOGS / "g1-a1/stderr.log"), "the trainer's step 3 line", train)
        follow = subprocess.Popen(
            [sys.executable, "-m", "ctl.cli", "logs", "train/mini", "--follow", "--home", str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env(),
        )
        seen = b""
        os.set_blocking(follow.stdout.fileno(), False)

        def got(needle: bytes) -> bool:
            nonlocal seen
            seen += follow.stdout.read() or b""
            return needle in seen

        _wait(lambda: got(b"step      3/6"), "ctl logs -f printing the live attempt's step 3", follow)
        time.sleep(1.0)  # the attempt is held at step 3: a follower must still be following it
        assert follow.poll() is None, "ctl logs -f ended while its attempt was live"
        assert ctl(home, "cancel", "train/mini").returncode == 0
        os.set_blocking(follow.stdout.fileno(), True)
        rest, err = follow.communicate(timeout=DEADLINE_S)
        seen += rest
        assert follow.returncode == 0, err
        assert f"==> {LOGS}/g1-a1/stderr.log <==".encode() in seen and b"step      4/6" not in seen, seen
        assert b"train-000006#1 of train/mini ended: canceled" in err, err
        train.communicate(timeout=DEADLINE_S)
        assert train.returncode == 130
    finally:
        if train.poll() is None:
            train.kill()
    again = ctl(home, "train", "--spec", str(home / "s.json"), "--no-eval", "--quiet")  # continues as train/mini/2
    assert again.returncode == 0, again.stderr[-3000:]
    newest = ctl(home, "logs", "train/mini")  # the newest attempt of the newest activity: kept on success
    assert newest.returncode == 0, newest.stderr
    result = json.loads(newest.stdout.split(f"==> {LOGS}/g2-a1/stdout.log <==\n")[1].split("\n")[0])
    assert result["steps"] == 6 and result["resumed_from"] == "runs/mini/ckpt/step-000003"
    assert "step      6/6" in newest.stdout and "step      3/6" not in newest.stdout
    first = ctl(home, "logs", "train/mini/1", "--activity", "train-000006", "--attempt", "1")
    assert f"{LOGS}/g1-a1/stderr.log" in first.stdout and "step      3/6" in first.stdout, first.stdout
    assert "step      4/6" not in first.stdout
    corpus = ctl(home, "logs", "train/mini/1", "--activity", "corpus-default")
    assert '"name": "default"' in corpus.stdout, corpus.stdout
    one_line_error(ctl(home, "logs", "train/mini", "--attempt", "9"), 2, "has no attempt 9 (attempts: 1)")
    one_line_error(ctl(home, "logs", "train/mini", "--activity", "nosuch"), 2, "no output kept for activity 'nosuch'")
    one_line_error(ctl(home, "logs", "train/other"), 2, "no workflow 'train/other'")
    one_line_error(ctl(home, "logs", "train/mini/3"), 2, "no workflow 'train/mini/3'")
    shown = ctl(home, "show", "train/mini")
    assert f"{LOGS}/g2-a1" in shown.stdout and "ctl logs train/mini" in shown.stdout, shown.stdout
    logs = json.loads(ctl(home, "show", "train/mini", "--json").stdout)["logs"]
    assert [(x["activity_id"], x["generation"], x["attempt"]) for x in logs] == [
        ("corpus-default", 1, 1),
        ("corpus-default", 2, 1),
        ("train-000006", 1, 1),
        ("train-000006", 2, 1),
    ], logs


def test_an_attempts_output_is_bounded_head_and_tail_kept(tmp_path: Path) -> None:
    """A child writing 2 MiB of numbered lines into the files the runner gives it, bounded while it writes
    (head 16 KiB, tail 64 KiB; as the runner's poll loop does): the disk holds about head + tail + slack, and
    what is read back is the first lines, one line saying how much was dropped, and the last lines, in order."""
    from engine import read_kept_output as read_kept
    from engine.testing import AttemptOutput

    kept = AttemptOutput(tmp_path / "out", head_bytes=16384, tail_bytes=65536, slack_bytes=32768)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "for i in range(100000):\n"
            "    sys.stdout.write(f'line {i:07d} ' + 'x' * 8 + '\\n')\n"
            "    if i % 2000 == 0: sys.stdout.flush(); time.sleep(0.01)\n",
        ],
        stdout=kept.stdout,
        stderr=kept.stderr,
    )
    while child.poll() is None:
        kept.bound()
        time.sleep(0.02)
    kept.bound()
    kept.close()
    path = tmp_path / "out/stdout.log"
    assert path.stat().st_size == 100000 * 22  # the file keeps its size: the middle is a hole
    assert path.stat().st_blocks * 512 <= 16384 + 65536 + 32768 + 8192
    data, dropped, size = read_kept(path)
    text = data.decode()
    head, marker, tail = text.partition("\n[... ")
    assert marker and dropped > 1_000_000 and size == 100000 * 22
    lines = head.splitlines()
    assert lines[0] == "line 0000000 xxxxxxxx" and len(head) >= 16384 - 22
    assert tail.splitlines()[-1] == "line 0099999 xxxxxxxx" and len(data) - dropped < 200_000
    last = tail.split("...]\n", 1)[1]
    assert len(last) >= 65536


def test_follow_waits_for_a_detached_runs_first_attempt(tmp_path: Path) -> None:
    """``ctl logs -f`` of a detached run that no worker runs yet waits (as ``kubectl logs -f`` waits for its
    container) instead of failing; when ``ctl train`` runs it, it prints the first attempt's output (the corpus
    build's result line) and ends with it. Without --follow the same is one line, exit 2."""
    home = tmp_path / "home"
    home.mkdir()
    write_json(home / "s.json", SPEC)
    detached = ctl(home, "train", "--spec", str(home / "s.json"), "--no-eval", "--detach")
    assert detached.returncode == 0, detached.stderr
    one_line_error(ctl(home, "logs", "train/mini"), 2, "train/mini has started no activity yet")
    follow = subprocess.Popen(
        [sys.executable, "-m", "ctl.cli", "logs", "train/mini", "-f", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    try:
        time.sleep(1.0)
        assert follow.poll() is None, follow.communicate()  # waiting, not failed
        run = ctl(home, "train", "--spec", str(home / "s.json"), "--no-eval", "--quiet")
        assert run.returncode == 0, run.stderr[-3000:]
        out, err = follow.communicate(timeout=DEADLINE_S)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, err
    assert b"==> runs/mini/activity/corpus-default/logs/g1-a1/stdout.log <==" in out and b'"name": "default"' in out
    assert b"corpus-default#1 of train/mini ended: completed" in err, err
