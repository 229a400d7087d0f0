"""GRPO without a learning signal: a whole window of batches in which every prompt's rollouts got one reward.

GRPO's advantage is a rollout's reward relative to its prompt's group (tinyllm/objectives/grpo.py): when
all ``n_generation`` rollouts of a prompt score the same, their advantages are all zero; when that holds
for every prompt of a collected batch, the clipped objective is exactly 0 and the update carries no
reward signal (a ``kl_beta`` term only pulls toward the reference). A base that never gets a rollout
right (exact match 0.0 everywhere) trains for nothing: loss 0, ``train/reward_mean`` 0.0. This watch
says so, once per run.

The window: ``WINDOW_STEPS`` (10) consecutive collected batches (trainer steps), or the whole run when
it is shorter (the run's total steps, not a segment's end). The first time a window ends in which every
prompt's group had one reward in each batch, that step's frame (metrics.jsonl) carries
``warn/no_signal_steps`` (the window's length) and, when one reward value held for every rollout of the
window, ``warn/no_signal_reward`` (that value); the trainer prints the text of ``warning_text`` as one
``tinyllm: warning:`` line, and ``ctl train``'s display and ``ctl show`` print the same text from the frame.
Once per run: the streak and whether the warning was given are in each checkpoint (the ``posttrain``
component), so a resume or a later segment neither repeats the warning nor misses it; a checkpoint
written before this watch existed resumes with an empty streak. Deterministic (exact comparisons of the
rewards, a function of the trajectory) and read-only: the training bits are the same with or without it.

OPD does not watch: its advantage is the teacher's per-token reverse KL; its rule rewards are only reported.
No torch here (``ctl`` imports ``warning_text``).
"""

from __future__ import annotations

from typing import Any, Sequence

WINDOW_STEPS = 10
STEPS_KEY, REWARD_KEY = "warn/no_signal_steps", "warn/no_signal_reward"


class NoSignalWatch:
    """Follows the batches of one run; ``observe`` returns the frame keys of the warning when it is due."""

    def __init__(self, total_steps: int, window: int = WINDOW_STEPS):
        self.window = max(1, min(window, total_steps))
        self.streak = 0  # consecutive batches, ending at the last one observed, with one reward per group
        self.value: float | None = None  # the one reward of every rollout of the streak (None: not one)
        self.warned = False

    def state(self) -> dict[str, Any]:
        return {"streak": self.streak, "value": self.value, "warned": self.warned}

    def restore(self, state: Any) -> None:
        """From a checkpoint's ``posttrain`` component (absent in older checkpoints: an empty streak)."""
        if isinstance(state, dict):
            self.streak, self.value, self.warned = int(state["streak"]), state["value"], bool(state["warned"])

    def observe(self, groups: Sequence[Sequence[float]]) -> dict[str, float]:
        """``groups``: each prompt's rollout rewards in the batch just trained."""
        if self.warned:
            return {}
        if any(len(set(g)) != 1 for g in groups):
            self.streak, self.value = 0, None
            return {}
        values = {float(r) for g in groups for r in g}
        one = next(iter(values)) if len(values) == 1 else None
        self.value = one if self.streak == 0 else (self.value if one is not None and one == self.value else None)
        self.streak += 1
        if self.streak < self.window:
            return {}
        self.warned = True
        return {STEPS_KEY: float(self.window), **({REWARD_KEY: self.value} if self.value is not None else {})}


def warning_text(frame: dict) -> str | None:
    """The warning a frame carries, in words (None: it carries none)."""
    n = frame.get(STEPS_KEY)
    step = frame.get("step")
    if not isinstance(n, (int, float)) or not isinstance(step, int):
        return None
    span = f"steps {step - int(n) + 1}-{step}"
    value = frame.get(REWARD_KEY)
    what = (
        f"reward constant ({float(value)}) for {span}"
        if isinstance(value, (int, float))
        else f"each prompt's rollouts got one reward (same within every group) for {span}"
    )
    return (
        f"{what}: no learning signal (GRPO advantages are all zero); start from a model that gets the reward "
        "on some rollouts of a prompt and not on others, or change rl.reward / rl.n_generation"
    )
