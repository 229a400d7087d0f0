"""The ``ctl ui`` command: serve a home's runs read-only on loopback (registered in ``ctl/cli.py``)."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import click

import app
from ..cli_common import edge, home_option
from app.errors import BadRequest

INSTALL_HINT = "pip install 'durable-train[ui]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@click.command()
@click.option("--port", type=int, default=8765, show_default=True, help="TCP port (0: any free one, printed).")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but loopback makes the pages reachable from other machines.",
)
@home_option
@edge
def ui(port: int, host: str, home: str | None) -> None:
    """Serve read-only web pages of the home's runs: every workflow with its state, worker, step,
    loss and ETA; each run's timeline, curves, checkpoints and events. A running run's page updates
    itself every second. Nothing is written; the database is opened read-only.

    \b
    Exit codes: 0 stopped (Ctrl-C, SIGTERM), 2 bad input (no database, the port cannot be had,
                the [ui] extra is not installed).
    \b
    Example:
      ctl ui --home runs-home            # then open http://127.0.0.1:8765/
    """
    t0 = time.monotonic()
    try:
        from . import server  # lazy: jinja2 is the optional [ui] extra
    except ImportError as e:
        raise BadRequest(f"ctl ui needs the optional extra: {INSTALL_HINT} ({e})") from None
    if not 0 <= port < 65536:
        raise BadRequest(f"--port {port}: expected 0-65535")
    home_dir = app.resolve_home(home)
    engine = app.open_engine(home_dir, create=False, readonly=True)
    try:
        try:
            httpd = server.make_server(server.App(engine, home_dir), host, port)
        except OSError as e:
            raise BadRequest(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        if host not in LOOPBACK:
            click.echo(
                f"ctl ui: warning: listening on {host}, not loopback: anyone who can reach this machine can "
                "read these runs (specs, errors, paths); there is no login",
                err=True,
            )
        bound_host, bound_port = httpd.server_address[:2]
        host_text = bound_host.decode() if isinstance(bound_host, bytes) else str(bound_host)  # (bytes: AF_UNIX only)
        shown = f"[{host_text}]" if ":" in host_text else host_text
        click.echo(
            f"ctl ui: serving {home_dir} read-only at http://{shown}:{bound_port}/ "
            f"(ready in {time.monotonic() - t0:.2f} s; Ctrl-C to stop)",
            err=True,
        )
        sys.stderr.flush()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stop)
        try:
            httpd.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            httpd.server_close()
    finally:
        engine.close()
