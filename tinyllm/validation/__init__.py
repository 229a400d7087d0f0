"""Held-out validation during training (train-time-validation)."""
