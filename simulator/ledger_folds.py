"""The ledger checks as left-to-right folds, so that a sweep checks a position in O(what differs).

``check_evaluations`` and ``check_steps`` (simulator/checks.py) read a ledger once, left to right,
keeping a small state: these classes are that state (``EvalFold``, ``StepsFold``, both in
``LedgerFold``), and the checks are ``LedgerFold().feed(entries)`` then ``lines()``.

A position of a sweep has the ledger ``R[:p] + [crash] + own + T[t:]`` (renumbered): the
uninterrupted run's first ``p`` entries, the crash, the recovery's own entries, and, where the
recovery converged, its target's entries after the convergence point. Its checks are then
``PrefixFold`` (the fold of ``R`` kept along the uninterrupted run: O(new entries) per position)
forked (an overlay: the prefix's state is shared, not copied), fed the crash and the own
entries, and ``TailIndex.fast_clean``: where the fork's state agrees with the target's own fold
at ``t`` on everything the tail reads, the tail does to the position what it did to the target,
so a target whose tail added no line and aggregates that sum to zero prove the position clean
without reading the tail. Anywhere else (a line to make, a state that differs in what the tail
reads) the tail is fed entry by entry: the same fold, the same lines as the whole-ledger checks.
``tests/simulator/test_sim_checks_fold.py`` compares every path with the old whole-ledger code.

What the tail reads, and so what ``fast_clean`` compares (see ``TailIndex``):
- evaluations: per (run, suite) key, whether it was started, finished, and whether its last
  start is still *pending* (no crash, no other work since), *interrupted* (a crash came first)
  or *disturbed* (other work came first); a key the tail starts or finishes must be in the same
  state in both (a key the tail first sees: absent in both); the counts of unfinished and
  unexpected keys and of starts not interrupted are sums over keys, so they add up.
- steps: per run the newest checkpoint and the highest step taken (equal in both), and the
  pending train start where the tail reads it (a ``steps`` entry before the next ``train-start``).
"""

from __future__ import annotations

import bisect
from typing import Any

WORK_KINDS = ("train-start", "steps", "ckpt", "eval-start", "eval-done", "corpus")

_EMPTY = (0, 0, "", ())  # a key's record: starts, completions, status of its last start, seqs of bad restarts
_PENDING, _INTERRUPTED, _DISTURBED = "p", "i", "d"


