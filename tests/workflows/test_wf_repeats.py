"""workflows/repeats.py: when two failures in a row count as the same (type, message, point) and when not."""

from __future__ import annotations

from pathlib import Path

from engine import NonRetryableError, SubprocessFailed
from workflows.repeats import check_repeat


def _err(msg: str, code: int = 1) -> SubprocessFailed:
    return SubprocessFailed(f"python failed (exit {code}): {msg}", returncode=code, stderr_tail=msg)


def test_same_failure_same_point_stops(tmp_path: Path) -> None:
    assert check_repeat(tmp_path, 1, _err("ValueError: x"), 40) is None
    stop = check_repeat(tmp_path, 2, _err("ValueError: x"), 40)
    assert isinstance(stop, NonRetryableError) and stop.type == "RepeatedFailure"
    assert "at step 40 (no new checkpoint between them) in attempts 1 and 2" in str(stop)
    assert stop.details == {"returncode": 1, "stderr_tail": "ValueError: x"}


def test_progress_or_another_message_is_retried(tmp_path: Path) -> None:
    assert check_repeat(tmp_path, 1, _err("MemoryError"), 40) is None
    assert check_repeat(tmp_path, 2, _err("MemoryError"), 50) is None  # a new checkpoint: it made progress
    assert check_repeat(tmp_path, 3, _err("OSError: reset"), 50) is None  # another message
    assert check_repeat(tmp_path, 5, _err("OSError: reset"), 50) is None  # attempt 4 recorded nothing (lost)


def test_signals_and_locks_are_never_a_repeat(tmp_path: Path) -> None:
    for code in (-9, 75):  # killed from outside (a fault campaign, the OOM killer); another trainer's lock
        assert check_repeat(tmp_path, 1, _err("x", code), 40) is None
        assert check_repeat(tmp_path, 2, _err("x", code), 40) is None
    assert check_repeat(tmp_path, 3, _err("x"), 40) is None  # attempt 2 recorded nothing: no chain
