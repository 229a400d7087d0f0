"""``ctl verify-resume``'s human report (simulator/proving/verify.py ``Report.lines``): no verdict line without the thing
it names being exercised."""

from __future__ import annotations

import pytest

from simulator.proving.verify import Report
from simulator.proving.diagnose import diagnose


def rec(loss: str, lr: str = "a", batch: str = "b") -> dict:
    return {"loss": loss, "lr": [lr], "batch": batch}


STATE = {"model": "m", "optimizer": "o", "optimizer/entries": 4, "lr": ["a"], "rng/torch": "t", "data": "d"}


def _report(verdict: str, segments: dict) -> Report:
    return Report(
        name="toy",
        exact=verdict == "exact",
        kills_planned=1,
        kills_landed=1,
        final_loss_hex={"uninterrupted": "0x1p-1", "resumed": "0x1p-1"},
        digest={"uninterrupted": "ab", "resumed": "ab"},
        steps_compared=12,
        verdict=verdict,
        segments=segments,
        interruptions=[{"signal": "SIGKILL", "mode": "kill", "step_killed": 4, "resumed_from": 3, "steps_redone": 1}],
    )


def test_the_human_report_says_when_the_run_in_segments_was_not_tested() -> None:
    """EXACT with one segment planned (--segments 1) compared no run in segments: the report says so
    instead of staying silent about how ctl train runs it."""
    for verdict in ("exact", "not_proven"):
        lines = _report(verdict, {"ends": [12], "exact": None}).lines()
        assert (
            "  segments (as ctl train runs it): not tested (one segment planned, [12]; --segments N compares a run in N)"
            in lines
        ), lines
    lines = _report("exact", {"ends": [6, 12], "exact": True}).lines()
    assert lines[0] == "toy: EXACT after 1 interruption(s) (12 steps compared)", lines
    assert "  segments [6, 12] (as ctl train runs it): equal" in lines and not any("not tested" in ln for ln in lines)


def test_status_and_show_say_when_the_recorded_exact_verdict_had_no_run_in_segments() -> None:
    from simulator.proving.record import verdict_line

    one = verdict_line({"verdict": "exact", "time": 0, "kills": 1, "seed": 0, "segments": [12]})
    assert one.endswith("; the run in segments, as ctl train runs it, not tested"), one
    two = verdict_line({"verdict": "exact", "time": 0, "kills": 1, "seed": 0, "segments": [6, 12]})
    assert "not tested" not in two and "said EXACT" in two, two


def test_a_trainer_command_that_cannot_start_is_one_bad_input_line(tmp_path) -> None:
    """A spec's trainer command that does not exist: BadInput (ctl: one line, exit 2), not Popen's traceback."""
    import json

    import pytest

    from app.trainers import load_run_spec
    from simulator.proving.core import BadInput
    from simulator.proving.verify import verify_resume

    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"name": "gone", "steps": 6, "trainer": {"command": ["no-such-trainer-xyz", "--x"]}}))
    with pytest.raises(BadInput, match="cannot start the trainer 'no-such-trainer-xyz'"):
        verify_resume(load_run_spec(str(spec)), tmp_path, kills=1, log=lambda s: None)


def test_a_timeout_that_no_run_can_meet_is_bad_input(tmp_path) -> None:
    """--timeout 0 or below: exit 2 before anything runs (it used to start the trainer, stop it after 1 s
    and fail with 'ran longer than -5 s', exit 1)."""
    from click.testing import CliRunner

    from ctl.cli import main

    (tmp_path / "s.json").write_text('{"name": "t", "steps": 4, "trainer": {"command": ["true"]}}')
    for bad in ("0", "-5"):
        r = CliRunner().invoke(
            main, ["verify-resume", "--spec", str(tmp_path / "s.json"), "--home", str(tmp_path), "--timeout", bad]
        )
        assert r.exit_code == 2 and "--timeout" in r.output, (bad, r.exit_code, r.output)
        assert not (tmp_path / ".ctl").exists()