class EvalFold:
    """``check_evaluations``'s state: a record per (run, suite) key, the keys still pending, counts."""

    __slots__ = (
        "name",
        "wanted",
        "fail_suites",
        "wf",
        "rec",
        "base",
        "pending",
        "unfinished",
        "unexpected",
        "bad",
        "step_lines",
        "final",
    )

    def __init__(self, scn, wf: str | None) -> None:
        self.name = scn.name
        self.wanted = frozenset((f"{scn.name}-{b:06d}", s) for b in scn.ends() for s in scn.suites)
        self.fail_suites = bool(scn.fail_suites)
        self.final = scn.final_step()  # an early stop's segment is evaluated on the stop's checkpoint
        self.wf = wf
        self.rec: dict[tuple, tuple] = {}
        self.base: dict[tuple, tuple] | None = None  # a fork's: the forked fold's records (read only)
        self.pending: list[tuple] = []  # keys whose last start is neither interrupted nor disturbed
        self.unfinished = len(self.wanted)  # wanted keys with no eval-done
        self.unexpected = 0  # started keys not wanted
        self.bad = 0  # starts after a start that was not interrupted alone
        self.step_lines: list[str] = []

    def fork(self) -> "EvalFold":
        """A fold that goes on from this one's state without changing it (its records read through)."""
        if self.base is not None:
            raise ValueError("a fork of a fork")
        out = EvalFold.__new__(EvalFold)
        out.name, out.wanted, out.fail_suites, out.wf, out.final = (
            self.name,
            self.wanted,
            self.fail_suites,
            self.wf,
            self.final,
        )
        out.rec, out.base = {}, self.rec
        out.pending = list(self.pending)
        out.unfinished, out.unexpected, out.bad = self.unfinished, self.unexpected, self.bad
        out.step_lines = list(self.step_lines)
        return out

    def get(self, key: tuple) -> tuple:
        r = self.rec.get(key)
        if r is None and self.base is not None:
            r = self.base.get(key)
        return _EMPTY if r is None else r

    def feed(self, e: dict, seq: int) -> None:
        kind = e["kind"]
        if self.pending:
            if kind in ("crash", "eval-preempted"):  # (a polite stop ends the evaluation in flight like a kill)
                for k in self.pending:
                    r = self.get(k)
                    self.rec[k] = (r[0], r[1], _INTERRUPTED, r[3])
                self.pending = []
            elif kind in WORK_KINDS:
                mine = (e.get("run"), e.get("suite"))
                keep = []
                for k in self.pending:
                    if k == mine:
                        keep.append(k)
                    else:
                        r = self.get(k)
                        self.rec[k] = (r[0], r[1], _DISTURBED, r[3])
                self.pending = keep
        if self.wf is not None and e.get("wf") not in (self.wf, None):
            return
        if kind == "eval-start":
            key = (e["run"], e["suite"])
            r = self.get(key)
            bad = r[3]
            if r[0] and r[2] != _INTERRUPTED:
                bad = bad + (seq,)
                self.bad += 1
            elif not r[0] and key not in self.wanted:
                self.unexpected += 1
            if r[2] != _PENDING:
                self.pending.append(key)
            self.rec[key] = (r[0] + 1, r[1], _PENDING, bad)
            step = int(e["run"].rsplit("-", 1)[1]) if e["run"].rsplit("-", 1)[-1].isdigit() else None
            if step is not None and e["steps"] != [min(step, self.final)]:
                self.step_lines.append(
                    f"evaluation {e['run']} {e['suite']} saw the model at step {e['steps']}, "
                    f"not {min(step, self.final)}"
                )
        elif kind == "eval-done":
            key = (e["run"], e["suite"])
            r = self.get(key)
            if not r[1] and key in self.wanted:
                self.unfinished -= 1
            self.rec[key] = (r[0], r[1] + 1, r[2], r[3])

    def clean(self) -> bool:
        """``lines()`` is empty (without making them)."""
        return (
            not self.bad and not self.unexpected and not self.step_lines and (self.fail_suites or not self.unfinished)
        )

    def lines(self) -> list[str]:
        if self.clean():
            return []
        rec = dict(self.base or {})
        rec.update(self.rec)
        bad = list(self.step_lines)
        for key in sorted({k for k, r in rec.items() if r[0]} | self.wanted):
            r = rec.get(key, _EMPTY)
            if key not in self.wanted:
                bad.append(f"unexpected evaluation {key[0]} {key[1]}")
                continue
            if r[1] < 1 and not self.fail_suites:
                bad.append(f"evaluation {key[0]} {key[1]} never finished")
            for seq in r[3]:
                bad.append(f"evaluation {key[0]} {key[1]} executed again (ledger #{seq}) though it was not interrupted")
        return bad


class StepsFold:
    """``check_steps``'s state: per run the newest checkpoint, the highest step taken, the pending start."""

    __slots__ = ("last_ckpt", "executed", "pending_start", "lines")

    def __init__(self) -> None:
        self.last_ckpt: dict[str, int] = {}
        self.executed: dict[str, int] = {}
        self.pending_start: dict[str, dict] = {}
        self.lines: list[str] = []

    def fork(self) -> "StepsFold":
        out = StepsFold.__new__(StepsFold)
        out.last_ckpt, out.executed = dict(self.last_ckpt), dict(self.executed)
        out.pending_start, out.lines = dict(self.pending_start), list(self.lines)
        return out

    def feed(self, e: dict) -> None:
        kind, run = e["kind"], e.get("run", "")
        if kind == "train-start":
            self.pending_start[run] = e
        elif kind == "steps":
            executed = self.executed
            start = self.pending_start.pop(run, None)
            if start is not None and start["from_step"] < executed.get(run, 0):
                newest = self.last_ckpt.get(run, 0)
                if start["from_step"] != newest:
                    self.lines.append(
                        f"{start['activity']} attempt {start['attempt']} resumed from step {start['from_step']} "
                        f"after step {executed[run]} was taken and step {newest} checkpointed: "
                        f"steps {start['from_step'] + 1}..{newest} redone"
                    )
            executed[run] = max(executed.get(run, 0), e["last"])
        elif kind == "ckpt":
            self.last_ckpt[run] = e["step"]


class LedgerFold:
    """Both folds: ``lines()`` = ``check_evaluations(...) + check_steps(...)`` of the entries fed."""

    __slots__ = ("ev", "st")

    def __init__(self, scn, wf: str | None) -> None:
        self.ev, self.st = EvalFold(scn, wf), StepsFold()

    def fork(self) -> "LedgerFold":
        out = LedgerFold.__new__(LedgerFold)
        out.ev, out.st = self.ev.fork(), self.st.fork()
        return out

    def feed(self, entries: list[dict], start: int = 0, stop: int | None = None, seq_base: int | None = None):
        """Feed ``entries[start:stop]``; ``seq_base``: they are renumbered from there (a splice's)."""
        ev, st = self.ev, self.st
        stop = len(entries) if stop is None else stop
        for i in range(start, stop):
            e = entries[i]
            ev.feed(e, e["seq"] if seq_base is None else seq_base + i - start)
            st.feed(e)
        return self

    def lines(self) -> list[str]:
        return self.ev.lines() + list(self.st.lines)


