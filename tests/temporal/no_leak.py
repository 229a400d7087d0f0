"""Test-only: a secret (the API key) is nowhere it must not be: no output, no file under the home,
not in the workflow's raw history (Temporal's protos), not in the dev server's state files."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def raw_history(eng, workflow_id: str) -> Any:
    """Temporal's own ``WorkflowHistory`` (protos) of ``workflow_id`` on ``eng``'s server (a
    ``TemporalEngine``), to check what the server recorded."""
    return eng._call(eng.client.get_workflow_handle(workflow_id).fetch_history())


def assert_secret_nowhere(
    secret: str, outputs: list[str], home: Path, server, namespace: str, workflow_id: str
) -> None:
    from engine.temporal import TemporalConfig, TemporalEngine

    for text in outputs:
        assert secret not in text
    for path in home.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    with TemporalEngine(TemporalConfig(address=server.address, namespace=namespace)) as eng:  # the server itself
        raw = raw_history(eng, workflow_id)
    assert raw.events, "no history to search"
    assert secret.encode() not in b"".join(ev.SerializeToString() for ev in raw.events)
    state = list(Path(server.db_filename).parent.glob("*.db*"))
    assert state, "no server state to search"
    for path in state:  # the server's whole state
        assert secret.encode() not in path.read_bytes(), path
