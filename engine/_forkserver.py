"""A fork server: a Python process that imported what its caller named, forking one fresh child per command.

Why: a trainer's start is mostly the interpreter and ``import torch`` (seconds on a busy host), paid again
by every segment of a run. The server pays it once; each attempt is then ``fork()`` of a process that
has everything imported and has run nothing: a fresh process (its own session and process group, its own
pid that the runner signals, nothing left over from an earlier attempt), so the runner's guarantees
(engine/_subprocess_runner.py: SIGTERM to the main pid, the attempt's tree stopped when it ends,
parent-death signal) hold unchanged. The engine names no module here: the caller (workflows) gives the
``preload`` hooks (``module`` or ``module:function``, run once in the server) and the ``modules`` the
server may run as ``python -m MODULE ...``. This module imports no torch; the server process imports what
it is told to.

The tag (engine/_proctree.py) that finds an attempt's processes is read from ``/proc/<pid>/environ``,
which for a forked process is the server's environment at its exec: the server starts with a
``DURABLE_ATTEMPT`` entry reserved at a fixed size (a value no attempt matches), and each child writes
its own tag into those bytes before it runs anything (the bytes are its own memory; the server checks
at start that the kernel shows the rewrite). Its descendants inherit it as with any tag.

Any doubt runs the command the ordinary way (``spawn`` returns None, the runner starts a fresh
interpreter): another command or module, another working directory, an environment that differs from
the server's in anything but the per-attempt variables (a module may read the environment when it is
imported), a tag too long for the reserved bytes, a server that failed its preload, started threads
(a fork copies only the forking thread), crashed, or does not answer.

Protocol (an ``AF_UNIX`` ``SOCK_SEQPACKET`` pair): the client sends ``{"argv", "cwd", "env"}`` with three
descriptors (stdout, stderr, a reply socket); the server answers on the reply socket ``{"pid": N}`` (or
``{"refused": why}``) and, when the child ends, ``{"returncode": R}`` (``-signal`` when killed, as
``subprocess.Popen``). A server whose client goes away exits; its children have a parent-death signal.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _proctree as proctree

log = logging.getLogger("engine")

TAG_BYTES = 1024  # the reserved size of the server's DURABLE_ATTEMPT value (a tag is far shorter)
ARGV_BYTES = 8192  # the reserved size of its command line, where each child writes its own argv
SERVER_TAG = "~forkserver"  # the reserved value starts with it: no attempt's tag matches it
PER_ATTEMPT_ENV = frozenset({proctree.ENV_TAG, "DURABLE_STOP_SIGNAL", "TRACEPARENT", "TRACESTATE", "CTL_RUN_STEPS"})
"""Variables that may differ between the server's environment and a command's (read at run time, never
at import); any other difference runs the command the ordinary way."""
PR_SET_PDEATHSIG = 1
READY_TIMEOUT_S = 120.0  # the server's imports on a loaded host; past it, commands run the ordinary way
ANSWER_TIMEOUT_S = 30.0  # a fork answers in milliseconds; a server silent this long is taken for dead
MSG_BYTES = 1 << 20


class WarmChild:
    """A child the server forked, as much of ``subprocess.Popen`` as the runner uses: ``pid``,
    ``returncode``, ``poll()``, ``wait(timeout)``, ``kill()``. Its exit status comes from the server (its
    parent) on ``reply``; a server that dies first took the child with it (parent-death signal):
    -SIGKILL."""

    def __init__(self, pid: int, reply: socket.socket, argv: Sequence[str]):
        self.pid = pid
        self.args = list(argv)
        self.returncode: int | None = None
        self._reply = reply
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # gone already, or no pidfd: os.kill by pid
            self._pidfd = None

    def _read(self, timeout_s: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._reply], [], [], timeout_s)
        if not ready:
            return
        try:
            data = self._reply.recv(MSG_BYTES)
            code = json.loads(data)["returncode"] if data else -signal.SIGKILL
        except (OSError, ValueError, KeyError, TypeError):
            code = -signal.SIGKILL  # the server died: so did the child (its parent-death signal)
        self.returncode = int(code)
        self._close()

    def _close(self) -> None:
        self._reply.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _env_key(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_ATTEMPT_ENV}


class ForkServer:
    """The client of one server process (see the module docstring). ``start()`` launches it in the
    background (a thread that owns it for its life: the server's parent-death signal fires when that
    thread ends, i.e. with this process); ``spawn`` forks a command, or returns None (run it the ordinary
    way); ``close`` ends the server. ``cwd``: the directory the server runs in and commands must ask for."""

    def __init__(
        self,
        preload: Sequence[str],
        modules: Sequence[str],
        *,
        cwd: str | os.PathLike,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
    ):
        self.preload = list(preload)
        self.modules = frozenset(modules)
        self.cwd = os.fspath(cwd)
        self.python = python
        self.env = dict(os.environ if env is None else env)
        self._env_key = _env_key(self.env)
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why the server serves nothing (None: it serves, or is starting)
        self.started_at: float | None = None
        self.ready_at: float | None = None

    # -- the server's life -------------------------------------------------------------------------

    def start(self) -> ForkServer:
        if self._thread is None:
            self.started_at = time.monotonic()
            self._thread = threading.Thread(target=self._own, name="fork server", daemon=True)
            self._thread.start()
        return self

    def _own(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(self.env)
        env[proctree.ENV_TAG] = SERVER_TAG.ljust(TAG_BYTES, "_")
        try:
            self._proc = subprocess.Popen(
                [self.python, "-m", "engine._forkserver", str(theirs.fileno()), *self.preload, "--", "~" * ARGV_BYTES],
                cwd=self.cwd,
                env=env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_dies_with(os.getpid()),
            )  # noqa: PLW1509 - prctl only, as the runner's (no locks)
        except OSError as e:
            self._fail(f"cannot start the fork server: {e}")
            return
        finally:
            theirs.close()
        try:
            data = mine.recv(MSG_BYTES)
            hello = json.loads(data) if data else {"error": "the fork server exited while preloading"}
        except (OSError, ValueError) as e:
            hello = {"error": f"the fork server's greeting: {e}"}
        if hello.get("ready"):
            self._sock = mine
            self.ready_at = time.monotonic()
        else:
            mine.close()
            self._fail(str(hello.get("error") or "the fork server is not ready"))
        self._ready.set()
        self._proc.wait()  # this thread lives as long as the server (its parent-death signal is this thread's)
        if self.error is None:
            self.error = f"the fork server exited ({self._proc.returncode})"

    def _fail(self, why: str) -> None:
        self.error = why
        log.info("fork server: %s; commands start the ordinary way", why)
        self._ready.set()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, on_wait: Callable[[], Any] | None = None) -> bool:
        """Wait until the server serves (True) or will not (False), calling ``on_wait`` about every second."""
        end = time.monotonic() + timeout_s
        while not self._ready.wait(min(1.0, max(0.0, end - time.monotonic()))):
            if time.monotonic() >= end:
                return False
            if on_wait is not None:
                on_wait()
        return self.error is None and self._sock is not None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self.error = self.error or "closed"
        if sock is not None:
            sock.close()  # a server that serves exits when its client goes; one still preloading is killed
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=0.5 if sock is not None else 0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- commands ----------------------------------------------------------------------------------

    def refusal(self, argv: Sequence[str], cwd: str | os.PathLike | None, env: Mapping[str, str]) -> str | None:
        """Why ``argv`` in ``cwd`` with ``env`` cannot be forked here (None: it can)."""
        if len(argv) < 3 or argv[0] != self.python or argv[1] != "-m" or argv[2] not in self.modules:
            return "not a preloaded module's command"
        if os.fspath(cwd or os.getcwd()) != self.cwd:
            return "another working directory"
        if _env_key(env) != self._env_key:
            differ = sorted(
                k for k in set(env) | set(self.env) if k not in PER_ATTEMPT_ENV and env.get(k) != self.env.get(k)
            )
            return f"another environment ({', '.join(differ[:5])})"
        if len(env.get(proctree.ENV_TAG, "")) >= TAG_BYTES:
            return "an attempt tag longer than the reserved bytes"
        if len("\0".join(argv).encode()) >= ARGV_BYTES:
            return "a command line longer than the reserved bytes"
        return None

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike | None,
        env: Mapping[str, str],
        stdout: Any,
        stderr: Any,
        on_wait: Callable[[], Any] | None = None,
    ) -> WarmChild | None:
        """Fork ``argv`` (``python -m MODULE ARGS``) in the server with ``stdout``/``stderr`` (files), or None:
        run it the ordinary way (why: logged)."""
        why = self.refusal(argv, cwd, env)
        if why is None and not self.wait_ready(on_wait=on_wait):
            why = self.error or "the fork server is not ready"
        if why is not None:
            log.info("fork server: %s: starting %s the ordinary way", why, " ".join(argv[:3]))
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        msg = json.dumps({"argv": list(argv), "cwd": os.fspath(cwd or self.cwd), "env": dict(env)}).encode()
        try:
            with self._lock:
                sock = self._sock
                if sock is None:
                    raise OSError("the fork server is closed")
                socket.send_fds(sock, [msg], [stdout.fileno(), stderr.fileno(), theirs.fileno()])
            theirs.close()
            ready, _, _ = select.select([mine], [], [], ANSWER_TIMEOUT_S)
            data = mine.recv(MSG_BYTES) if ready else b""
            answer = json.loads(data) if data else None
        except (OSError, ValueError) as e:
            answer = {"refused": f"the fork server failed ({e})"}
        finally:
            theirs.close()
        if not isinstance(answer, dict) or not isinstance(answer.get("pid"), int):
            why = (answer or {}).get("refused") or "the fork server did not answer"
            mine.close()
            if answer is None:  # dead or hung: no more commands to it (a forked child dies with it)
                self.error = why
                self._kill_server()
            log.info("fork server: %s: starting %s the ordinary way", why, " ".join(argv[:3]))
            return None
        return WarmChild(answer["pid"], mine, argv)

    def _kill_server(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()


def _dies_with(parent_pid: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)

    def setup() -> None:  # between fork and exec: SIGKILL when the thread that started it ends
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(137)

    return setup


# -- the server process -------------------------------------------------------------------------------


def _env_area() -> tuple[int, int]:
    """The address range of this process's initial environment (``/proc/self/stat`` fields 50, 51)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[47]), int(fields[48])