class PrefixFold:
    """The fold of a ledger that grows (the uninterrupted run's), kept up to date as it grows.

    ``Ledger.record`` only ever replaces the last entry (a ``steps`` range extended), so entries
    before the last are final: they are folded into the state once; ``at()`` forks it and feeds
    the last entry. A fork reads the state it forked, so it is used before the ledger grows again
    (``at()`` refuses a stale fork: ``check``).
    """

    def __init__(self, ledger, scn, wf: str | None) -> None:
        self.ledger, self.scn, self.wf = ledger, scn, wf
        self.root = LedgerFold(scn, wf)
        self.n = 0  # entries folded into root
        self.last: Any = None  # entries[n - 1] when folded: the check that they are final
        self.generation = 0

    def at(self) -> tuple[LedgerFold, int]:
        """The fold of the ledger as it is now (a fork), and the generation it belongs to."""
        entries = self.ledger.entries
        if self.n and (len(entries) < self.n or entries[self.n - 1] is not self.last):
            self.root, self.n = LedgerFold(self.scn, self.wf), 0  # changed before its last entry: fold again
            self.generation += 1
        stable = len(entries) - 1
        if stable > self.n:
            self.root.feed(entries, self.n, stable)
            self.n, self.last = stable, entries[stable - 1]
            self.generation += 1
        return self.root.fork().feed(entries, self.n, len(entries)), self.generation

    def check(self, generation: int) -> None:
        if generation != self.generation:
            raise RuntimeError("a fork of the prefix fold used after the ledger grew")


class TailIndex:
    """A verified run's ledger ``T``, folded once, to tell at a point ``t`` what its tail ``T[t:]`` reads.

    ``first``/``last``: per evaluation key, the indices of its first and last start or completion
    in ``T``; per run, the indices of ``train-start`` and ``steps`` entries. ``at(t)`` (kept per
    ``t``): the fold of ``T[:t]``, the keys the tail touches that ``T[:t]`` already had, with
    their records, and the counts the tail adds.
    """

    def __init__(self, entries: list[dict], scn, wf: str | None) -> None:
        self.entries, self.scn, self.wf = entries, scn, wf
        full = LedgerFold(scn, wf)
        first: dict[tuple, int] = {}
        last: dict[tuple, int] = {}
        self.train_at: dict[Any, list[int]] = {}
        self.steps_at: dict[Any, list[int]] = {}
        for i, e in enumerate(entries):
            full.ev.feed(e, e["seq"])
            full.st.feed(e)
            kind = e["kind"]
            if kind in ("eval-start", "eval-done") and (wf is None or e.get("wf") in (wf, None)):
                key = (e["run"], e["suite"])
                first.setdefault(key, i)
                last[key] = i
            elif kind == "train-start":
                self.train_at.setdefault(e.get("run"), []).append(i)
            elif kind == "steps":
                self.steps_at.setdefault(e.get("run"), []).append(i)
        self.full = full
        self.by_first = sorted(first, key=first.__getitem__)
        self.firsts = [first[k] for k in self.by_first]
        self.first, self.last = first, last
        self._run = LedgerFold(scn, wf)  # the fold of entries[:n], advanced to the points asked for
        self._n = 0
        self._at: dict[int, tuple] = {}

    def warm(self, n: int) -> None:
        """Fold the first ``n`` entries now (a forked child that asks for a later point goes on from there)."""
        n = min(n, len(self.entries))
        if n > self._n:
            self._run.feed(self.entries, self._n, n)
            self._n = n

    def at(self, t: int) -> tuple:
        hit = self._at.get(t)
        if hit is not None:
            return hit
        if t < self._n:
            self._run, self._n = LedgerFold(self.scn, self.wf), 0
        self._run.feed(self.entries, self._n, t)
        self._n = t
        run, full = self._run, self.full
        seen = {
            k: _view(run.ev.get(k)) for k in self.by_first[: bisect.bisect_left(self.firsts, t)] if self.last[k] >= t
        }
        adds = (
            full.ev.unfinished - run.ev.unfinished,
            full.ev.unexpected - run.ev.unexpected,
            full.ev.bad - run.ev.bad,
            len(full.ev.step_lines) - len(run.ev.step_lines),
            len(full.st.lines) - len(run.st.lines),
        )
        steps = (dict(run.st.last_ckpt), dict(run.st.executed), dict(run.st.pending_start))
        hit = self._at[t] = (seen, adds, steps)
        if len(self._at) > 4096:
            self._at.clear()
        return hit

    def fast_clean(self, fold: LedgerFold, t: int) -> bool:
        """True only if ``fold`` fed ``entries[t:]`` would be clean (no line): proved from the index, the
        tail unread. False: not proved (the caller feeds the tail)."""
        ev, st = fold.ev, fold.st
        if ev.bad or ev.unexpected or ev.step_lines or st.lines:
            return False
        seen, adds, (last_ckpt, executed, pending) = self.at(t)
        d_unfinished, d_unexpected, d_bad, d_step_lines, d_steps_lines = adds
        if d_bad or d_step_lines or d_steps_lines or d_unexpected:
            return False
        if not ev.fail_suites and ev.unfinished + d_unfinished:
            return False
        fresh = self.by_first[bisect.bisect_left(self.firsts, t) :]  # keys the tail sees first: none in the fold
        if not ev.rec.keys().isdisjoint(fresh) or (ev.base is not None and not ev.base.keys().isdisjoint(fresh)):
            return False
        for k, view in seen.items():
            if _view(ev.get(k)) != view:
                return False
        if st.last_ckpt != last_ckpt or st.executed != executed:
            return False
        for run in set(st.pending_start) | set(pending):
            a, b = st.pending_start.get(run), pending.get(run)
            if a is b or (a is not None and b is not None and _start_view(a) == _start_view(b)):
                continue
            if self._reads_pending(run, t):
                return False
        return True

    def _reads_pending(self, run, t: int) -> bool:
        """Whether the tail from ``t`` reads ``run``'s pending start: a steps entry before any train start."""
        steps = self.steps_at.get(run, [])
        i = bisect.bisect_left(steps, t)
        if i == len(steps):
            return False
        trains = self.train_at.get(run, [])
        j = bisect.bisect_left(trains, t)
        return j == len(trains) or trains[j] > steps[i]