def test_an_early_stop_that_beat_the_sigterm_is_no_broken_sigterm_rule(tmp_path) -> None:
    """SIGTERM sent as a trainer stopped early and exited 0 (the race at the run's very end, exempt when the
    run ends at steps): it is the same race at the early stop, not 'SIGTERM answered with exit 0'."""
    import json

    import pytest

    from simulator.proving.contract import ContractBroken, check_sigterm

    out = tmp_path / "stdout"
    out.write_text(json.dumps({"steps": 7, "stopped_early": {"step": 7}, "canceled": False}) + "\n")
    check_sigterm(out, rc=0, signaled_step=7, latest=7, steps=12)  # no ContractBroken
    out.write_text(json.dumps({"steps": 7, "canceled": False}) + "\n")  # an exit 0 at 7 of 12 without a stop
    with pytest.raises(ContractBroken, match="answered with exit 0"):
        check_sigterm(out, rc=0, signaled_step=7, latest=7, steps=12)


def test_a_nul_byte_in_the_trainer_command_or_env_is_refused_with_the_spec() -> None:
    """A NUL in trainer.command/eval_command/cwd/env cannot reach exec: ctl train retried it 5 times
    ('ValueError: embedded null byte', exit 1); now the spec is refused (SpecError: ctl's exit 2)."""
    import pytest

    from tinyllm.spec import SpecError
    from tinyllm.trainer_spec import parse_run_spec

    base = {"name": "n", "steps": 2}
    for trainer, field in (
        ({"command": ["tr\0ue"]}, "trainer.command"),
        ({"command": ["true"], "eval_command": ["x\0"]}, "trainer.eval_command"),
        ({"command": ["true"], "cwd": "/tmp\0"}, "trainer.cwd"),
        ({"command": ["true"], "env": {"A\0": "x"}}, "trainer.env"),
        ({"command": ["true"], "env": {"A": "x\0"}}, "trainer.env"),
        ({"command": ["true"], "env": {"A=B": "x"}}, "trainer.env"),
    ):
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            parse_run_spec({**base, "trainer": trainer})
    parse_run_spec({**base, "trainer": {"command": ["true"], "env": {"A": "x=y"}}})  # '=' in a value is fine


def test_ctl_train_of_a_run_in_segments_says_when_the_exact_verdict_had_none(tmp_path, monkeypatch) -> None:
    """An EXACT recorded with --segments 1 proved nothing of segments; ctl train of a spec that runs in
    segments (eval_every < steps) said nothing, as if the trainer were verified for it."""
    from simulator.proving import record as verify_record

    spec = {"name": "s", "steps": 12, "eval_every": 4, "trainer": {"command": ["true"]}}
    verify_record.record(tmp_path, spec, "exact", kills=2, seed=0, segments=[12])
    notice = verify_record.unverified_notice(tmp_path, spec, "s.json")
    assert notice is not None and "not in segments" in notice, notice
    assert verify_record.unverified_notice(tmp_path, {**spec, "eval_every": 0}, "s.json") is None  # one segment
    verify_record.record(tmp_path, spec, "exact", kills=2, seed=0, segments=[4, 8, 12])
    assert verify_record.unverified_notice(tmp_path, spec, "s.json") is None


def test_a_metrics_file_with_bytes_that_are_not_utf8_is_read_without_them(tmp_path) -> None:
    """A damaged metrics.jsonl (a byte that is no UTF-8): ctl plot and ctl show died in read_text with a
    UnicodeDecodeError traceback; the damaged line is skipped like a torn one."""
    from app.runview import read_frames

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "train/loss": 2.0}\n\xff\xfe{"step": 2}\n{"step": 3, "train/loss": 1.5}\n')
    assert [f["step"] for f in read_frames(path)] == [1, 3]


