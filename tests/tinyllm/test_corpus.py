"""Corpus building: user files and globs, built-in text, explicit held-out part, idempotence."""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np
import pytest

from tinyllm.builtin_text import builtin_text, zoo_items
from tinyllm.corpus import HELDOUT_BLOCK, build_corpus, open_corpus, plan_corpus
from tinyllm.spec import CorpusSpec, SpecError

from tl_helpers import run_tinyllm


@pytest.fixture
def texts(tmp_path):
    home = tmp_path / "home"
    (home / "texts").mkdir(parents=True)
    (home / "held").mkdir()
    (home / "texts" / "a.txt").write_text("alpha story. " * 50)
    (home / "texts" / "b.txt").write_text("beta story, ünïcode. " * 50)
    (home / "held" / "h.txt").write_text("HELDOUT-MARKER gamma text. " * 20)
    return home


def test_user_files_with_explicit_heldout_are_disjoint_and_idempotent(texts):
    spec = CorpusSpec(name="mine", sources=["texts/*.txt"], heldout=["held/h.txt"])
    first = build_corpus(spec, texts)
    assert first["built"] is True
    folder = texts / "corpora" / "mine"
    train = (folder / "tokens.bin").read_bytes()
    expected = (texts / "texts/a.txt").read_bytes() + b"\n\n" + (texts / "texts/b.txt").read_bytes()
    assert np.frombuffer(train, dtype="<u2").astype(np.uint8).tobytes() == expected
    held = np.frombuffer((folder / "heldout.bin").read_bytes(), dtype="<u2").astype(np.uint8).tobytes()
    assert held == (texts / "held/h.txt").read_bytes()
    assert b"HELDOUT-MARKER" not in expected
    meta = json.loads((folder / "meta.json").read_text())
    assert [f["path"] for f in meta["source"]["files"]] == ["texts/a.txt", "texts/b.txt"]
    assert meta["heldout"] == {"kind": "files", "files": ["held/h.txt"]}
    assert meta["tokens"] == len(expected) and meta["heldout_tokens"] == len(held)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()}
    second = build_corpus(spec, texts)
    assert second["built"] is False and second["checksum"] == first["checksum"]
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir()} == before


def test_builtin_corpus_tail_is_held_out(tmp_path):
    result = build_corpus(CorpusSpec(heldout_fraction=0.2), tmp_path)
    tokens, meta = open_corpus(tmp_path, "default", "tokens")
    held, _ = open_corpus(tmp_path, "default", "heldout")
    full = builtin_text().encode()
    assert meta["heldout"]["kind"] == "tail" and meta["heldout"]["start"] == len(tokens) == int(len(full) * 0.8)
    assert np.asarray(tokens).astype(np.uint8).tobytes() + np.asarray(held).astype(np.uint8).tobytes() == full
    assert result["tokens"] + result["heldout_tokens"] == len(full)


@pytest.mark.parametrize("tokenizer", ["byte", "char"])
def test_an_interleaved_split_holds_out_every_kth_block_of_every_part_of_the_text(tmp_path, tokenizer):
    """specs/corpus-char.json's split: the built-in text is classic prose, then generated simple English;
    a tail split held out only the easy generated part (held-out ppl below the training loss)."""
    result = build_corpus(CorpusSpec(name="mix", heldout_split="interleaved", tokenizer=tokenizer), tmp_path)
    tokens, meta = open_corpus(tmp_path, "mix", "tokens")
    held, _ = open_corpus(tmp_path, "mix", "heldout")
    assert meta["heldout"] == {
        "kind": "interleaved",
        "block": HELDOUT_BLOCK,
        "every": 10,
        "fraction": 0.1,
        "unit": "characters" if tokenizer == "char" else "bytes",
    }
    full = builtin_text() if tokenizer == "char" else builtin_text().encode()
    decode = (
        (lambda ids: "".join(meta["vocab"][i] for i in np.asarray(ids)))
        if tokenizer == "char"
        else (lambda ids: np.asarray(ids).astype(np.uint8).tobytes())
    )
    train_text, held_text = decode(tokens), decode(held)
    blocks = [full[i : i + HELDOUT_BLOCK] for i in range(0, len(full), HELDOUT_BLOCK)]
    assert held_text == full[:0].join(blocks[5::10]) and len(train_text) + len(held_text) == len(full)
    assert train_text == full[:0].join(b for j, b in enumerate(blocks) if j % 10 != 5)
    classics = (files("tinyllm") / "data" / "classics.txt").read_text(encoding="utf-8")  # the text's first part
    prose = classics if tokenizer == "char" else classics.encode()
    assert full.startswith(prose[:100]) and len(prose) > 10 * HELDOUT_BLOCK
    assert blocks[5] in held_text and blocks[5] in prose and blocks[-7] not in prose  # both parts held out from
    assert any(blocks[j] in held_text for j in range(len(blocks) - 10, len(blocks)))
    again = build_corpus(CorpusSpec(name="mix", heldout_split="interleaved", tokenizer=tokenizer), tmp_path)
    assert again["built"] is False and again["checksum"] == result["checksum"]