def _view(r: tuple) -> tuple:
    """What the tail reads of a key's record: started, finished, the status of its last start."""
    return (r[0] > 0, r[1] > 0, r[2])


def _start_view(e: dict) -> tuple:
    return (e.get("from_step"), e.get("activity"), e.get("attempt"))


class TailCache:
    """``TailIndex`` per target ledger (by identity; the last few). ``ref``: a ledger whose index serves
    every tail equal to one of its own (a checked splice's target: its own past, then the uninterrupted
    run's future)."""

    def __init__(self, scn, wf: str | None, size: int = 8, ref: list[dict] | None = None) -> None:
        self.scn, self.wf, self.size, self.ref = scn, wf, size, ref
        self._by_id: dict[int, tuple[list, TailIndex]] = {}

    def canonical(self, entries: list[dict], t: int) -> tuple[list[dict], int]:
        """``(ref, x)`` where ``entries[t:]`` equals ``ref[x:]`` entry for entry (then their folds do too),
        else ``(entries, t)`` as given."""
        ref = self.ref
        if ref is None or entries is ref:
            return entries, t
        x = len(ref) - (len(entries) - t)
        if 0 <= x <= len(ref) and entries[t:] == ref[x:]:  # (mostly the very objects: compared by identity first)
            return ref, x
        return entries, t

    def get(self, entries: list[dict]) -> TailIndex:
        hit = self._by_id.get(id(entries))
        if hit is not None and hit[0] is entries:
            return hit[1]
        if len(self._by_id) >= self.size:
            self._by_id.clear()
        idx = TailIndex(entries, self.scn, self.wf)
        self._by_id[id(entries)] = (entries, idx)
        return idx


def position_lines(
    fold: LedgerFold, own: list[tuple[list, int, int]], seq_base: int, tail: tuple[list, int] | None, tails: TailCache
) -> list[str]:
    """The ledger checks of ``prefix + own pieces + tail[0][tail[1]:]``, the prefix's fold being ``fold``
    (a fork, changed here): the pieces ``(entries, start, stop)`` and the tail are renumbered from
    ``seq_base`` on (as ``Ledger`` splices them)."""
    seq = seq_base
    for entries, start, stop in own:
        fold.feed(entries, start, stop, seq)
        seq += max(0, stop - start)
    if tail is not None:
        entries, t = tails.canonical(*tail)
        if tails.get(entries).fast_clean(fold, t):
            return []
        fold.feed(entries, t, len(entries), seq)
    return fold.lines()
