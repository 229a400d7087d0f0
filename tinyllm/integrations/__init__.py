"""Integrations that make trainers owning their loop follow the trainer contract (docs/integrations.md).

One module per framework, each importing its framework only when imported itself:
``tinyllm.integrations.hf`` (extra ``[hf]``: transformers' ``Trainer``) and
``tinyllm.integrations.lightning`` (extra ``[lightning]``: PyTorch Lightning). Importing one without
its extra prints one line naming the extra to install and exits 2 (``MissingExtra``, a SystemExit).
The contract's mechanics they share (run lock, resume choice, progress and metrics lines,
checkpoint mirroring, result line) are in ``tinyllm.integrations.contract``.
"""
