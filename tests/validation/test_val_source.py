"""The explicit held-out source: parsing errors, identity, and disjointness from the training data."""

import json
from pathlib import Path

import pytest

from tinyllm import tokenizer
from tinyllm.validation_config import ValidationConfig
from tinyllm.validation.errors import ValidationDataError
from tinyllm.validation.source import BUILTIN_DIR, check_disjoint, load_source, verify_unchanged

CLASSICS = (Path(__file__).resolve().parents[2] / "tinyllm" / "data" / "classics.txt").read_text()


def lm(path):
    return ValidationConfig(enabled=True, data={"path": str(path)})


def gen(path, rcol="answer"):
    return ValidationConfig(
        enabled=True,
        objective="generation",
        reward=["nonempty"] + (["exact_match"] if rcol else []),
        data={"path": str(path), "prompt_column": "question", "response_column": rcol},
    )


def test_shipped_sources_load_and_are_disjoint_from_the_builtin_training_text():
    h = load_source(lm("builtin:heldout.txt"), "/nonexistent-home")
    p = load_source(gen("builtin:prompts.jsonl"), "/nonexistent-home")
    assert len(h.text) > 1000 and len(p.prompts) == 8 and p.prompts[0]["response"] == "4"
    for s in (h, p):
        check_disjoint(s, tokenizer.encode(CLASSICS))


def test_relative_path_is_under_home(tmp_path):
    (tmp_path / "h.txt").write_text("some held-out text\n")
    assert load_source(lm("h.txt"), tmp_path).path == tmp_path / "h.txt"


def test_overlap_with_training_is_rejected(tmp_path):
    line = CLASSICS.splitlines()[2][:80]
    (tmp_path / "h.txt").write_text("an original line that is long enough to be checked\n" + line + "\n")
    with pytest.raises(ValidationDataError, match="overlaps the training corpus"):
        check_disjoint(load_source(lm("h.txt"), tmp_path), tokenizer.encode(CLASSICS))


def test_training_text_used_as_prompts_is_rejected(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"question": CLASSICS[100:160], "answer": "x"}) + "\n")
    with pytest.raises(ValidationDataError, match="overlaps"):
        check_disjoint(load_source(gen("p.jsonl"), tmp_path), tokenizer.encode(CLASSICS))


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "not found"),
        (b"\xff\xfe bad", "not UTF-8"),
        (b'{"question": "q"}\nnot json\n', "line 2 is not valid JSON"),
        (b"[1, 2]\n", "not a JSON object"),
        (b'{"prompt": "q"}\n', "column 'question' missing"),
        (b'{"question": "q", "answer": 3}\n', "'answer' is not a string"),
        (b"\n\n", "no prompts"),
    ],
)
def test_bad_prompt_files(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "p.jsonl").write_bytes(content)
    with pytest.raises(ValidationDataError, match=needle):
        load_source(gen("p.jsonl"), tmp_path)


def test_null_response_allowed_and_changed_file_detected(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"question": "q1", "answer": None}) + "\n")
    s = load_source(gen("p.jsonl"), tmp_path)
    assert s.prompts == [{"prompt": "q1", "response": None}]
    f.write_text(json.dumps({"question": "q2", "answer": None}) + "\n")
    with pytest.raises(ValidationDataError, match="changed"):
        verify_unchanged(load_source(gen("p.jsonl"), tmp_path), s.identity(), 3)


def test_builtin_dir_is_in_the_package():
    assert (BUILTIN_DIR / "heldout.txt").is_file() and "tinyllm" in str(BUILTIN_DIR)