def test_verify_resume_reads_step_records_past_a_line_that_is_not_utf8(tmp_path) -> None:
    """A user's trainer writing a raw non-UTF-8 byte in metrics.jsonl: step_records raised UnicodeDecodeError,
    a traceback of ctl verify-resume; the line is skipped as one that is not a step record."""
    from simulator.proving.diagnose import step_records

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "train/loss": 2.0}\n{"step": 2, "note": "\xe9"}\n{"step": 3, "train/loss": 1.5}\n')
    assert sorted(step_records(path)) == [1, 3]
    from simulator.proving.core import progress_lines

    progress = tmp_path / "progress.jsonl"
    progress.write_bytes(b'{"step": 1}\n{"event": "x\xe9"}\n{"step": 2}\n')
    assert [ln["step"] for ln in progress_lines(progress)] == [1, 2]


def test_the_verdict_key_reads_a_command_s_code_files_but_not_a_large_data_file(tmp_path, monkeypatch):
    """The key is computed on every ctl train/status/show: a dataset named on the trainer's command line is
    counted by its size, never read whole (it was read into memory on each of them)."""
    from pathlib import Path

    from simulator.proving import record as verify_record

    code, data = tmp_path / "train.py", tmp_path / "data.bin"
    code.write_text("print(1)\n")
    with open(data, "wb") as f:  # sparse: no disk used
        f.truncate(verify_record.CODE_FILE_MAX_BYTES + 1)
    spec = {"name": "x", "trainer": {"command": ["python", "train.py", "data.bin"], "cwd": str(tmp_path)}}
    key = verify_record.spec_key(spec)
    read = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.name) or real(self))
    assert verify_record.spec_key(spec) == key and read == ["train.py"]
    code.write_text("print(2)\n")
    assert verify_record.spec_key(spec) != key  # the code still counts byte for byte


def test_json_output_is_strict_json_when_a_loss_is_not_finite(capsys):
    """A diverged run's loss (inf, nan) in ``--json`` output: null, not Infinity/NaN (invalid JSON; found by
    review in ``ctl plot --json``)."""
    import json

    from ctl.cli_common import print_json

    print_json({"loss": [(1, float("inf")), (2, float("nan")), (3, 1.5)], "final_loss_hex": "0x1.8p+0"})
    out = capsys.readouterr().out
    assert "Infinity" not in out and "NaN" not in out
    assert json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))["loss"] == [
        [1, None],
        [2, None],
        [3, 1.5],
    ]


def test_segments_1_on_a_spec_ctl_train_runs_in_segments_is_not_proven() -> None:
    """Issue 24: --segments 1 compared no run in segments; if ctl train runs the spec in several (eval_every),
    the way it runs was not tested: NOT PROVEN with the reason, never EXACT (seen red without the guard)."""
    from simulator.proving.verify import _segments_untested

    r = _report("exact", {"ends": [12], "exact": None})
    _segments_untested(r, 12, 4)
    assert r.verdict == "not_proven" and not r.exact, r
    assert r.diagnosis == "the spec's ctl train runs 3 segments (eval_every 4); --segments 1 did not compare them"
    assert r.lines()[0].startswith("toy: NOT PROVEN"), r.lines()
    one = _report("exact", {"ends": [12], "exact": None})
    _segments_untested(one, 12, 0)  # no eval_every: ctl train runs one segment, EXACT stays possible
    assert one.verdict == "exact" and one.exact
    bad = _report("not_exact", {"ends": [12], "exact": None})
    _segments_untested(bad, 12, 4)
    assert bad.verdict == "not_exact"


