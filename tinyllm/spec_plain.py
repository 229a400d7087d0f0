"""What reading a spec needs before pydantic is imported (``tinyllm train`` reads these first; see
tinyllm/torch_preload.py): ``SpecError`` (re-exported by tinyllm.spec, the same class) and the train
spec's default thread count (``TrainSpec.threads``)."""
from __future__ import annotations


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the problem."""


TRAIN_THREADS_DEFAULT = 2  # TrainSpec.threads: the most torch threads training uses (tinyllm/omp.py chooses by load)
