"""The run home's contract (contracts/): its paths, manifest verification, resume choice, exit codes,
progress lines and activity ids, and that it stays importable by every side (standard library only)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

import contracts
from contracts import activity_ids, exits, layout, progress
from contracts.manifest import (
    CheckpointError,
    build_manifest,
    file_entry,
    read_sidecar,
    verify_checkpoint,
)
from contracts.resume import (
    choose_resume,
    expected_resume,
    read_latest,
    resume_argument,
)

ROOT = Path(__file__).resolve().parents[2]


def write_checkpoint(home: Path, name: str, step: int, *, latest: bool = True, resumable: bool = True) -> Path:
    """A checkpoint as the contract lays it out (no torch: the files are bytes, the manifest is the contract's)."""
    d = layout.RunHome(home).run(name).step_dir(step)
    d.mkdir(parents=True)
    files = {}
    components = ["model", "optimizer", "training_state"] if resumable else ["model"]
    for c in components:
        data = f"{c} at {step}".encode()
        (d / f"{c}.pt").write_bytes(data)
        files[f"{c}.pt"] = file_entry(data)
    (d / layout.MANIFEST).write_text(json.dumps(build_manifest(step, components, files)))
    if latest:
        (d.parent / layout.LATEST).write_text(d.name + "\n")
    return d


def test_contracts_imports_nothing_but_the_standard_library() -> None:
    """Every side (engine, workflows, ctl, UI, simulator, tinyllm, a user's trainer) can import it."""
    for path in sorted((ROOT / "contracts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue  # its own modules
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for n in names:
                top = n.split(".")[0]
                assert top == "__future__" or top in sys.stdlib_module_names or top == "contracts", (path.name, n)


def test_the_home_layout() -> None:
    home = layout.RunHome("/h")
    run = home.run("tiny")
    assert run.step_dir(500) == Path("/h/runs/tiny/ckpt/step-000500")
    assert run.latest == Path("/h/runs/tiny/ckpt/LATEST")
    assert run.artifact_dir(7) == Path("/h/runs/tiny/checkpoint_artifacts/iter_000007")
    assert run.progress_file("train-000500", 2) == Path("/h/runs/tiny/activity/train-000500/progress-2.jsonl")
    assert run.metrics == Path("/h/runs/tiny/metrics.jsonl") and run.lock == Path("/h/runs/tiny/.lock")
    assert home.engine_db == Path("/h/.ctl/engine.db")
    assert home.ctl_activity_dir("corpus-default") == Path("/h/.ctl/activity/corpus-default")
    assert home.corpus("default") == Path("/h/corpora/default")
    assert home.eval_dir("ppl", "tiny") == Path("/h/evals/ppl/tiny")
    assert home.release_dir("tiny", "v1") == Path("/h/releases/tiny/v1")
    assert layout.checkpoint_ref("tiny", 5) == "runs/tiny/ckpt/step-000005"
    assert home.resolve_checkpoint("tiny@5") == run.step_dir(5)
    assert home.resolve_checkpoint("x/y") == Path("/h/x/y") and home.resolve_checkpoint("/a") == Path("/a")
    assert layout.parse_step_dir("runs/tiny/ckpt/step-1234567") == 1234567
    assert [layout.parse_step_dir(n) for n in ("step-00001", "LATEST", ".tmp-step-000001-9", None)] == [None] * 4


def test_activity_ids_format_and_parse_together() -> None:
    assert activity_ids.train_id(500) == "train-000500"
    assert activity_ids.eval_id("000500", "ppl") == "eval-000500-ppl" and activity_ids.eval_id("", "zoo") == "eval-zoo"
    assert activity_ids.corpus_id("default") == "corpus-default"
    for aid, want in [
        ("train-000500", ("train", 500, None)),
        ("eval-000500-ppl", ("eval", 500, "ppl")),
        ("eval-000500-my-suite", ("eval", 500, "my-suite")),
        ("eval-zoo", ("eval", None, "zoo")),
        ("corpus-default", ("corpus", None, "default")),
        ("publish-v1", ("publish", None, None)),
        ("x", ("other", None, None)),
    ]:
        got = activity_ids.parse_activity_id(aid)
        assert (got.kind, got.step, got.rest) == want, aid
    with pytest.raises(ValueError):
        activity_ids.train_id(-1)


def test_progress_lines_format_and_parse_together() -> None:
    line = progress.format_line({"step": 3, "loss": 1.5, "checkpoint": "runs/x/ckpt/step-000003"}, 12.0)
    assert line.endswith("\n") and progress.parse_line(line) == {
        "step": 3,
        "loss": 1.5,
        "checkpoint": "runs/x/ckpt/step-000003",
        "time": 12.0,
    }
    assert progress.saved_checkpoint(progress.parse_line(line)) == "runs/x/ckpt/step-000003"
    assert progress.saved_checkpoint({"event": "progress", "step": 4, "checkpoint": "c"}) is None
    assert progress.saved_checkpoint({"event": "checkpoint", "step": True, "checkpoint": "c"}) is None
    for bad in ("", "  ", "[1]", '{"loss": NaN}', '{"loss": 1e999}', "{torn", b"\xff\n"):
        assert progress.parse_line(bad) is None, bad


def test_the_exit_codes() -> None:
    assert (
        exits.EXIT_OK,
        exits.EXIT_FAILED,
        exits.EXIT_BAD_INPUT,
        exits.EXIT_NOT_PROVEN,
        exits.EXIT_CONTRACT_BROKEN,
        exits.EXIT_DISK_FULL,
        exits.EXIT_LOCKED,
        exits.EXIT_CANCELED,
        exits.EXIT_PREEMPTED,
    ) == (0, 1, 2, 3, 4, 74, 75, 130, 143)


def test_verification_refuses_what_is_torn_or_corrupt(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path, "r", 4)
    assert verify_checkpoint(d)["step"] == 4
    (d / "model.pt").write_bytes(b"model at 5")  # same size, other bytes
    with pytest.raises(CheckpointError, match="model.pt fails its sha256 checksum"):
        verify_checkpoint(d)
    (d / "model.pt").write_bytes(b"mod")
    with pytest.raises(CheckpointError, match="model.pt has 3 bytes, manifest says 10"):
        verify_checkpoint(d)
    e = write_checkpoint(tmp_path, "r", 5)
    m = json.loads((e / "manifest.json").read_text())
    m["resumable"] = False
    (e / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="fails its own checksum"):
        verify_checkpoint(e)
    f = write_checkpoint(tmp_path, "r", 6)
    (f / "phase.json").write_text(json.dumps({"sha256": "0" * 64, "body": {}}))
    with pytest.raises(CheckpointError, match="phase.json fails its sha256"):
        verify_checkpoint(f)
    assert read_sidecar(f, "absent.json") is None
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        verify_checkpoint(tmp_path / "nothing")


def test_one_resume_choice_the_trainer_and_the_displays_share(tmp_path: Path) -> None:
    """The trainer's choice (choose_resume) given the workflow's --resume (resume_argument) is what a display
    says (expected_resume): LATEST when it verifies, else the newest older valid checkpoint."""
    run = layout.RunHome(tmp_path).run("r")
    for s in (2, 4, 6):
        write_checkpoint(tmp_path, "r", s)
    assert resume_argument(tmp_path, "r", 10, 1, None) is None  # the trainer's own LATEST
    assert choose_resume(run.path).path == run.step_dir(6)
    assert expected_resume(tmp_path, "r", 10, 1, None) == "runs/r/ckpt/step-000006"
    (run.step_dir(6) / "optimizer.pt").write_bytes(b"torn")
    choice = choose_resume(run.path)
    assert choice.path == run.step_dir(4) and [r.checkpoint for r in choice.refused] == [run.step_dir(6)]
    assert expected_resume(tmp_path, "r", 10, 1, None) == "runs/r/ckpt/step-000004"
    # a segment ending at 3 behind a LATEST at 6: the workflow hands step-000002, which verifies
    assert resume_argument(tmp_path, "r", 3, 1, None) == "runs/r/ckpt/step-000002"
    assert expected_resume(tmp_path, "r", 3, 1, None) == "runs/r/ckpt/step-000002"
    run.latest.write_bytes(b"\xff")
    assert read_latest(run.latest) == "(damaged LATEST)"
    assert expected_resume(tmp_path, "r", 10, 1, None) == "runs/r/ckpt/step-000004"
    assert expected_resume(tmp_path, "empty", 10, 1, None) is None


def test_the_front_door_names_every_module_concept() -> None:
    for name in contracts.__all__:
        assert getattr(contracts, name) is not None