def test_an_attempts_process_that_left_its_group_is_gone_when_the_attempt_ends(tmp_path) -> None:
    """Issue 24: a trainer's child that calls os.setsid() (torchrun's ranks, a daemonized loader) left the
    process group that _stop_group kills; every process of an attempt carries the attempt's tag, and the
    sweep kills them before the next attempt starts (seen red without kill_attempt: the child kept writing)."""
    import os
    import subprocess
    import sys
    import time

    from simulator.proving.verify import _run_attempt

    pidfile, out = tmp_path / "child.pid", tmp_path / "child.out"
    script = (
        f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
        f"    while True:\n        open({str(out)!r}, 'a').write('x')\n        time.sleep(0.02)\n"
        f"while not os.path.exists({str(pidfile)!r}):\n    time.sleep(0.01)\n"
    )

    class Fake:
        name, spec = "toy", {"steps": 1}

        def start(self, home, progress, extra_env):
            return subprocess.Popen(
                [sys.executable, "-c", script], env={**os.environ, **extra_env}, start_new_session=True
            )

    home = tmp_path / "home"
    home.mkdir()
    _run_attempt(Fake(), home, 1, "final", None, 30.0, False, lambda s: None)
    pid = int(pidfile.read_text())
    try:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", (
            "the setsid child outlived its attempt"
        )
        size = out.stat().st_size
        time.sleep(0.2)
        assert out.stat().st_size == size  # it writes no more
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_diagnose_says_what_the_compared_states_show_when_the_data_position_was_equal() -> None:
    """Issue 40: with the tracked data state equal at the resume (listed among the equal pieces) the
    diagnosis said "the data position was not restored" and "no data is tracked". Now it says the position
    was restored and names the RNG that draws the data (order or contents)."""
    ref = {s: rec(str(s), batch=f"b{s}") for s in range(1, 9)}
    other = {**ref, **{s: rec("x", batch=f"z{s}") for s in range(5, 9)}}
    step, text, suspects = diagnose(ref, other, [(4, STATE)], {4: STATE}, ["model", "data"])
    assert step == 5 and suspects == ["rng/data"], (suspects, text)
    assert "the data position was restored" in text and "not restored (step" not in text, text
    assert "no data is tracked" not in text and "data, lr, model" in text, text
    assert "run.track(generators={'data': g})" in text and "__getitem__" in text, text
    # a Lightning run's tracked list from its early 'ready' line (the model alone) no longer makes it say
    # "no data is tracked" while the state it lists has data equal
    step, text, _ = diagnose(ref, other, [(4, STATE)], {4: STATE}, ["model"], "tinyllm.integrations.lightning")
    assert "no data is tracked" not in text and "run.track" not in text, text
    assert "DurableCallback(run, track_generators={'data': g})" in text, text


@pytest.mark.parametrize(
    "kind,call",
    [
        (None, "run.track(generators={'...': g})"),
        ("tinyllm.integrations.hf", "DurableTrainer(run, ..., track_generators={'aug': g})"),
        ("tinyllm.integrations.lightning", "DurableCallback(run, track_generators={'aug': g})"),
    ],
)
def test_the_private_rng_diagnosis_names_the_call_of_the_trainer_kind_in_use(kind, call) -> None:
    """Issue 40: the "private RNG" diagnosis told DurableTrainer/DurableCallback users to call
    run.track(generators=...), which neither integration has; it names each trainer's own call."""
    ref = {1: rec("1"), 2: rec("2"), 3: rec("3")}
    step, text, suspects = diagnose(ref, {**ref, 3: rec("x")}, [(2, STATE)], {2: STATE}, ["model"], kind)
    assert step == 3 and suspects == ["rng"] and call in text, text
    if kind is not None:
        assert "run.track" not in text, text


def test_the_tracked_pieces_come_from_the_start_line_not_the_integrations_early_ready_line() -> None:
    from simulator.proving.diagnose import tracked_and_kind

    kind = "tinyllm.integrations.lightning"
    lines = [
        {"event": "ready", "tracked": ["model"], "trainer": kind},
        {"event": "start", "tracked": ["model", "optimizer", "scheduler", "data"], "trainer": kind},
        {"event": "step", "tracked": ["model", "optimizer", "scheduler", "data"]},
    ]
    assert tracked_and_kind(lines) == (["model", "optimizer", "scheduler", "data"], kind)
    assert tracked_and_kind([{"event": "start", "tracked": ["model", "data"]}]) == (["model", "data"], None)
    assert tracked_and_kind([{"step": 3}]) == (None, None)  # tinyllm's own trainer: nothing tracked listed


