"""The HTTP side of ``ctl ui``: routes, templates, the read-only server.

Stack: the standard library's ``http.server`` (``ThreadingHTTPServer``) and jinja2 with
autoescape on (every template; ``ctl/ui/templates/``). A local, single-user, read-only viewer
needs no ASGI stack: this one starts in milliseconds, adds one dependency (jinja2, which torch
already brings), and its only methods are GET and HEAD (any other is ``501``).

One connection per process (DESIGN.md): the server holds one read-only ``Engine`` for its whole
life and renders one page at a time under ``App.lock`` (the store's own lock guards each query);
it never opens the database file itself and never writes.

Routes: ``/`` (runs; ``?state=running|completed|failed|canceled``), ``/run/<workflow id>``
(``?kind=EVENT_TYPE&attempt=N&limit=N|all&timeline=all``), ``?partial=1`` on either returns the page's
``<main>`` alone (the page's own few lines of script poll it once a second while the page is
live). Unknown paths and ids are a 404 page; a failure while rendering is a 500 page with one
line (logged on stderr), never a traceback.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from app import Backend
from app.runview import fmt_duration, local_time

from . import pages, svg

TEMPLATES = Path(__file__).parent / "templates"
STATES = ("running", "completed", "failed", "canceled")
POLL_S = 1.0  # a live page asks again at most this often
TIMELINE_SHOWN = 300  # the newest timeline rows a run page lists unless ?timeline=all
EVENTS_SHOWN = 500  # the newest events a run page lists unless ?limit=N|all


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = lambda t: local_time(t, date=True).replace("T", " ") if isinstance(t, (int, float)) else "-"
    env.filters["clock"] = lambda t: local_time(t) if isinstance(t, (int, float)) else "-"
    env.filters["duration"] = lambda s: fmt_duration(s) if isinstance(s, (int, float)) else "-"
    env.filters["loss"] = lambda x: f"{x:.4f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"
    env.filters["quote"] = lambda s: urllib.parse.quote(str(s), safe="/")
    env.globals["chart"] = lambda *a, **k: Markup(svg.chart(*a, **k))  # svg.chart escapes every label itself
    env.globals["figure_card"] = lambda *a, **k: Markup(svg.figure_card(*a, **k))  # so does figure_card
    env.globals["POLL_MS"] = int(POLL_S * 1000)
    return env


class App:
    """Pages of one home over one read-only engine (``render(path, query)`` is the whole app)."""

    def __init__(self, engine: Backend, home: Path):
        self.engine, self.home = engine, home
        self.env = _environment()
        self.lock = threading.Lock()
        self.nonce = secrets.token_urlsafe(16)  # the poller's script runs; any other script would not (CSP)

    def render(self, path: str, query: dict[str, list[str]]) -> tuple[int, str]:
        """(status, HTML) of a GET; never raises for a bad request."""
        q = {k: v[-1] for k, v in query.items() if v}
        partial = q.get("partial") == "1"
        try:
            with self.lock:
                if path in ("/", "/runs"):
                    return HTTPStatus.OK, self._runs(q, partial)
                if path.startswith("/run/"):
                    return HTTPStatus.OK, self._run(path[len("/run/") :], q, partial)
        except pages.UnknownRun as e:
            return HTTPStatus.NOT_FOUND, self._page("notfound.html", partial, what=f"no workflow {e.args[0]!r}")
        except Exception as e:  # a damaged record, a file changing under us: one line, never a traceback
            print(f"ctl ui: {path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return HTTPStatus.INTERNAL_SERVER_ERROR, self._page(
                "notfound.html", partial, what=f"this page could not be read ({type(e).__name__}: {e})", code=500
            )
        return HTTPStatus.NOT_FOUND, self._page("notfound.html", partial, what=f"no page {path!r}")

    def _page(self, template: str, partial: bool, **ctx: Any) -> str:
        ctx.setdefault("code", 404)
        ctx.setdefault("live", False)
        ctx.setdefault("home", str(self.home))
        return self.env.get_template(template).render(partial=partial, nonce=self.nonce, **ctx)

    def _runs(self, q: dict[str, str], partial: bool) -> str:
        state = q.get("state", "")
        rows = pages.runs(self.engine, self.home, time.time(), state if state in STATES else None)
        live = any(r.state == "running" for r in rows)
        return self._page("runs.html", partial, rows=rows, state=state, states=STATES, live=live, code=200)

    def _run(self, raw_id: str, q: dict[str, str], partial: bool) -> str:
        workflow_id = urllib.parse.unquote(raw_id).strip("/")
        attempt = int(q["attempt"]) if q.get("attempt", "").isdigit() else None
        limit_text = q.get("limit", "")
        limit = None if limit_text == "all" else int(limit_text) if limit_text.isdigit() else EVENTS_SHOWN
        page = pages.run(
            self.engine,
            self.home,
            workflow_id,
            time.time(),
            kind=q.get("kind", ""),
            attempt=attempt,
            limit=limit,
            timeline_limit=None if q.get("timeline") == "all" else TIMELINE_SHOWN,
        )
        return self._page(
            "run.html",
            partial,
            p=page,
            r=page.row,
            kind=q.get("kind", ""),
            attempt=attempt,
            limit=limit,
            live=page.row.state == "running",
            code=200,
        )


class Handler(BaseHTTPRequestHandler):
    server_version = "ctl-ui"
    app: App  # set on the subclass ``serve`` makes

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        status, html = self.app.render(url.path, urllib.parse.parse_qs(url.query))
        data = html.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        # nothing from elsewhere, no framing; the only script that runs is the page's own poller (its nonce)
        self.send_header(
            "Content-Security-Policy",
            f"default-src 'self'; script-src 'nonce-{self.app.nonce}'; "
            "style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
        )
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: a line per request would flood the terminal
        pass


def make_server(app: App, host: str, port: int) -> ThreadingHTTPServer:
    """A bound server for ``app`` (``OSError`` when the address cannot be had)."""
    handler = type("BoundHandler", (Handler,), {"app": app})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