def test_the_default_split_keeps_its_checksum():
    """heldout_split's default is not in the checksum: corpora built before it existed stay valid."""
    a = plan_corpus(CorpusSpec(heldout_fraction=0.2), None)[2]["checksum"]
    b = plan_corpus(CorpusSpec(heldout_fraction=0.2, heldout_split="tail"), None)[2]["checksum"]
    assert a == b == "3fcb12d377c26c66a3bfe03ba57bb7ecf3152c8fb2668e48fd5d6e1277c590e6"  # before the field


def test_builtin_text_is_deterministic_and_real_english():
    a, b = builtin_text(), builtin_text()
    assert a == b and 200_000 < len(a.encode()) < 500_000
    assert "Four score and seven years ago" in a and "The capital of France is Paris." in a


def test_shipped_zoo_files_match_their_generator():
    from importlib import resources

    folder = resources.files("tinyllm").joinpath("data/zoo")
    for task, items in zoo_items().items():
        shipped = folder.joinpath(f"{task}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in shipped] == items


def test_overlapping_heldout_is_refused(texts):
    with pytest.raises(SpecError, match="overlap"):
        build_corpus(CorpusSpec(name="bad", sources=["texts/*.txt"], heldout=["texts/a.txt"]), texts)
    assert not (texts / "corpora").exists()


@pytest.mark.slow
def test_cli_refuses_other_sources_for_an_existing_corpus_and_unmatched_globs(texts, tmp_path):
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps({"name": "mine", "sources": ["texts/a.txt"]}))
    ok = run_tinyllm(texts, "corpus", "--spec", str(spec))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.splitlines()[-1])["name"] == "mine"
    tokens_before = (texts / "corpora/mine/tokens.bin").read_bytes()
    spec.write_text(json.dumps({"name": "mine", "sources": ["texts/b.txt"]}))
    bad = run_tinyllm(texts, "corpus", "--spec", str(spec))
    assert bad.returncode == 2 and "already exists" in bad.stderr
    assert (texts / "corpora/mine/tokens.bin").read_bytes() == tokens_before
    spec.write_text(json.dumps({"name": "other", "sources": ["nothing/*.txt"]}))
    none = run_tinyllm(texts, "corpus", "--spec", str(spec))
    assert none.returncode == 2 and "matches no file" in none.stderr
    assert not (texts / "corpora/other").exists()


def test_training_never_reads_the_heldout_part(home, tmp_path):
    """With heldout.bin made unreadable, training still runs: the trainer reads only tokens.bin."""
    from tl_helpers import write_spec

    from tinyllm.sinks.metrics import Reporter
    from tinyllm.spec import load_train_spec
    from tinyllm.trainer import Trainer

    held = home / "corpora/default/heldout.bin"
    held.unlink()
    held.mkdir()  # any attempt to open it as a file would fail
    result = Trainer(load_train_spec(write_spec(tmp_path / "s.json", steps=3)), home).run(reporter=Reporter([]))
    assert result["steps"] == 3 and result["final_loss"] > 0
