"""The figures each of tinyllm's evaluation suites reports, known before any evaluation (no torch).

``ppl``: task ``heldout``, metrics ``loss``, ``ppl``, ``bpb`` (tinyllm/evals.py ``run_ppl``); ``zoo``: per task of
``tinyllm/data/zoo/*.jsonl``, ``acc`` and ``acc_norm`` for multiple-choice tasks, ``exact_match`` for generation
tasks (``score_task``). ``ctl release`` checks a gate's figure against these before it starts anything, so a
gate on a figure the suite never produces is bad input, not a failed gate after a whole evaluation.
"""

from __future__ import annotations

import json
from importlib import resources

PPL_TASK = "heldout"
PPL_METRICS = ("loss", "ppl", "bpb")
ZOO_METRICS = {"multiple_choice": ("acc", "acc_norm"), "generate": ("exact_match",)}


def zoo_task_kinds() -> dict[str, str]:
    """Task name -> its items' type, from the package's data/zoo/*.jsonl (the first item of each)."""
    out = {}
    folder = resources.files("tinyllm").joinpath("data/zoo")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".jsonl"):
            first = next((ln for ln in entry.read_text(encoding="utf-8").splitlines() if ln.strip()), None)
            if first is not None:
                out[entry.name[:-6]] = json.loads(first).get("type", "")
    return out


def suite_figures(suite: str) -> list[str] | None:
    """``["heldout/loss", "heldout/ppl", "heldout/bpb"]`` for ``ppl``: every ``task/metric`` the suite reports;
    None for a suite tinyllm does not know (a spec's own trainer's suite: only its eval_command knows)."""
    if suite == "ppl":
        return [f"{PPL_TASK}/{m}" for m in PPL_METRICS]
    if suite == "zoo":
        return [f"{task}/{m}" for task, kind in zoo_task_kinds().items() for m in ZOO_METRICS.get(kind, ())]
    return None


def resolve_figure(figure: str, figures: list[str]) -> str | None:
    """The ``task/metric`` a gate's figure names among ``figures``: itself, or the one figure whose metric it is
    (``ppl`` -> ``heldout/ppl``, as workflows/release.py ``check_gate`` matches it); None when none or several."""
    if figure in figures:
        return figure
    matches = [f for f in figures if f.split("/")[-1] == figure]
    return matches[0] if len(matches) == 1 else None
