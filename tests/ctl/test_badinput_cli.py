"""Issue 10's table, each row through the real ``ctl`` (subprocesses): the exit code, one line on
stderr, no traceback, and the home's files compared before and after."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from bi_helpers import (
    SPEC,
    Tmpfs,
    copy_home,
    ctl,
    db_of,
    event_offsets,
    one_line_error,
    poke,
    snapshot,
    tinyllm,
    write_json,
)

pytestmark = pytest.mark.slow  # every row runs the real ctl/tinyllm as subprocesses


def _train(home: Path, spec: Path) -> list[str]:
    return ["train", "--spec", str(spec), "--no-eval"]


def test_garbage_inside_event_pages_names_database_workflow_and_event(finished_home, tmp_path):
    home = copy_home(finished_home, tmp_path / "h")
    db = db_of(home)
    off = event_offsets(db, "train/mini", b'"final_loss_hex"')[-1]
    poke(db, off, bytes(range(0xE0, 0xF0)))  # 16 garbage bytes inside an event's JSON
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # SQLite cannot see it
    conn.close()
    before = snapshot(home)
    for args in (["history", "train/mini"], _train(home, home / "spec.json")):
        err = one_line_error(ctl(home, *args), 2, str(db), "workflow train/mini", "event ", "damaged")
        assert "cannot be read" in err
    # status and list still show every workflow that can be read
    for args in (["status"], ["list"]):
        proc = ctl(home, *args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "train/mini" in proc.stdout and "train/other" in proc.stdout
    # the damaged workflow's own status reads its history (step, loss): refused in one line
    one_line_error(ctl(home, "status", "train/mini"), 2, "workflow train/mini", "event ")
    assert ctl(home, "status", "train/other").returncode == 0
    assert snapshot(home) == before


def test_damaged_workflow_row_is_reported_and_the_others_listed(finished_home, tmp_path):
    home = copy_home(finished_home, tmp_path / "h")
    conn = sqlite3.connect(db_of(home))  # damage one value, as a flipped byte inside a row would
    conn.execute("UPDATE workflows SET result = CAST(X'7b2273746570223affff' AS TEXT) WHERE id='train/mini'")
    conn.commit()
    conn.close()
    before = snapshot(home)
    proc = ctl(home, "list")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "train/other" in proc.stdout and "train/mini" not in proc.stdout
    assert "workflow train/mini" in proc.stderr and "its result" in proc.stderr
    one_line_error(ctl(home, "status", "train/mini"), 2, "workflow train/mini", "its result", "damaged")
    assert snapshot(home) == before


def test_garbage_in_page_3_says_damaged_not_foreign(finished_home, tmp_path):
    home = copy_home(finished_home, tmp_path / "h")
    db = db_of(home)
    poke(db, 3 * 4096 - 16, bytes(range(0xE0, 0xF0)))
    before = snapshot(home)
    for args in (["status"], ["list"], ["history", "train/mini"], _train(home, home / "spec.json"), ["doctor"]):
        proc = ctl(home, *args)
        if args == ["doctor"]:
            assert proc.returncode == 1 and "damaged" in proc.stdout and "Traceback" not in proc.stderr
            continue
        err = one_line_error(proc, 2)
        assert "damaged" in err or "corrupt" in err, err
        assert "another application" not in err and "something else" not in err
    assert snapshot(home) == before


def test_garbage_in_a_recorded_spec_is_named_damaged(finished_home, tmp_path):
    home = copy_home(finished_home, tmp_path / "h")
    db = db_of(home)
    for off in event_offsets(db, "train/mini", b'"threads":1'):  # every recorded copy of the spec
        poke(db, off + 4, b"GARBAGEGARBAGE00")
    before = snapshot(home)
    err = one_line_error(
        ctl(home, *_train(home, home / "spec.json")), 2, "damaged", "checksum mismatch", "workflow train/mini"
    )
    assert "different request" not in err
    assert snapshot(home) == before


@pytest.fixture
def ro_mount(tmp_path):
    with Tmpfs(tmp_path / "ro", "20m") as fs:
        if not fs.ok:
            pytest.skip(f"read-only home needs a tmpfs mount: {fs.why}")
        yield fs


def test_read_only_home_reads_work_and_train_refuses(finished_home, tmp_path, ro_mount):
    home = copy_home(finished_home, ro_mount.path / "h")
    expected = {a: ctl(home, *a.split()).stdout for a in ("status", "list", "history train/mini")}
    ro_mount.remount_ro()
    before = snapshot(home)
    for a, out in expected.items():
        proc = ctl(home, *a.split())
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == out
    one_line_error(ctl(home, *_train(home, home / "spec.json")), 2, "read-only")
    one_line_error(ctl(home, "cancel", "train/other"), 2, "read-only")
    assert snapshot(home) == before


def test_empty_read_only_home(tmp_path, ro_mount):
    spec = write_json(tmp_path / "s.json", SPEC)
    ro_mount.remount_ro()
    home = ro_mount.path
    one_line_error(ctl(home, "train", "--spec", str(spec)), 2, "read-only")
    one_line_error(ctl(home, "status"), 2, "no ctl database")
    assert snapshot(home) == {}


def test_spec_that_is_not_utf8(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    spec = tmp_path / "latin1.json"
    spec.write_bytes('{"name": "caf\u00e9", "steps": 3}'.encode("latin-1"))
    one_line_error(ctl(home, "train", "--spec", str(spec)), 2, "not UTF-8")
    one_line_error(tinyllm(home, "train", "--spec", str(spec)), 2, "not UTF-8")
    assert snapshot(home) == {}


def test_zero_length_database_beside_runs_is_refused(finished_home, tmp_path):
    home = copy_home(finished_home, tmp_path / "h")
    for p in home.joinpath(".ctl").glob("engine.db*"):
        p.unlink()
    db_of(home).write_bytes(b"")
    before = snapshot(home)
    one_line_error(
        ctl(home, *_train(home, home / "spec.json")), 2, "empty (0 bytes)", "runs/", "mini", "evaluation is done again"
    )
    one_line_error(ctl(home, "status"), 2, "empty")
    assert snapshot(home) == before


@pytest.mark.parametrize("value", [True, "300", 3.0, None])
def test_steps_must_be_a_json_integer(tmp_path, value):
    home = tmp_path / "h"
    home.mkdir()
    spec = write_json(tmp_path / "s.json", {**SPEC, "steps": value})
    one_line_error(ctl(home, "train", "--spec", str(spec)), 2, "steps: must be an integer")
    assert snapshot(home) == {}


def test_typo_names_the_unknown_field_first_with_the_closest_known_one(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    spec = {k: v for k, v in SPEC.items() if k != "steps"} | {"stpes": 300, "batch_size": "4"}
    path = write_json(tmp_path / "s.json", spec)
    for proc in (ctl(home, "train", "--spec", str(path)), tinyllm(home, "train", "--spec", str(path))):
        err = one_line_error(
            proc,
            2,
            "stpes: unknown field (did you mean steps?)",
            "steps: required field missing",
            "batch_size: must be an integer",
        )
        assert err.index("stpes") < err.index("steps: required") < err.index("batch_size")
    assert snapshot(home) == {}


def test_eval_header_describes_an_evaluation(finished_home, tmp_path):
    home = copy_home(finished_home, tmp_path / "h")
    proc = ctl(
        home,
        "eval",
        "--suite",
        "ppl",
        "--subject",
        "final=runs/mini/ckpt/step-000006",
        "--name",
        "sp-final",
        "--max-items",
        "1",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = next(ln for ln in proc.stderr.splitlines() if ln.startswith("eval/sp-final:"))
    assert header == "eval/sp-final: evaluating 1 subject(s) (final) with ppl", header
    assert "segment" not in header


def test_ctl_doctor_clean_home_and_fix_removes_only_leftovers(finished_home, tmp_path):
    home = copy_home(finished_home, tmp_path / "h")
    proc = ctl(home, "doctor")  # (each doctor imports torch: three calls in all)
    assert proc.returncode == 0 and "no problems" in proc.stdout, proc.stdout + proc.stderr
    ckpt = home / "runs" / "mini" / "ckpt"
    (ckpt / ".tmp-step-000009-999999").mkdir()  # pid 999999: a writer that is gone
    (home / "runs" / "mini" / "metrics.jsonl.tmp-999998").write_text("torn")
    poke(ckpt / "step-000003" / "model.pt", 200, b"\x00\x01\x02\x03")
    (ckpt / "LATEST").write_bytes(b"\xff\xfe")
    poke(home / "corpora" / "default" / "tokens.bin", 10, b"AB")
    before = snapshot(home)
    proc = ctl(home, "doctor", "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    found = {(f["kind"], f["path"]) for f in findings}
    assert found == {
        ("leftover", "runs/mini/ckpt/.tmp-step-000009-999999"),
        ("leftover", "runs/mini/metrics.jsonl.tmp-999998"),
        ("damaged", "runs/mini/ckpt/step-000003"),
        ("damaged", "runs/mini/ckpt/LATEST"),
        ("damaged", "corpora/default/tokens.bin"),
    }, found
    assert snapshot(home) == before  # read-only
    means = next(f["means"] for f in findings if f["path"] == "runs/mini/ckpt/step-000003")
    assert "train/mini resumes from step-000006" in means  # what the damage means for which run
    proc = ctl(home, "doctor", "--fix")
    assert proc.returncode == 1  # the damaged files are reported, never "repaired"
    after = snapshot(home)
    assert set(before) - set(after) == {"runs/mini/ckpt/.tmp-step-000009-999999", "runs/mini/metrics.jsonl.tmp-999998"}
    assert all(after[k] == v for k, v in before.items() if k in after)


def test_corpus_spec_is_checked_strictly_before_anything_starts(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    spec = write_json(tmp_path / "s.json", SPEC)
    corpus = write_json(tmp_path / "c.json", {"name": "default", "sourcs": ["a.txt"], "heldout_fraction": "0.1"})
    one_line_error(
        ctl(home, "train", "--spec", str(spec), "--corpus-spec", str(corpus)),
        2,
        "sourcs: unknown field (did you mean sources?)",
        "heldout_fraction: must be a number",
    )
    assert snapshot(home) == {}


_TOP_DUP = '{"name": "mini", "steps": 300, "steps": 400}'
_NESTED_DUP = '{"name": "mini", "steps": 3, "model": {"n_layer": 1, "n_layer": 2}}'


@pytest.mark.parametrize("text, key", [(_TOP_DUP, "steps"), (_NESTED_DUP, "n_layer")])
def test_duplicate_key_in_any_spec_is_refused_naming_key_and_file(tmp_path, text, key):
    """Strict JSON: ``"steps": 300, "steps": 400`` is refused (json keeps the last one silently),
    top-level or nested, in each spec each CLI reads, before anything is written or started."""
    home = tmp_path / "h"
    home.mkdir()
    spec = tmp_path / "dup.json"
    spec.write_text(text)
    custom = tmp_path / "custom.json"
    custom.write_text('{"name": "c", "steps": 2, "trainer": {"command": ["python", "-c", "pass"], "command": ["x"]}}')
    good = write_json(tmp_path / "s.json", SPEC)
    runs = [
        (ctl(home, "train", "--spec", str(spec)), spec, key),
        (ctl(home, "train", "--spec", str(good), "--corpus-spec", str(spec)), spec, key),
        (ctl(home, "train", "--spec", str(custom)), custom, "command"),
        (ctl(home, "verify-resume", "--spec", str(spec)), spec, key),
        (ctl(home, "eval", "--spec", str(custom), "--suite", "ppl", "--subject", "a=ckpt"), custom, "command"),
        (tinyllm(home, "train", "--spec", str(spec)), spec, key),
        (tinyllm(home, "corpus", "--spec", str(spec)), spec, key),
        (tinyllm(home, "eval", "--spec", str(spec)), spec, key),
    ]
    for proc, path, k in runs:
        one_line_error(proc, 2, f"duplicate key '{k}'", str(path))
    assert snapshot(home) == {}


def test_duplicate_key_refused_by_the_durable_helper(tmp_path):
    """The torch-only helper (tinyllm.durable, custom trainers) reads specs itself: same refusal."""
    import subprocess
    import sys
    from bi_helpers import env

    spec = tmp_path / "dup.json"
    spec.write_text('{"name": "s", "steps": 4, "config": {"lr": 0.1, "lr": 0.2}}')
    proc = subprocess.run(
        [sys.executable, "examples/durable_train.py", "--spec", str(spec), "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
        cwd=str(Path(__file__).parents[2]),
    )
    one_line_error(proc, 2, "duplicate key 'lr'", str(spec))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dup.json"]
