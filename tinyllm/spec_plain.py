"""What modules that must not import pydantic need of the spec (tinyllm/validation/errors.py, the CLI):
``SpecError`` (re-exported by tinyllm.spec, the same class) and the train
spec's default thread count (``TrainSpec.threads``)."""
from __future__ import annotations


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the problem."""


TRAIN_THREADS_DEFAULT = 2  # TrainSpec.threads: the most torch threads training uses (tinyllm/runtime_env.py chooses by load)
