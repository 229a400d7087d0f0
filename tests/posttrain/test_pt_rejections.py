"""Every post-training config rejection: exit 2, one line naming the problem, nothing written."""

import json

import pytest

from pt_helpers import DPO_VAL, GEN_VAL, MODEL, RL, cli_train, spec, write_jsonl

RL_NO_ANSWER = {**RL, "data": {"path": "prompts.jsonl", "prompt_column": "q"}}


def corrupt_base(home):
    f = home / "runs/base/ckpt/step-000003/model.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, wrong checksum
    f.write_bytes(bytes(data))


def wrong_tokenizer_teacher(home):
    """A teacher whose vocabulary differs (vocab 320): trained in place as run 'wide'."""
    from pt_helpers import BASE, train_inprocess

    train_inprocess(home, {**BASE, "name": "wide", "steps": 1, "model": {**MODEL, "vocab_size": 320}})


def overlapping_pairs(home):
    rows = [json.loads(x) for x in (home / "pairs.jsonl").read_text().splitlines()]
    write_jsonl(home / "val-pairs.jsonl", rows[3:5])


def shared_prompt(home):
    rows = [json.loads(x) for x in (home / "prompts.jsonl").read_text().splitlines()]
    write_jsonl(home / "val-prompts.jsonl", rows[:1] + [{"q": "9+9=", "a": "18"}])


CASES = {
    "dpo without ref.build_ref": (
        lambda h: None,
        {**spec("dpo"), "ref": {"build_ref": False}},
        "requires ref.build_ref",
    ),
    "dpo without ref block": (
        lambda h: None,
        {k: v for k, v in spec("dpo").items() if k != "ref"},
        "requires ref.build_ref",
    ),
    "dpo without init_from": (lambda h: None, {**spec("dpo"), "init_from": None}, "'dpo' requires init_from"),
    "grpo without init_from": (lambda h: None, {**spec("grpo"), "init_from": None}, "'grpo' requires init_from"),
    "opd without teacher": (lambda h: None, {**spec("opd"), "teacher": None}, "'opd' requires teacher"),
    "dpo without its block": (
        lambda h: None,
        {k: v for k, v in spec("dpo").items() if k != "dpo"},
        "requires the dpo block",
    ),
    "every_steps not divisible by n_mini": (
        lambda h: None,
        spec("grpo", {**GEN_VAL, "every_steps": 3}),
        "divisible by rl.n_mini",
    ),
    "answer reward without response column": (
        lambda h: None,
        spec("grpo", rl=RL_NO_ANSWER),
        "require rl.data.response_column",
    ),
    "inherited answer reward without response column": (
        lambda h: None,
        spec("grpo", {**GEN_VAL, "data": {"path": "val-prompts.jsonl", "prompt_column": "q"}}),
        "require validation.data.response_column",
    ),
    "same prompts file": (
        lambda h: None,
        spec("grpo", {**GEN_VAL, "data": {**GEN_VAL["data"], "path": "prompts.jsonl"}}),
        "is the training prompts file",
    ),
    "same pairs file": (
        lambda h: None,
        spec("dpo", {**DPO_VAL, "data": {"path": "pairs.jsonl"}}),
        "is the training pairs file",
    ),
    "overlapping pairs": (overlapping_pairs, spec("dpo", DPO_VAL), "share 4 pair member(s)"),
    "shared held-out prompt": (shared_prompt, spec("grpo", GEN_VAL), "share 1 prompt(s)"),
    "dpo validation with gradient accumulation": (
        lambda h: None,
        spec("dpo", DPO_VAL, grad_accum_steps=2),
        "rejects validation with gradient accumulation",
    ),
    "missing init_from": (
        lambda h: None,
        spec("grpo", init_from="nobody@7"),
        "init_from checkpoint 'nobody@7' not found",
    ),
    "corrupt init_from": (corrupt_base, spec("dpo"), "fails its sha256 checksum"),
    "init_from of another architecture": (
        lambda h: None,
        spec("dpo", model={**MODEL, "n_embd": 32}),
        "another architecture",
    ),
    "teacher tokenizer differs": (wrong_tokenizer_teacher, spec("opd", teacher="wide@1"), "another tokenizer"),
    "missing teacher": (lambda h: None, spec("opd", teacher="runs/none"), "teacher checkpoint 'runs/none' not found"),
    "missing pairs file": (
        lambda h: None,
        spec("dpo", dpo={"data": {"path": "nope.jsonl"}}),
        "dpo.data file not found",
    ),
    "pair too long for the context": (
        lambda h: write_jsonl(h / "pairs.jsonl", [{"prompt": "x" * 20, "chosen": "a", "rejected": "b"}]),
        spec("dpo"),
        "more than block_size + 1",
    ),
    "unknown reward": (lambda h: None, spec("grpo", rl={**RL, "reward": ["bleu"]}), "unknown reward"),
    "grpo without reward": (lambda h: None, spec("grpo", rl={**RL, "reward": []}), "requires rl.reward"),
    "rl block with dpo": (lambda h: None, spec("dpo", rl=RL), "the rl block applies to objective grpo or opd"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rejected_before_any_work(home, case):
    prepare, bad, message = CASES[case]
    prepare(home)
    runs_before = sorted(p.name for p in (home / "runs").iterdir())
    result = cli_train(home, bad)
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("tinyllm: ") and message in lines[0], lines
    assert sorted(p.name for p in (home / "runs").iterdir()) == runs_before  # nothing written
