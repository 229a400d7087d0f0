"""An attempt's stdout and stderr kept as files, bounded: the first ``HEAD_BYTES`` and the last ``TAIL_BYTES``.

``run_subprocess(..., output_dir=D)`` (engine/_subprocess_runner.py) gives the child ``D/stdout.log`` and
``D/stderr.log`` as its stdout and stderr: the child writes straight into them (no pipe, no reader thread:
a slow or dead worker never blocks the child's writes, and what the child wrote up to a kill is on disk).
The files are kept after the attempt, whatever its outcome, so that ``ctl logs`` shows them.

Bound: while the attempt runs, the runner calls ``bound()`` at each poll; once a file holds more than
``HEAD_BYTES + TAIL_BYTES + SLACK_BYTES``, the bytes between the head and the last ``TAIL_BYTES`` are
punched out (``fallocate(PUNCH_HOLE | KEEP_SIZE)``, block-aligned): the file keeps its size but those
blocks are freed and read as a hole, which ``read_kept`` skips with ``SEEK_DATA``/``SEEK_HOLE`` and
reports as a count of bytes dropped. The child appends (``O_APPEND``) and never notices. On a filesystem
without hole punching the file is cut back to its head instead (``ftruncate``; the child's next write
lands after the head); what was between is dropped unannounced. Either way a file's disk use stays
under about ``HEAD_BYTES + TAIL_BYTES + SLACK_BYTES`` plus what the child writes between two polls.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import BinaryIO, Iterator

HEAD_BYTES = 64 * 1024  # the start: the command line's first words, configuration, early errors
TAIL_BYTES = 4 * 1024 * 1024  # the end: what led to the outcome
SLACK_BYTES = 1024 * 1024  # cut only this much beyond the bound, not at every poll
STREAMS = ("stdout", "stderr")
_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE

_fallocate: ctypes._NamedFuncPointer | None
try:
    _fallocate = ctypes.CDLL(None, use_errno=True).fallocate
    _fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
except (OSError, AttributeError):  # not Linux
    _fallocate = None


def log_path(directory: str | os.PathLike, stream: str) -> Path:
    """``<directory>/stdout.log`` or ``<directory>/stderr.log``."""
    return Path(directory) / f"{stream}.log"


class AttemptOutput:
    """The two files of one attempt, opened for appending (``stdout``, ``stderr``: give them to Popen)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        head_bytes: int = HEAD_BYTES,
        tail_bytes: int = TAIL_BYTES,
        slack_bytes: int = SLACK_BYTES,
    ):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.head_bytes, self.tail_bytes, self.slack_bytes = head_bytes, tail_bytes, slack_bytes
        self.files: dict[str, BinaryIO] = {}
        try:
            for stream in STREAMS:
                self.files[stream] = open(log_path(directory, stream), "ab+")  # O_APPEND: the child writes at the end
        except BaseException:
            self.close()
            raise
        self._cut_to = {stream: 0 for stream in STREAMS}  # the end of the hole punched so far
        self._punch = _fallocate is not None

    @property
    def stdout(self) -> BinaryIO:
        return self.files["stdout"]

    @property
    def stderr(self) -> BinaryIO:
        return self.files["stderr"]

    def bound(self) -> None:
        """Drop the middle of a file grown past its bound (see the module docstring); never raises."""
        for stream, f in self.files.items():
            try:
                st = os.fstat(f.fileno())
                if st.st_size <= self.head_bytes + self.tail_bytes + self.slack_bytes:
                    continue
                block = max(512, st.st_blksize or 4096)
                start = max(-(-self.head_bytes // block) * block, self._cut_to[stream])
                end = (st.st_size - self.tail_bytes) // block * block
                if end <= start:
                    continue
                if self._punch and _fallocate is not None and _fallocate(f.fileno(), _PUNCH, start, end - start) == 0:
                    self._cut_to[stream] = end
                    continue
                if self._punch and ctypes.get_errno() not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    continue  # a passing failure: try again at the next poll
                self._punch = False
                os.ftruncate(f.fileno(), self.head_bytes)
            except OSError:
                continue  # bounding is best effort; the attempt goes on

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of the parts of a file that hold data (holes skipped; one range where unsupported)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole from pos to the end
                return
            yield pos, size  # SEEK_DATA unsupported: all of it
            return
        try:
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError:
            end = size
        end = min(end, size)
        if end <= start:
            return
        yield start, end
        pos = end


def read_kept(path: str | os.PathLike, offset: int = 0) -> tuple[bytes, int, int]:
    """(bytes kept from ``offset`` on with a line for each dropped part, bytes dropped, the file's size now).

    A dropped part (a punched hole) becomes one line ``[... N bytes of output dropped (kept: the first 64 KiB
    and the last 4 MiB) ...]``."""
    out: list[bytes] = []
    dropped = 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos = offset
        for start, end in data_ranges(f.fileno(), size):
            if end <= pos:
                continue
            start = max(start, pos)
            if start > pos:
                out.append(_dropped_line(start - pos))
                dropped += start - pos
            f.seek(start)
            out.append(f.read(end - start))
            pos = end
        if pos < size:  # a hole at the end (being written past it right now): shown on the next read
            size = pos
    return b"".join(out), dropped, size


def _dropped_line(n: int) -> bytes:
    return (
        f"\n[... {n} bytes of output dropped (kept: the first {HEAD_BYTES // 1024} KiB and the last "
        f"{TAIL_BYTES // (1024 * 1024)} MiB of each attempt) ...]\n"
    ).encode()