def _arg_area() -> tuple[int, int]:
    """The address range of this process's command line (``/proc/self/stat`` fields 48, 49)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[45]), int(fields[46])


def _write_argv(area: tuple[int, int], argv: Sequence[str]) -> None:
    """Show ``argv`` as this process's command line (``ps``, ``/proc/<pid>/cmdline``: what a cold start would
    show, then NUL padding), as setproctitle does: the bytes are this process's own memory."""
    start, end = area
    data = b"\0".join(a.encode() for a in argv) + b"\0"
    if len(data) >= end - start:
        raise ValueError("command line too long")
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def _find_tag_entry() -> tuple[int, int]:
    """(address, length) of the reserved ``DURABLE_ATTEMPT=...`` bytes in the initial environment."""
    start, end = _env_area()
    with open("/proc/self/environ", "rb") as f:
        area = f.read()
    key = proctree.ENV_TAG.encode() + b"=" + SERVER_TAG.encode()
    if area.startswith(key):
        at = 0
    else:
        found = area.find(b"\0" + key)
        if found < 0:
            raise RuntimeError("no reserved DURABLE_ATTEMPT entry in the environment")
        at = found + 1
    stop = area.index(b"\0", at)
    if end - start < stop:
        raise RuntimeError("the environment area is not what /proc shows")
    return start + at, stop - at


