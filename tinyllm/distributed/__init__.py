"""Data-parallel training on torch.distributed: the launcher (``launch.py``), torchrun's agent that passes a
stop on to the ranks (``agent.py``), the rank side of the trainer (``trainer.py``) and of held-out validation
(``validation.py``)."""
