"""Generate the post-training demo's data into specs/posttrain/ (deterministic; the files are shipped).

The task is single-digit addition, ``a+b=c`` (100 problems). The pre-training corpus
(addition.txt) holds every problem, shuffled, 60 times: a tiny model half-learns it in a few
hundred steps (posttrain-base: about a quarter right), a larger one longer (the teacher). The
problems are then split once, 70 / 30: post-training (GRPO/OPD prompts, DPO pairs) uses the 70,
held-out validation the other 30, so validation never sees a post-training prompt or pair.

    python bench/posttrain_data.py            # rewrites specs/posttrain/*
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "specs" / "posttrain"
HELDOUT = 30
REPEATS = 60


def wrong_answers(c: int) -> list[int]:
    """Plausible wrong sums: off by one, two, ten (never the right one, never negative)."""
    return [w for w in (c + 1, c - 1, c + 2, c - 2, c + 10) if w >= 0 and w != c]


def main(out: Path = OUT) -> None:
    rng = random.Random(20261201)
    problems = [(a, b) for a in range(10) for b in range(10)]
    lines = []
    for _ in range(REPEATS):
        rng.shuffle(problems)
        lines += [f"{a}+{b}={a + b}\n" for a, b in problems]
    out.mkdir(parents=True, exist_ok=True)
    (out / "addition.txt").write_text("".join(lines))
    problems = sorted(problems)
    rng.shuffle(problems)
    held, train = problems[:HELDOUT], problems[HELDOUT:]

    def jsonl(name, rows):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    jsonl("train-prompts.jsonl", [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in train])
    jsonl("val-prompts.jsonl", [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in held])
    jsonl("train-pairs.jsonl", [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(w)}
                                for a, b in train for w in rng.sample(wrong_answers(a + b), 3)])
    jsonl("val-pairs.jsonl", [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(w)}
                              for a, b in held for w in rng.sample(wrong_answers(a + b), 2)])
    print(f"wrote {out}: corpus {len(lines)} lines; {len(train)} post-training and {HELDOUT} held-out problems",
          file=sys.stderr)


if __name__ == "__main__":
    main()