def test_a_not_exact_run_in_segments_prints_its_own_figures_beside_the_uninterrupted_runs() -> None:
    """Issue 40: the report printed the uninterrupted and the killed runs' equal figures above the line that
    said the segments differ, and never the run in segments' own figures."""
    seg = {
        "ends": [6, 12],
        "exact": False,
        "final_loss_hex": "0x1.8p-1",
        "digest": "cdcdcdcdcdcdcdcdcdcd",
        "first_differing_step": 7,
    }
    lines = _report("not_exact", seg).lines()
    assert "  segments [6, 12] (as ctl train runs it): differ from step 7" in lines, lines
    assert "    final_loss_hex 0x1p-1 (uninterrupted) vs 0x1.8p-1 (in segments)" in lines, lines
    assert "    digest         ab (uninterrupted) vs cdcdcdcdcdcdcdcd (in segments)" in lines, lines
    failed = {"ends": [6, 12], "exact": False, "failed": {"segment": 2, "end": 12, "exit": 2, "error": "durable: x"}}
    lines = _report("not_exact", failed).lines()
    assert lines[0].startswith("toy: NOT EXACT after 1 interruption(s)"), lines
    assert "  segments [6, 12] (as ctl train runs it): differ: segment 2 (to step 12) failed (exit 2)" in lines, lines


def test_a_failed_segment_is_diagnosed_with_the_schedule_horizon_of_the_trainer_kind() -> None:
    from simulator.proving.segments import diagnose_failed_segment, diagnose_segments

    text = diagnose_failed_segment(
        2, [20, 40], 1, "ValueError: Tried to step 21 times.", "tinyllm.integrations.lightning"
    )
    assert text.startswith("segment 2 of the run in segments [20, 40] (steps 21..40, "), text
    assert "Tried to step 21 times" in text and "OneCycleLR" in text and "trainer.estimated_stepping_batches" in text
    assert "config.schedule_steps" in diagnose_segments(13, ["lr"], [12, 24], "tinyllm.integrations.hf")
    assert "run.run_steps" in diagnose_segments(13, ["lr"], [12, 24], None)


def test_steps_lost_reads_the_stopping_line_then_the_step_records_and_the_resume_line_then_latest() -> None:
    """Steps lost at an interruption (issue 39): done = the trainer's ``stopping`` line or its per-step records
    (the larger: a trainer that trains on after the signal loses those too), minus the step the next attempt's
    own resume line names, else LATEST when it started."""
    from simulator.proving.verify import Attempt, graceful_loss, steps_lost

    def att(**kw):
        base = dict(mode="term", target_step=5, resumed_step=0, returncode=130, reached_step=None)
        return Attempt(**{**base, **kw})

    assert steps_lost(att(reached_step=7, stopping_step=None), att(resumed_step=7)) == (0, 7, 7)
    assert steps_lost(att(reached_step=7, stopping_step=9), att(resumed_step=7)) == (2, 9, 7)
    assert steps_lost(att(reached_step=9, stopping_step=7), att(resumed_step=9)) == (0, 9, 9)
    assert steps_lost(att(reached_step=7), att(resumed_step=7, resume_line_step=6)) == (1, 7, 6)
    assert steps_lost(att(reached_step=None), att(resumed_step=3)) == (None, None, 3)
    kill = {"signal": "SIGKILL", "steps_lost": 3, "steps_done": 5, "resumed_from": 2}
    term = {"signal": "SIGTERM", "steps_lost": 0, "steps_done": 5, "resumed_from": 5}
    assert graceful_loss([kill, term]) is None
    lost = graceful_loss([kill, {**term, "steps_lost": 1, "resumed_from": 4}])
    assert lost.startswith("a graceful stop lost 1 step(s): SIGTERM at step 5, checkpoint at step 4 (interruption 2"), (
        lost
    )
