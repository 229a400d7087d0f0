"""One typed request, built once from the spec (app/requests.py): ``ctl train``'s process parses a spec once,
and the workflow run in that process (on every replay) and ctl's checks use that parse; the workflow of
another process parses the recorded input once there (tinyllm/trainer_spec.py ``parse_run_spec``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import app
import workflows
from engine import NonRetryableError
from tinyllm import trainer_spec
from tinyllm.spec import SpecError, TrainSpec
from tinyllm.trainer_spec import CustomTrainSpec, has_trainer, trainer_of

TINY = {
    "name": "once",
    "steps": 4,
    "eval_every": 2,
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
}


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each parse from scratch of a run spec in this process (a tinyllm spec or one naming its trainer)."""
    calls: list[str] = []
    parse_train, parse = trainer_spec.parse_train_spec, trainer_spec._parse
    monkeypatch.setattr(trainer_spec, "_PARSED", {})
    monkeypatch.setattr(trainer_spec, "parse_train_spec", lambda raw: calls.append("tinyllm") or parse_train(raw))
    monkeypatch.setattr(trainer_spec, "_parse", lambda *a: calls.append("custom") or parse(*a))
    return calls


def _recorded(request: app.TrainRequest) -> dict:
    """The spec as the history records it (the workflow's input read back from JSON)."""
    return json.loads(request.input.model_dump_json())["spec"]


def test_a_tinyllm_spec_is_parsed_once_in_ctls_process(tmp_path: Path, parses: list[str]) -> None:
    path = tmp_path / "once.json"
    path.write_text(json.dumps(TINY))
    request = app.train_request(str(path), [])
    assert isinstance(request.spec, TrainSpec) and request.name == "once" and request.workflow_id == "train/once"
    for _ in range(3):  # the workflow run in this process: its first run and two replays
        assert workflows.validate_spec(_recorded(request)) is request.spec
    assert parses == ["tinyllm"]


def test_a_spec_naming_its_trainer_is_parsed_once_too(
    tmp_path: Path, parses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "steps": 4, "trainer": {"command": ["python", "train.py"]}}))
    request = app.train_request(str(path), None)
    assert isinstance(request.spec, CustomTrainSpec)
    assert request.spec.trainer.cwd == str(tmp_path.resolve()) == _recorded(request)["trainer"]["cwd"]  # made absolute
    assert workflows.validate_spec(_recorded(request)) is request.spec
    assert parses == ["custom"]


def test_a_bad_spec_is_refused_every_time_and_nothing_is_kept(parses: list[str]) -> None:
    bad = {**TINY, "model": {"n_head": 3, "n_embd": 16}}  # the one check of n_embd % n_head: tinyllm/spec.py
    for _ in range(2):
        with pytest.raises(SpecError, match="must be a multiple of n_head"):
            trainer_spec.parse_run_spec(bad)
    assert parses == ["tinyllm", "tinyllm"] and trainer_spec._PARSED == {}


def test_the_workflow_still_checks_what_it_receives(parses: list[str]) -> None:
    """A spec started without ctl (engine.start) is checked by the workflow: the cheap check on the parse."""
    with pytest.raises(NonRetryableError, match="segments"):
        workflows.validate_spec({**TINY, "steps": 100_000, "eval_every": 1})


def test_one_answer_to_does_this_spec_name_its_own_trainer() -> None:
    assert has_trainer({"trainer": {"command": ["x"]}}) and not has_trainer(TINY) and not has_trainer([1])
    assert trainer_of({"trainer": {"command": ["x"]}}) == {"command": ["x"]}
    assert trainer_of(TINY) is None and trainer_of({"trainer": None}) is None