def _write_tag(entry: tuple[int, int], tag: str) -> None:
    address, length = entry
    data = (proctree.ENV_TAG + "=" + tag).encode()
    if len(data) >= length:
        raise ValueError("tag too long")
    ctypes.memmove(address, data + b"\0" * (length - len(data)), length)


def _check_tag_rewrite(entry: tuple[int, int]) -> None:
    """The kernel shows what this process writes into its environment area (else no tags: no serving)."""
    probe = SERVER_TAG + "-probe"
    _write_tag(entry, probe)
    seen = proctree._tag_of(os.getpid())
    _write_tag(entry, SERVER_TAG.ljust(entry[1] - len(proctree.ENV_TAG) - 2, "_"))
    if seen != probe:
        raise RuntimeError(f"/proc/self/environ does not show the rewritten tag (saw {seen!r})")


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _preload(hooks: Sequence[str]) -> None:
    for hook in hooks:
        module, _, function = hook.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()


def _send(sock: socket.socket, value: dict) -> None:
    try:
        sock.send(json.dumps(value).encode())
    except OSError:
        pass


def _serve(ctl: socket.socket, entry: tuple[int, int]) -> dict | None:
    """The server's loop; returns (in a forked child only) the command that child runs. None: the
    client went away."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    replies: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([ctl.fileno(), wake_r], [], [])
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        while replies:  # reap: each ended child's status to its client
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock = replies.pop(pid, None)
            if sock is not None:
                _send(sock, {"returncode": os.waitstatus_to_exitcode(status)})
                sock.close()
        if ctl.fileno() not in ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, MSG_BYTES, 3)
        except OSError:
            return None
        if not msg:
            return None
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        out_fd, err_fd, reply_fd = fds
        reply = socket.socket(fileno=reply_fd)
        try:
            request = json.loads(msg)
            tag = str(request["env"].get(proctree.ENV_TAG, ""))
            if len((proctree.ENV_TAG + "=" + tag).encode()) >= entry[1]:
                raise ValueError("the attempt's tag does not fit the reserved bytes")
            pid = os.fork()
        except (OSError, ValueError, KeyError, TypeError) as e:
            _send(reply, {"refused": f"the fork server refused: {e}"})
            reply.close()
            os.close(out_fd)
            os.close(err_fd)
            continue
        if pid == 0:  # the child: leave the server behind, become the command's process
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for sock in (ctl, reply, *replies.values()):
                sock.close()
            os.close(wake_r)
            os.close(wake_w)
            request["fds"] = (out_fd, err_fd)
            return request
        os.close(out_fd)
        os.close(err_fd)
        replies[pid] = reply
        _send(reply, {"pid": pid})


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _stop_signals() -> set[int]:
    """The signals a polite stop may send (and ``$DURABLE_STOP_SIGNAL``'s): the server blocks them."""
    out: set[int] = set(STOP_SIGNALS)
    name = os.environ.get("DURABLE_STOP_SIGNAL", "").strip().upper()
    if name:
        sig = getattr(signal.Signals, name if name.startswith("SIG") else f"SIG{name}", None)
        if sig is not None and sig not in (signal.SIGKILL, signal.SIGSTOP):
            out.add(sig)
    return out


def _become(request: dict, entry: tuple[int, int], server_pid: int, mask: set[int]) -> None:
    """In the forked child, before the command runs: own session, parent-death signal, tag, stdio, cwd, env,
    then the signal mask the server started with (a stop signal sent since the fork was held pending, not
    lost: it acts now, as on a cold start before its handlers)."""
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server_pid:  # the server died before prctl took effect
        os._exit(137)
    env = {str(k): str(v) for k, v in request["env"].items()}
    _write_tag(entry, env.get(proctree.ENV_TAG, SERVER_TAG))
    out_fd, err_fd = request["fds"]
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    argv = list(request["argv"])
    sys.argv = [argv[2], *argv[3:]]
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def main(argv: Sequence[str]) -> int:
    """``python -m engine._forkserver FD HOOK...``: preload, greet the client on FD, serve."""
    ctl = socket.socket(fileno=int(argv[0]))
    server_pid = os.getpid()
    hooks = list(argv[1 : argv.index("--")] if "--" in argv else argv[1:])
    # a polite stop that reaches every process of a job (Slurm) must not end the server under its trainers:
    # blocked here (pending, never acted on), restored in each child
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _stop_signals())
    try:
        entry = _find_tag_entry()
        _check_tag_rewrite(entry)
        area = _arg_area()
        shown = [sys.executable, "-m", "engine._forkserver", *hooks]
        _write_argv(area, shown)
        with open("/proc/self/cmdline", "rb") as f:
            if f.read().split(b"\0")[: len(shown)] != [a.encode() for a in shown]:
                raise RuntimeError("/proc/self/cmdline does not show the rewritten command line")
        _preload(hooks)
        if _threads() != 1:
            raise RuntimeError(f"the preload started threads ({_threads()} running): forking would copy one")
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException as e:  # noqa: BLE001 - said to the client, which then starts commands the ordinary way
        _send(ctl, {"error": f"fork server preload failed: {type(e).__name__}: {e}"[:2000]})
        traceback.print_exc()
        return 1
    _send(ctl, {"ready": True, "pid": server_pid})
    request = _serve(ctl, entry)
    if request is None:
        return 0
    _become(request, entry, server_pid, mask)
    _write_argv(area, request["argv"])
    # the module was preloaded: running it again as __main__ is what `python -m` does, minus the import
    warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
    runpy.run_module(request["argv"][2], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
