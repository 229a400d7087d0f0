"""The integrations' small parts, in process: the examples' diffs stay small, HF's files are sorted into
the contract's pieces, a mirrored checkpoint is written back byte for byte, a missing extra is one line
and exit 2."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import pytest

from tinyllm.integrations import contract

ROOT = Path(__file__).resolve().parents[2]


def code_lines(path: Path) -> list[str]:
    """The script without its module docstring (the first triple-quoted block)."""
    text = path.read_text()
    end = text.index('"""', 3) + 3
    return text[end:].splitlines()


@pytest.mark.parametrize(
    "plain,durable", [("hf_trainer_plain.py", "hf_trainer.py"), ("lightning_train_plain.py", "lightning_train.py")]
)
def test_the_user_change_is_at_most_ten_lines(plain: str, durable: str) -> None:
    a, b = code_lines(ROOT / "examples" / plain), code_lines(ROOT / "examples" / durable)
    changed = [
        ln
        for ln in difflib.unified_diff(a, b, lineterm="", n=0)
        if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and ln[1:].strip()
    ]
    added = sum(1 for ln in changed if ln.startswith("+"))
    assert 0 < added <= 10, changed


def test_a_missing_extra_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "no_such_framework_xyz", None)
    with pytest.raises(contract.MissingExtra) as e:
        contract.require("no_such_framework_xyz", "hf")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'durable-train[hf]'" in err[0], err


def test_materialize_writes_the_files_back_byte_for_byte(tmp_path: Path) -> None:
    comps = {
        "model": {"model.safetensors": b"\x00w"},
        "optimizer": {"optimizer.pt": b"o", "scheduler.pt": b"s"},
        "training_state": {"format": "x", "step": 3, "files": {"rng_state.pth": b"r", "sub/t.json": b"{}"}},
    }
    out = contract.FrameworkRun.materialize(comps, tmp_path / "checkpoint-3")
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == {
        "model.safetensors": b"\x00w",
        "optimizer.pt": b"o",
        "scheduler.pt": b"s",
        "rng_state.pth": b"r",
        "sub/t.json": b"{}",
    }


@pytest.mark.slow  # imports transformers (seconds)
def test_hf_files_go_to_their_pieces() -> None:
    from tinyllm.integrations import hf  # the [hf] extra (CI installs it)

    assert [
        hf.classify(n)
        for n in (
            "model.safetensors",
            "config.json",
            "optimizer.pt",
            "scheduler.pt",
            "scaler.pt",
            "rng_state.pth",
            "trainer_state.json",
            "training_args.bin",
        )
    ] == ["model", "model", "optimizer", "optimizer", "optimizer", "training_state", "training_state", "training_state"]


def test_the_integrations_use_only_durable_runs_public_seam() -> None:
    """The framework integrations drive a ``DurableRun`` through its public methods (emit, heartbeat,
    stop_requested, install_signal_handlers, count_save, fingerprint_every_step), never its ``_`` members:
    a user writing an integration for another framework has the same seam."""
    import ast

    private = []
    for path in sorted((ROOT / "tinyllm" / "integrations").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                name = (
                    owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
                )
                if name == "run":
                    private.append(f"{path.name}:{node.lineno}: run.{node.attr}")
    assert not private, private
