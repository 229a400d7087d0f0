"""The char tokenizer: a corpus's vocabulary built once and stored with it, the model's vocab_size
following it, every text of the run encoded with it, the checkpoint pinning it, and bit-exact resume
of nanoGPT's recipe (specs/nanogpt-char.json) after a SIGKILL."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from tl_helpers import REPO, cli_in_process, last_json, run_tinyllm, start_tinyllm, wait_for_progress

CHAR_SPEC = REPO / "specs" / "nanogpt-char.json"
CHAR_CORPUS = REPO / "specs" / "corpus-char.json"


def char_spec(path: Path, **changes) -> Path:
    """specs/nanogpt-char.json cut to a few steps (the recipe's shape, batch and optimizer unchanged)."""
    data = json.loads(CHAR_SPEC.read_text())
    data.update({"steps": 30, "checkpoint_every": 10, "log_every": 10, "eval_every": 0, "threads": 1, **changes})
    path.write_text(json.dumps(data))
    return path


def build(home: Path, **spec) -> dict:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    return build_corpus(CorpusSpec(**spec), home)


@pytest.fixture(scope="module")
def char_corpora(tmp_path_factory) -> Path:
    """corpora/char (specs/corpus-char.json: the built-in text at character level) and corpora/default."""
    from tinyllm.spec import load_corpus_spec

    home = tmp_path_factory.mktemp("char-corpus")
    build(home, **load_corpus_spec(CHAR_CORPUS).model_dump())
    build(home)
    return home / "corpora"


@pytest.fixture
def chome(tmp_path, char_corpora) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    shutil.copytree(char_corpora, h / "corpora")
    return h


# -- the tokenizer ----------------------------------------------------------------------------


def test_vocabulary_is_the_sorted_characters_and_round_trips():
    from tinyllm import tokenizer

    tok = tokenizer.build_vocab("hello wörld\n")
    assert tok.chars == "\n dehlorwö" and tok.vocab_size == 10
    ids = tok.encode("wörld")
    assert ids.dtype == np.uint16 and list(ids) == [8, 9, 7, 5, 2]  # ö is one token, not two bytes
    assert tok.decode(ids) == "wörld" and tok.decode([99]) == "\ufffd"
    assert tokenizer.from_identity(tok.identity()) == tok and tokenizer.from_identity(None) is tokenizer.BYTE
    with pytest.raises(tokenizer.UnknownCharacter, match=r"prompt: character 'x' \(U\+0078\) is not in the vocabulary"):
        tok.encode("hex", "prompt")
    damaged = {**tok.identity(), "chars": "\n dehlorwx"}
    with pytest.raises(ValueError, match="damaged"):
        tokenizer.from_identity(damaged)


def test_char_corpus_stores_its_vocabulary_and_splits_in_characters(tmp_path):
    home = tmp_path
    (home / "a.txt").write_text("déjà vu " * 40, encoding="utf-8")
    build(home, name="c", sources=["a.txt"], tokenizer="char", heldout_fraction=0.25)
    meta = json.loads((home / "corpora/c/meta.json").read_text())
    assert meta["tokenizer"] == "char" and meta["vocab"] == "".join(sorted(set("déjà vu ")))
    assert meta["vocab_size"] == 7 and meta["heldout"]["unit"] == "characters"
    n = len("déjà vu ") * 40
    assert meta["tokens"] == int(n * 0.75) and meta["heldout_tokens"] == n - int(n * 0.75)
    # the byte corpus of the same text is another corpus (its checksum differs): never silently replaced
    from tinyllm.spec import SpecError

    with pytest.raises(SpecError, match="another tokenizer"):
        build(home, name="c", sources=["a.txt"], heldout_fraction=0.25)


def test_char_corpus_of_non_utf8_text_is_one_clear_error(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"abc\xffdef" * 10)
    proc = cli_in_process(
        tmp_path, "corpus", "--spec", str(_json(tmp_path / "c.json", name="bad", sources=["bad.txt"], tokenizer="char"))
    )
    assert proc.exit_code == 2, proc.output
    assert "the char tokenizer reads UTF-8 text; the source text is not UTF-8 (byte 0xff at offset 3)" in proc.stderr
    assert "Traceback" not in proc.stderr


def _json(path: Path, **data) -> Path:
    path.write_text(json.dumps(data))
    return path


# -- training ----------------------------------------------------------------------------------


def test_vocab_size_follows_the_corpus_and_a_too_small_one_is_refused(chome, tmp_path):
    from tinyllm.sinks.metrics import Reporter
    from tinyllm.spec import load_train_spec
    from tinyllm.trainer import Trainer

    trainer = Trainer(load_train_spec(char_spec(tmp_path / "s.json", steps=1)), chome)
    trainer.run(reporter=Reporter([]))
    assert trainer.spec.model.vocab_size == 69 and tuple(trainer.model.wte.weight.shape) == (69, 128)
    manifest = json.loads((chome / "runs/nanogpt-char/ckpt/step-000001/manifest.json").read_text())
    assert (
        manifest["meta"]["tokenizer"]["kind"] == "char" and manifest["meta"]["trajectory"]["model"]["vocab_size"] == 69
    )
    assert int(trainer.data.batch(0)[0].max()) < 69

    small = char_spec(
        tmp_path / "small.json", name="small", model={**json.loads(CHAR_SPEC.read_text())["model"], "vocab_size": 60}
    )
    proc = cli_in_process(chome, "train", "--spec", str(small))
    assert proc.exit_code == 2
    assert (
        "invalid train spec: model.vocab_size 60 is smaller than the char tokenizer (69 characters" in proc.stderr
        and "omit it (it follows the tokenizer) or give at least 69" in proc.stderr
    )
    byte = char_spec(
        tmp_path / "byte.json",
        name="byte",
        corpus="default",
        model={**json.loads(CHAR_SPEC.read_text())["model"], "vocab_size": 100},
    )
    proc = cli_in_process(chome, "train", "--spec", str(byte))
    assert proc.exit_code == 2 and "model.vocab_size 100 is smaller than the byte tokenizer (vocab 256)" in proc.stderr
    assert not (chome / "runs" / "small").exists() or not any((chome / "runs" / "small").rglob("step-*"))


@pytest.fixture(scope="module")
def char_reference(tmp_path_factory, char_corpora) -> dict:
    """One uninterrupted run of the cut nanoGPT recipe at character level."""
    home = tmp_path_factory.mktemp("char-reference")
    shutil.copytree(char_corpora, home / "corpora")
    spec = char_spec(home / "spec.json")
    proc = run_tinyllm(home, "train", "--spec", str(spec))
    assert proc.returncode == 0, proc.stderr
    return {"result": last_json(proc.stdout), "home": home}


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_equal_at_character_level(chome, char_reference, tmp_path):
    spec = char_spec(tmp_path / "spec.json")
    progress = tmp_path / "progress-1.jsonl"
    proc = start_tinyllm(chome, "train", "--spec", str(spec), "--progress", str(progress))
    wait_for_progress(progress, 10, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before the kill; the spec is too short"
    resumed = run_tinyllm(chome, "train", "--spec", str(spec))
    assert resumed.returncode == 0, resumed.stderr
    result = last_json(resumed.stdout)
    assert result["resumed_from"] is not None and result["steps"] == 30
    assert result["final_loss_hex"] == char_reference["result"]["final_loss_hex"]
    assert result["digest"] == char_reference["result"]["digest"]


@pytest.mark.slow
def test_resume_against_another_vocabulary_is_refused(chome, char_reference, tmp_path):
    shutil.copytree(char_reference["home"] / "runs", chome / "runs")
    old_vocab = json.loads((chome / "corpora/char/meta.json").read_text())["vocab"]
    shutil.rmtree(chome / "corpora" / "char")  # the same corpus name, rebuilt from other text
    # as many characters (69: the same vocab_size, the same trajectory fields), one of them another
    (chome / "other.txt").write_text((old_vocab.replace("8", "9") + "\n") * 50)
    build(chome, name="char", sources=["other.txt"], tokenizer="char")
    proc = cli_in_process(chome, "train", "--spec", str(char_spec(tmp_path / "s.json", steps=40)))
    assert proc.exit_code == 2
    assert "was trained with the char tokenizer (69 characters, vocabulary sha256 f9c944dc68f4" in proc.stderr
    assert "but corpus 'char' now has the char tokenizer (69 characters, vocabulary sha256 " in proc.stderr
    assert (chome / "runs/nanogpt-char/ckpt/LATEST").read_text().strip() == "step-000030"
    # a byte corpus under the name: refused the same way
    shutil.rmtree(chome / "corpora" / "char")
    build(chome, name="char")
    proc = cli_in_process(chome, "train", "--spec", str(char_spec(tmp_path / "s.json", steps=40)))
    assert proc.exit_code == 2 and "but corpus 'char' now has the byte tokenizer (vocab 256)" in proc.stderr


def test_generation_samples_in_the_runs_vocabulary():
    import torch

    from tinyllm import tokenizer
    from tinyllm.model import GPT
    from tinyllm.spec import ModelConfig
    from tinyllm.validation.generation import generate

    tok = tokenizer.build_vocab("ab\n")
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=3, block_size=16, n_layer=1, n_head=1, n_embd=8)).eval()
    sampling = {"repetition_penalty": 1.0, "temperature": 1.0, "top_k": None, "top_p": 1.0, "max_tokens": 12}
    with torch.no_grad():
        out = generate(model, ["ab", "ba"], [1, 2], block_size=16, sampling=sampling, tok=tok)
    assert all(set(t) <= {"a", "b"} for t in out) and any(len(t) < 12 for t in out)  # stops at its newline (id 0)


