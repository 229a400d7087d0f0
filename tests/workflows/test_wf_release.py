"""ModelRelease's pieces without processes: gate parsing and checking, and the publication's
idempotence by checkpoint digest (a second publish of the same digest is the first one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflows.release import ModelReleaseInput, PublishInput, check_gate, list_releases, parse_gate, publish

FIGURES = {"ppl/heldout/ppl": 6.2, "ppl/heldout/loss": 1.8, "zoo/a/acc": 0.5, "zoo/b/acc": 0.7}


@pytest.mark.parametrize(
    "text, passed, figure",
    [
        ("ppl/ppl<=6.5", True, 6.2),
        ("ppl/heldout/ppl < 6", False, 6.2),
        ("ppl/loss>=1.8", True, 1.8),
        ("zoo/a/acc==0.5", True, 0.5),
        ("zoo/acc>0.1", False, None),  # acc is not unique in zoo: no such figure
        ("ppl/nope<=1", False, None),
    ],
)
def test_gates_resolve_figures_and_compare(text: str, passed: bool, figure) -> None:
    out = check_gate(parse_gate(text), FIGURES)
    assert (out.passed, out.figure) == (passed, figure)


@pytest.mark.parametrize("bad", ["ppl<=6", "ppl/ppl<<6", "ppl/ppl<=x", "ppl/ppl", "/ppl<=1"])
def test_malformed_gates_are_refused_in_one_phrase(bad: str) -> None:
    with pytest.raises(ValueError, match="is not SUITE/FIGURE OP NUMBER"):
        parse_gate(bad)


def test_publish_is_once_per_digest(tmp_path: Path) -> None:
    ck = tmp_path / "runs/r/ckpt/step-000002"
    ck.mkdir(parents=True)
    (ck / "model.pt").write_bytes(b"weights")
    (ck / "manifest.json").write_text("{}")
    rel = ModelReleaseInput(
        name="r",
        select="best",
        checkpoint="runs/r/ckpt/step-000002",
        step=2,
        digest="ab" * 32,
        suites=["ppl"],
        spec={"name": "r"},
    )
    inp = PublishInput(release=rel, figures={"ppl/heldout/ppl": 6.0}, gates=[])
    (tmp_path / "releases/r/.tmp-v0001-123/model").mkdir(parents=True)  # a publication killed before its rename
    first = publish(tmp_path, inp)
    again = publish(tmp_path, inp)
    assert (first.version, first.reused, again.version, again.reused) == ("v0001", False, "v0001", True)
    assert sorted(p.name for p in (tmp_path / "releases/r").iterdir()) == ["CURRENT", "v0001"]
    other = publish(tmp_path, inp.model_copy(update={"release": rel.model_copy(update={"digest": "cd" * 32})}))
    assert other.version == "v0002" and (tmp_path / "releases/r/CURRENT").read_text().strip() == "v0002"
    assert (tmp_path / "releases/r/v0001/model/model.pt").read_bytes() == b"weights"
    m = json.loads((tmp_path / "releases/r/v0001/manifest.json").read_text())
    assert m["checkpoint_digest"] == "ab" * 32 and m["code_version"]
    assert [(r["version"], r["current"]) for r in list_releases(tmp_path)] == [("v0001", False), ("v0002", True)]


def test_a_damaged_release_manifest_is_listed_without_its_figures_never_a_traceback(tmp_path: Path) -> None:
    """A version whose manifest.json is JSON but not an object, or whose figures are not numbers: ctl release
    --list (and ctl show, and the next publication, which lists the versions) used to fail with an
    AttributeError / ValueError traceback."""
    from click.testing import CliRunner

    from ctl.release import release

    for version, body in (
        ("v0001", []),
        ("v0002", {"figures": {"ppl/ppl": "x", "ok": 1.5}, "checkpoint": 3}),
        ("v0003", {"figures": ["x"]}),
    ):
        (tmp_path / "releases/small" / version).mkdir(parents=True)
        (tmp_path / "releases/small" / version / "manifest.json").write_text(json.dumps(body))
    rows = list_releases(tmp_path)
    assert [(r["version"], r["figures"]) for r in rows] == [("v0001", {}), ("v0002", {"ok": 1.5}), ("v0003", {})]
    out = CliRunner().invoke(release, ["--list", "--home", str(tmp_path)])
    assert out.exit_code == 0 and "releases/small/v0002" in out.output and "ok=1.5" in out.output, out.output


def test_publish_holds_the_weights_config_and_tokenizer_never_the_optimizer_nor_a_damaged_model(tmp_path: Path) -> None:
    """A tinyllm-format checkpoint: the release's model/ is model.pt (checked against the checkpoint's sha256),
    config.json and tokenizer.json from its manifest's meta; optimizer.pt and training_state.pt stay with the run.
    A model.pt that fails its checksum is never published (NonRetryableError, nothing written)."""
    import hashlib

    from engine import NonRetryableError

    ck = tmp_path / "runs/r/ckpt/step-000002"
    ck.mkdir(parents=True)
    files = {"model.pt": b"weights", "optimizer.pt": b"moments", "training_state.pt": b"rng"}
    for name, data in files.items():
        (ck / name).write_bytes(data)
    meta = {"trajectory": {"model": {"n_layer": 1}}, "tokenizer": {"kind": "byte"}}
    (ck / "manifest.json").write_text(
        json.dumps(
            {
                "files": {n: {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()},
                "meta": meta,
            }
        )
    )
    rel = ModelReleaseInput(
        name="r",
        select="best",
        checkpoint="runs/r/ckpt/step-000002",
        step=2,
        digest="ab" * 32,
        suites=["ppl"],
        spec={"name": "r"},
    )
    publish(tmp_path, PublishInput(release=rel, figures={}, gates=[]))
    model = tmp_path / "releases/r/v0001/model"
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.pt", "tokenizer.json"]
    assert json.loads((model / "config.json").read_text()) == {"n_layer": 1}
    assert json.loads((model / "tokenizer.json").read_text()) == {"kind": "byte"}
    (ck / "model.pt").write_bytes(b"weightz")
    with pytest.raises(NonRetryableError, match="model.pt fails its sha256 checksum"):
        publish(tmp_path, PublishInput(release=rel.model_copy(update={"digest": "cd" * 32}), figures={}, gates=[]))
    assert sorted(p.name for p in (tmp_path / "releases/r").iterdir()) == ["CURRENT", "v0001"]
