"""The built-in corpus source: works offline on a fresh machine, identical on every machine.

Two parts, concatenated: ``data/classics.txt`` (public-domain English text shipped in the
package) and about 300 KB of simple English generated from small word tables by a fixed
pseudo-random generator (splitmix64, so no library's RNG version can change a byte):
short stories and plain facts (capitals, opposites, animal sounds, small sums). The zoo eval
tasks (``data/zoo/*.jsonl``) ask about the same facts, so a trained model can beat chance.
"""

from __future__ import annotations

from importlib import resources

_MASK = (1 << 64) - 1

NAMES = [
    "Anna",
    "Ben",
    "Clara",
    "Dan",
    "Emma",
    "Finn",
    "Grace",
    "Hugo",
    "Ivy",
    "Jack",
    "Lily",
    "Max",
    "Nora",
    "Omar",
    "Rosa",
    "Sam",
    "Tom",
    "Zoe",
]
ANIMALS = ["cat", "dog", "fox", "bird", "rabbit", "bear", "duck", "mouse", "horse", "frog", "owl", "sheep"]
ADJECTIVES = [
    "little",
    "happy",
    "brave",
    "curious",
    "sleepy",
    "kind",
    "clever",
    "shy",
    "quick",
    "quiet",
    "big",
    "funny",
]
PLACES = [
    "small house",
    "big forest",
    "green valley",
    "quiet village",
    "old farm",
    "tall tree",
    "sunny garden",
    "red barn",
]
FEATURES = ["river", "hill", "lake", "sea", "road", "bridge", "mountain", "field"]
ACTIVITIES = [
    "sing songs",
    "read books",
    "play ball",
    "pick flowers",
    "watch the clouds",
    "swim in the water",
    "build small towers",
    "run in the grass",
]
OBJECTS = ["shiny stone", "red ball", "blue hat", "little box", "old key", "golden leaf", "lost shoe", "paper boat"]
FEELINGS = ["happy", "surprised", "proud", "excited", "glad", "calm"]
CAPITALS = {
    "France": "Paris",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Canada": "Ottawa",
    "Norway": "Oslo",
    "Greece": "Athens",
    "Poland": "Warsaw",
}
OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "up": "down",
    "day": "night",
    "fast": "slow",
    "happy": "sad",
    "old": "new",
    "open": "closed",
    "light": "dark",
    "wet": "dry",
    "early": "late",
    "full": "empty",
}
SOUNDS = {
    "cat": "meow",
    "dog": "woof",
    "cow": "moo",
    "duck": "quack",
    "sheep": "baa",
    "owl": "hoot",
    "horse": "neigh",
    "frog": "croak",
    "lion": "roar",
    "mouse": "squeak",
    "bee": "buzz",
    "pig": "oink",
}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


class SplitMix64:
    """A tiny PRNG with a fixed algorithm: the same bytes on every Python version."""

    def __init__(self, seed: int):
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def choice(self, seq):
        return seq[self.below(len(seq))]


def _story(r: SplitMix64) -> str:
    name, animal, adj = r.choice(NAMES), r.choice(ANIMALS), r.choice(ADJECTIVES)
    friend = r.choice([n for n in NAMES if n != name])
    obj, feeling = r.choice(OBJECTS), r.choice(FEELINGS)
    return (
        f"Once upon a time there was a {adj} {animal} named {name}. "
        f"{name} lived in a {r.choice(PLACES)} near the {r.choice(FEATURES)}. "
        f"Every morning, {name} liked to {r.choice(ACTIVITIES)}. "
        f"One day, {name} found a {obj}. {name} was very {feeling}. "
        f'{name} showed the {obj} to {friend}, and {friend} said, "What a nice {obj}!" '
        f"Then they went to {r.choice(ACTIVITIES)} together until the sun went down.\n\n"
    )


def _fact(r: SplitMix64) -> str:
    kind = r.below(4)
    if kind == 0:
        country = r.choice(sorted(CAPITALS))
        return f"The capital of {country} is {CAPITALS[country]}.\n"
    if kind == 1:
        word = r.choice(sorted(OPPOSITES))
        return f"The opposite of {word} is {OPPOSITES[word]}.\n"
    if kind == 2:
        animal = r.choice(sorted(SOUNDS))
        return f"The {animal} says {SOUNDS[animal]}.\n"
    a, b = r.below(5), r.below(5)
    return f"{NUMBER_WORDS[a]} plus {NUMBER_WORDS[b]} is {NUMBER_WORDS[a + b]}.\n".capitalize()


def generated_text(n_bytes: int = 300_000, seed: int = 20240101) -> str:
    """About ``n_bytes`` of simple English: stories interleaved with facts."""
    r = SplitMix64(seed)
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        chunk = _story(r) if r.below(3) == 0 else "".join(_fact(r) for _ in range(1 + r.below(4))) + "\n"
        parts.append(chunk)
        size += len(chunk)
    return "".join(parts)


def classics_text() -> str:
    return resources.files("tinyllm").joinpath("data/classics.txt").read_text(encoding="utf-8")


def builtin_text() -> str:
    """The default corpus source (about 310 KB); its tail becomes the held-out part."""
    return classics_text() + "\n\n" + generated_text()


def zoo_items() -> dict[str, list[dict]]:
    """The zoo suite's tasks (shipped as ``data/zoo/<task>.jsonl``; regenerate with
    ``python -m tinyllm.builtin_text``). Multiple choice by log-likelihood, and greedy generation
    scored by exact match, in an lm-evaluation-harness-like shape."""
    r = SplitMix64(7)

    def mc(task: str, table: dict[str, str], template: str) -> list[dict]:
        items = []
        values = sorted(set(table.values()))
        for key in sorted(table):
            gold_value = table[key]
            others = [v for v in values if v != gold_value]
            distractors: list[str] = []
            while len(distractors) < 3:
                v = r.choice(others)
                if v not in distractors:
                    distractors.append(v)
            choices = distractors[:]
            gold = r.below(4)
            choices.insert(gold, gold_value)
            items.append(
                {
                    "task": task,
                    "type": "multiple_choice",
                    "context": template.format(key),
                    "choices": [" " + c + "." for c in choices],
                    "gold": gold,
                }
            )
        return items

    arithmetic = [
        {
            "task": "arithmetic",
            "type": "generate",
            "context": f"{NUMBER_WORDS[a]} plus {NUMBER_WORDS[b]} is".capitalize(),
            "target": f" {NUMBER_WORDS[a + b]}",
            "until": ["."],
            "max_new_tokens": 8,
        }
        for a in range(5)
        for b in range(5)
    ]
    return {
        "capitals": mc("capitals", CAPITALS, "The capital of {} is"),
        "opposites": mc("opposites", OPPOSITES, "The opposite of {} is"),
        "sounds": mc("sounds", SOUNDS, "The {} says"),
        "arithmetic": arithmetic,
    }


if __name__ == "__main__":  # regenerate the shipped zoo files
    import json
    from pathlib import Path

    out = Path(__file__).parent / "data" / "zoo"
    out.mkdir(parents=True, exist_ok=True)
    for task, items in zoo_items().items():
        (out / f"{task}.jsonl").write_text(
            "".join(json.dumps(i, sort_keys=True) + "\n" for i in items), encoding="utf-8"
        )
        print(task, len(items))