# -- evaluation and held-out validation ----------------------------------------------------------


def _eval_spec(path: Path, suite: str, corpus: str, model: str = "runs/nanogpt-char/ckpt/step-000030") -> Path:
    return _json(path, name="e", suite=suite, corpus=corpus, max_items=4, subjects=[{"id": "c", "model": model}])


@pytest.mark.slow
def test_ppl_encodes_with_the_subjects_vocabulary_and_refuses_another(chome, char_reference, tmp_path):
    shutil.copytree(char_reference["home"] / "runs", chome / "runs")
    ok = cli_in_process(chome, "eval", "--spec", str(_eval_spec(tmp_path / "ok.json", "ppl", "char")))
    assert ok.exit_code == 0, ok.output
    loss = last_json(ok.stdout)["summary"]["metrics"]["c"]["heldout/loss"]
    assert 0 < loss < np.log(69) + 0.5  # a char model on its own held-out characters
    bad = cli_in_process(chome, "eval", "--spec", str(_eval_spec(tmp_path / "bad.json", "ppl", "default")))
    assert bad.exit_code == 2
    assert "subject 'c' was trained with the char tokenizer (69 characters" in bad.stderr
    assert "corpus 'default' holds ids of the byte tokenizer (vocab 256)" in bad.stderr


def test_zoo_with_a_character_outside_the_vocabulary_is_refused_before_work(chome, tmp_path):
    (chome / "lower.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    build(chome, name="lower", sources=["lower.txt"], tokenizer="char")
    spec = char_spec(tmp_path / "s.json", name="lower", corpus="lower", steps=1)
    assert cli_in_process(chome, "train", "--spec", str(spec)).exit_code == 0
    proc = cli_in_process(
        chome, "eval", "--spec", str(_eval_spec(tmp_path / "z.json", "zoo", "lower", "runs/lower/ckpt/step-000001"))
    )
    assert proc.exit_code == 2, proc.output
    assert "for subject 'c': character" in proc.stderr and "is not in the vocabulary (char tokenizer (28" in proc.stderr
    assert "Traceback" not in proc.stderr and not (chome / "evals").exists()


def test_validation_text_outside_the_vocabulary_is_refused_at_start(chome, tmp_path):
    (chome / "held.txt").write_text("Zebras quietly graze beyond the river bank at dawn.\n" * 3 + "€\n")
    validation = {"enabled": True, "objective": "lm", "every_steps": 5, "data": {"path": "held.txt"}}
    spec = char_spec(tmp_path / "v.json", name="v", validation=validation, steps=5)
    proc = cli_in_process(chome, "train", "--spec", str(spec))
    assert proc.exit_code == 2, proc.output
    assert "character '€' (U+20AC) is not in the vocabulary (char tokenizer (69 characters" in proc.stderr
    assert not (chome / "runs" / "v" / "ckpt").exists() or not any((chome / "runs" / "v" / "ckpt").iterdir())


def test_validation_of_a_char_run_uses_its_vocabulary(chome, tmp_path):
    from tinyllm import tokenizer
    from tinyllm.sinks.metrics import Reporter
    from tinyllm.spec import load_train_spec
    from tinyllm.trainer import Trainer
    from tinyllm.validation.lm import evaluate_lm
    from tinyllm.validation.isolation import isolated

    validation = {
        "enabled": True,
        "objective": "lm",
        "every_steps": 2,
        "batch_size": 8,
        "data": {"path": "builtin:heldout.txt"},
    }

    class Frames(Reporter):
        def report(self, step, frame):
            frames.append(frame)

    frames: list[dict] = []
    trainer = Trainer(load_train_spec(char_spec(tmp_path / "v.json", name="v", validation=validation, steps=2)), chome)
    trainer.run(reporter=Frames([]))
    val = [f for f in frames if "val/loss" in f]
    assert val, frames
    text = (REPO / "tinyllm/data/validation/heldout.txt").read_text()
    tok = trainer.tok
    assert tok.kind == "char" and val[-1]["val/token_count"] == len(text) - 1
    with isolated(trainer.model):
        again = evaluate_lm(trainer.model, tok.encode(text), block_size=64, batch_size=8)
    assert again["val/loss"] == val[-1]["val/loss"]
    assert tok.encode(text).max() < 69 and tokenizer.encode(text).max() >= 69  # the byte ids would not fit


@pytest.mark.slow
def test_post_training_refuses_a_char_checkpoint(chome, char_reference, tmp_path):
    from tinyllm.objectives.init import load_frozen
    from tinyllm.spec import SpecError

    shutil.copytree(char_reference["home"] / "runs", chome / "runs")
    with pytest.raises(SpecError, match="was trained with the char tokenizer; post-training objectives"):
        load_frozen("nanogpt-char@30", chome, "init_from")
