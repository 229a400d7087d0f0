"""Generate the post-training demo's data into specs/posttrain/ (deterministic; the files are shipped).

The task is reversing a two-digit string, ``47=74`` (100 strings ``00``..``99``). They are split
once, 70 / 30: the pre-training corpus (reverse.txt: 8000 lines drawn from the 70) and all
post-training data (GRPO/OPD prompts, DPO pairs) use the 70; held-out validation uses the other 30,
which appear nowhere else, not even in pre-training. So a held-out gain is a gain in the skill
(read the digits back in reverse order), not a memorised answer. The corpus is noisy: each answer
digit is a random digit with probability SLIP (0.3), so a model that imitates it perfectly samples
the exact answer only about half the time; the reward (exact match) and the preference pairs ask
for the clean answer. The small base (posttrain-base, weight_decay 1.0) learns the skill on every
seed tried, to about half (the slips cap it: docs/posttrain.md). The larger teacher (posttrain-teacher) trains longer on the same lines without the
slips (reverse-clean.txt, the curated copy of the corpus), so it is sharp where the base is noisy.

DPO pairs: the right reversal is chosen; rejected are the unreversed copy (the typical mistake;
not for palindromes like ``44``) and a one-digit slip of the answer.

    python bench/posttrain_data.py            # rewrites specs/posttrain/*
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "specs" / "posttrain"
HELDOUT = 30
CORPUS_LINES = 8000
SLIP = 0.3  # chance that a corpus answer digit is replaced by a random digit (a noisy corpus)
OLD_FILES = ("addition.txt",)  # the previous demo's corpus


def reverse(s: str) -> str:
    return s[::-1]


def rejected(s: str, rng: random.Random) -> list[str]:
    """Wrong answers to ``s=``: the unreversed copy (if it differs) and one slipped digit."""
    right = reverse(s)
    out = [s] if s != right else []
    i = rng.randrange(2)
    slip = right[:i] + rng.choice([d for d in "0123456789" if d != right[i]]) + right[i + 1 :]
    if slip not in out:
        out.append(slip)
    return out


def main(out: Path = OUT) -> None:
    rng = random.Random(20261201)
    strings = [f"{a}{b}" for a in range(10) for b in range(10)]
    rng.shuffle(strings)
    held, train = strings[:HELDOUT], strings[HELDOUT:]

    def noisy(answer: str) -> str:
        return "".join(rng.choice("0123456789") if rng.random() < SLIP else d for d in answer)

    drawn = []  # (string, its answer with slips), drawn line by line
    for _ in range(CORPUS_LINES):
        s = rng.choice(train)
        drawn.append((s, noisy(reverse(s))))
    lines = [f"{s}={answer}\n" for s, answer in drawn]
    out.mkdir(parents=True, exist_ok=True)
    for old in OLD_FILES:
        (out / old).unlink(missing_ok=True)
    (out / "reverse.txt").write_text("".join(lines))
    (out / "reverse-clean.txt").write_text("".join(f"{s}={reverse(s)}\n" for s, _ in drawn))

    def jsonl(name, rows):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    jsonl("train-prompts.jsonl", [{"question": f"{s}=", "answer": reverse(s)} for s in train])
    jsonl("val-prompts.jsonl", [{"question": f"{s}=", "answer": reverse(s)} for s in held])
    jsonl(
        "train-pairs.jsonl",
        [{"prompt": f"{s}=", "chosen": reverse(s), "rejected": w} for s in train for w in rejected(s, rng)],
    )
    jsonl(
        "val-pairs.jsonl",
        [{"prompt": f"{s}=", "chosen": reverse(s), "rejected": w} for s in held for w in rejected(s, rng)],
    )
    assert not {f"{s}=" for s in held} & {line.split("=")[0] + "=" for line in lines}, "held-out string in the corpus"
    print(
        f"wrote {out}: corpus {len(lines)} lines of {len(train)} strings; {HELDOUT} held-out strings", file=sys.stderr
    )


if __name__ == "__main__":
    main()
