"""Spec models: JSON round-trips (hypothesis), rejection of bad specs, schemas in sync."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyllm.schemas import MODELS, render, stale
from tinyllm.spec import EvalSpec, SpecError, TrainSpec, parse_corpus_spec, parse_eval_spec, parse_train_spec

from jsonschema_lite import errors as schema_errors

identifiers = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,30}\Z")
bad_names = st.sampled_from(["", "../x", "a b", "/abs", ".hidden", "-dash", "x/y", "é", "a\nb", "x" * 200])

train_specs = st.builds(
    dict,
    name=identifiers,
    steps=st.integers(1, 10**6),
    seed=st.integers(-(2**40), 2**40),
    eval_every=st.integers(0, 10**5),
    eval_interval_seconds=st.floats(0, 1e5, allow_nan=False),
    checkpoint_every=st.integers(1, 10**5),
    batch_size=st.integers(1, 512),
    lr=st.floats(1e-6, 1.0),
    lr_decay_steps=st.none() | st.integers(1, 10**6),
    model=st.builds(
        dict,
        n_layer=st.integers(1, 8),
        n_head=st.sampled_from([1, 2, 4, 8]),
        dropout=st.floats(0, 0.9),
        bias=st.booleans(),
    ),
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(train_specs)
def test_train_spec_round_trips_through_json(data):
    spec = parse_train_spec(data)
    again = parse_train_spec(json.loads(spec.model_dump_json()))
    assert again == spec
    assert not schema_errors(json.loads(spec.model_dump_json()), json.loads(render(TrainSpec)))


@settings(max_examples=40, deadline=None)
@given(
    name=identifiers,
    tag=st.none() | identifiers,
    suite=st.sampled_from(["ppl", "zoo"]),
    ids=st.lists(identifiers, min_size=1, max_size=4, unique=True),
    seed=st.integers(-(2**31), 2**31),
    max_items=st.none() | st.integers(1, 1000),
)
def test_eval_spec_round_trips_through_json(name, tag, suite, ids, seed, max_items):
    spec = parse_eval_spec(
        {
            "name": name,
            "tag": tag,
            "suite": suite,
            "seed": seed,
            "max_items": max_items,
            "subjects": [{"id": i, "model": f"runs/{name}/ckpt/step-000010"} for i in ids],
        }
    )
    assert parse_eval_spec(json.loads(spec.model_dump_json())) == spec
    assert spec.run == (f"{name}-{tag}" if tag else name)


@settings(max_examples=40, deadline=None)
@given(name=identifiers, sources=st.lists(st.text(min_size=1, max_size=20), max_size=3), fraction=st.floats(0.01, 0.99))
def test_corpus_spec_round_trips_through_json(name, sources, fraction):
    spec = parse_corpus_spec({"name": name, "sources": sources, "heldout_fraction": fraction})
    assert parse_corpus_spec(json.loads(spec.model_dump_json())) == spec


@settings(max_examples=30, deadline=None)
@given(bad_names)
def test_bad_names_are_rejected_everywhere(name):
    with pytest.raises(SpecError, match="name"):
        parse_train_spec({"name": name, "steps": 10})
    with pytest.raises(SpecError, match="name"):
        parse_corpus_spec({"name": name})
    with pytest.raises(SpecError):
        parse_eval_spec({"name": name, "suite": "ppl", "subjects": [{"id": "a", "model": "m"}]})


@pytest.mark.parametrize(
    "changes,where",
    [
        ({"steps": 0}, "steps"),
        ({"steps": -1}, "steps"),
        ({"eval_every": -1}, "eval_every"),
        ({"eval_interval_seconds": -0.5}, "eval_interval_seconds"),
        ({"lr": -1e-3}, "lr"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"threads": 0}, "threads"),
        ({"unknown": 1}, "unknown"),
        ({"model": {"dropout": 1.5}}, "model.dropout"),
        ({"model": {"n_layr": 2}}, "model.n_layr"),
        ({"steps": "ten"}, "steps"),
    ],
)
def test_bad_train_specs_name_the_field(changes, where):
    with pytest.raises(SpecError) as err:
        parse_train_spec({"name": "ok", "steps": 10, **changes})
    assert where in str(err.value) and "\n" not in str(err.value)


def test_missing_name_and_steps_are_rejected():
    for data in ({"steps": 10}, {"name": "x"}, [], "spec"):
        with pytest.raises(SpecError):
            parse_train_spec(data)


def test_bad_eval_specs():
    base = {"name": "e", "suite": "ppl", "subjects": [{"id": "a", "model": "m"}]}
    for bad in (
        {"suite": "mmlu"},
        {"subjects": []},
        {"subjects": [{"id": "a", "model": "m"}, {"id": "a", "model": "n"}]},
        {"max_items": 0},
        {"tag": "a/b"},
        {"extra": True},
    ):
        with pytest.raises(SpecError):
            parse_eval_spec({**base, **bad})


def test_schema_files_are_in_sync_with_the_models():
    assert stale() == [], "run: python -m tinyllm.schemas --write"


def test_schema_check_detects_a_stale_file(tmp_path):
    for name, model in MODELS.items():
        (tmp_path / name).write_text(render(model))
    assert stale(tmp_path) == []
    (tmp_path / "eval-spec.schema.json").write_text(render(EvalSpec).replace('"ppl"', '"pp1"'))
    assert stale(tmp_path) == ["eval-spec.schema.json"]


def test_shipped_specs_are_valid():
    """Every spec under specs/ parses (a bad one raises SpecError), and the README's tiny.json is there."""
    from pathlib import Path

    parsed = {}
    for path in sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.json")):
        data = json.loads(path.read_text())
        if "suite" in data:
            parsed[path.name] = parse_eval_spec(data)
        elif "steps" in data:
            parsed[path.name] = parse_train_spec(data)
        else:
            parsed[path.name] = parse_corpus_spec(data)
    assert parsed["tiny.json"].name == "tiny" and parsed["tiny.json"].eval_every > 0
