"""The subprocess runner's progress reader (engine/_subprocess_runner.py) under damaged lines: a
torn or garbage line is skipped, never raised, and every line it returns can be recorded as a
heartbeat. (Moved here from tests/ctl/test_badinput_fuzz.py: it tests an engine internal.)"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine._subprocess_runner import _Progress

DAMAGE = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@DAMAGE
@given(st.binary(max_size=300))
def test_damaged_progress_lines_are_skipped_never_raise(tmp_path_factory, garbage):
    p = tmp_path_factory.mktemp("prog") / "progress.jsonl"
    p.write_bytes(b"")
    reader = _Progress(p)
    p.write_bytes(b'{"step": 3, "checkpoint": "runs/x/ckpt/step-000003"}\n' + garbage + b"\n")
    lines = reader.new_lines()
    assert lines[0] == {"step": 3, "checkpoint": "runs/x/ckpt/step-000003"}
    assert all(isinstance(x, dict) for x in lines)
    json.dumps(lines, allow_nan=False)  # each heartbeat can be recorded
