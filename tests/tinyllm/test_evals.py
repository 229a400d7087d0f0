"""Eval suites: outputs match the schema, repeat byte for byte, ppl is token-weighted."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tinyllm.schemas import render
from tinyllm.spec import EvalSummary

from tl_helpers import cli_in_process, last_json, run_tinyllm, tree, write_spec
from jsonschema_lite import errors as schema_errors


@pytest.fixture(scope="module")
def trained(tmp_path_factory, built_corpus):
    """A home with two checkpoints (steps 10 and 20) of the small spec, trained in-process."""
    import shutil

    from tinyllm.sinks.metrics import Reporter
    from tinyllm.spec import load_train_spec
    from tinyllm.trainer import Trainer

    home = tmp_path_factory.mktemp("eval-home")
    shutil.copytree(built_corpus, home / "corpora")
    spec = load_train_spec(write_spec(home / "s.json", steps=20))
    Trainer(spec, home).run(reporter=Reporter([]))
    return home


def _spec(home, suite, **extra):
    path = home / f"eval-{suite}.json"
    path.write_text(
        json.dumps(
            {
                "name": "small",
                "tag": "000020",
                "suite": suite,
                "seed": 3,
                **extra,
                "subjects": [
                    {"id": "s10", "model": "runs/small/ckpt/step-000010"},
                    {"id": "s20", "model": str(home / "runs/small/ckpt/step-000020")},
                ],
            }
        )
    )
    return path


@pytest.mark.slow
@pytest.mark.parametrize("suite,extra", [("ppl", {"max_items": 40}), ("zoo", {"max_items": 4})])
def test_eval_outputs_match_the_schema_and_repeat_exactly(trained, suite, extra):
    spec = _spec(trained, suite, **extra)
    progress = trained / f"progress-{suite}.jsonl"
    first = run_tinyllm(trained, "eval", "--spec", str(spec), "--progress", str(progress))
    assert first.returncode == 0, first.stderr
    _check_counts(trained, suite, extra["max_items"], [json.loads(x) for x in progress.read_text().splitlines()])
    out = trained / "evals" / suite / "small-000020"
    files = {name: (out / name).read_bytes() for name in ("results.jsonl", "summary.json")}
    schema = json.loads(render(EvalSummary))
    summary = json.loads(files["summary.json"])
    assert schema_errors(summary, schema) == []
    line_schema = {**schema["$defs"]["EvalResult"], "$defs": schema["$defs"]}
    lines = [json.loads(line) for line in files["results.jsonl"].decode().splitlines()]
    assert lines and all(schema_errors(line, line_schema) == [] for line in lines)
    assert {line["subject"] for line in lines} == {"s10", "s20"} and {line["step"] for line in lines} == {10, 20}
    result = last_json(first.stdout)
    assert result["results"] == f"evals/{suite}/small-000020/results.jsonl" and result["summary"] == summary
    mtimes = {name: (out / name).stat().st_mtime_ns for name in files}
    again = cli_in_process(trained, "eval", "--spec", str(spec))  # complete outputs of this spec: not rewritten
    assert again.exit_code == 0 and again.stdout == first.stdout
    assert {name: (out / name).stat().st_mtime_ns for name in files} == mtimes
    (out / "complete.json").unlink()  # as if killed before the marker: evaluated again, the same bytes
    second = cli_in_process(trained, "eval", "--spec", str(spec))  # the repeat: this process, same bytes
    assert second.exit_code == 0 and second.stdout == first.stdout
    assert {name: (out / name).read_bytes() for name in files} == files
    assert (out / "complete.json").is_file()
    if suite == "ppl":
        m = summary["metrics"]
        assert m["s20"]["heldout/loss"] < m["s10"]["heldout/loss"]  # more training, lower held-out loss
        assert m["s20"]["heldout/ppl"] == pytest.approx(math.exp(m["s20"]["heldout/loss"]))
    else:
        assert {line["task"] for line in lines} == {"arithmetic", "capitals", "opposites", "sounds"}


def _check_counts(home, suite, max_items, lines):
    """The progress lines count the whole suite (both subjects, every task) in units it names."""
    from tinyllm.corpus import open_corpus
    from tinyllm.evals import zoo_tasks

    if suite == "ppl":
        tokens, _ = open_corpus(home, "default", "heldout")
        block = json.loads((home / "s.json").read_text())["model"]["block_size"]
        per_subject, unit = min(max_items, -(-(len(tokens) - 1) // block)), "windows"
    else:
        per_subject, unit = sum(min(max_items, len(items)) for items in zoo_tasks().values()), "items"
    assert [x["event"] for x in lines[:2]] == ["starting", "ready"]
    counted = [x for x in lines if "done" in x]
    assert counted[0] == {"event": "ready", "done": 0, "of": 2 * per_subject, "unit": unit, "time": counted[0]["time"]}
    assert all(x["of"] == 2 * per_subject and x["unit"] == unit for x in counted)
    done = [x["done"] for x in counted]
    assert done == sorted(done) and per_subject in done and done[-1] == 2 * per_subject  # one line per subject


def test_ppl_is_the_token_weighted_mean_over_all_heldout_tokens(trained):
    """Independent check: one window at a time, every held-out token predicted exactly once."""
    from tinyllm.corpus import open_corpus
    from tinyllm.evals import heldout_nll, load_subject
    from tinyllm.spec import EvalSubject

    model, _ = load_subject(trained, EvalSubject(id="s", model="runs/small/ckpt/step-000020"))
    tokens, _ = open_corpus(trained, "default", "heldout")
    tokens = np.asarray(tokens[:1000])
    total, count = heldout_nll(model, tokens, None, 0)
    assert count == len(tokens) - 1
    T, nll = model.cfg.block_size, 0.0
    with torch.no_grad():
        for s in range(0, len(tokens) - 1, T):
            seq = torch.from_numpy(tokens[s : s + T + 1].astype(np.int64))
            logits, _ = model(seq[None, :-1])
            nll += F.cross_entropy(logits[0], seq[1:], reduction="sum").item()
    assert total == pytest.approx(nll, rel=1e-5)


def test_missing_checkpoint_is_bad_input_and_writes_nothing(trained, tmp_path):
    spec = tmp_path / "e.json"
    spec.write_text(
        json.dumps({"name": "x", "suite": "zoo", "subjects": [{"id": "a", "model": "runs/none/ckpt/step-000001"}]})
    )
    before = tree(trained)
    proc = cli_in_process(trained, "eval", "--spec", str(spec))
    assert proc.exit_code == 2 and "checkpoint not found" in proc.stderr
    assert tree(trained) == before
