"""``ctl doctor``: check a home folder and say what each problem means for which run.

Read-only: the database is opened with ``mode=ro`` (``engine.store.open_readonly``), files are
only read. What it checks:

* the database: SQLite's integrity check, our application and schema version, each
  workflow's row and history (every event's checksum), each activity's recorded JSON;
  activities left running by a worker that is gone (the next worker redelivers them);
* each run's checkpoints against their manifests, and its ``LATEST`` pointer;
* each corpus's files against the checksums in its ``meta.json``;
* leftover temporaries of killed or failed writes (their writer is gone).

``fix`` removes leftover temporaries only, nothing else (see ``fix`` on locks).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from contracts.layout import CKPT, LATEST, METRICS, RunHome
from contracts.manifest import CheckpointError, verify_checkpoint
from contracts.resume import DAMAGED_LATEST, list_step_dirs, read_latest
from engine import BadInput, DamagedRecord, Reader, Store, damage_report, owner_dead
from tinyllm.sinks import mlflow_sink
from tinyllm.corpus_meta import read_meta
from tinyllm.runlock import pid_running

from app import db_path

MAX_ENTRIES = 200_000  # bound on the walk for temporaries
_TEMP = re.compile(r"^\.(?:tmp|replaced)-.+-(\d+)$|^.+\.tmp-(\d+)$")  # .tmp-step-000100-PID, x.tmp-PID


@dataclass
class Finding:
    """One problem: where (relative to the home), what is wrong, what it means for which run."""

    kind: str  # damaged | stale | leftover | missing | behind (a metrics sink)
    path: str
    problem: str
    means: str
    fixable: bool = False

    def line(self) -> str:
        return f"{self.kind:<8} {self.path}: {self.problem}\n         -> {self.means}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Report:
    home: str
    findings: list[Finding]
    checked: dict[str, int]

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_json(self) -> dict:
        return {
            "home": self.home,
            "clean": self.clean,
            "checked": self.checked,
            "findings": [f.to_json() for f in self.findings],
        }


def examine(home: Path) -> Report:
    """Every check; nothing is written."""
    findings: list[Finding] = []
    checked = {"workflows": 0, "events": 0, "checkpoints": 0, "corpora": 0, "runs": 0}
    findings += _database(home, checked)
    runs = RunHome(home).runs
    for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []:
        checked["runs"] += 1
        findings += _checkpoints(home, run_dir, checked)
        findings += _sinks(home, run_dir)
    corpora = RunHome(home).corpora
    for cdir in (
        sorted(p for p in corpora.iterdir() if p.is_dir() and not p.name.startswith(".")) if corpora.is_dir() else []
    ):
        checked["corpora"] += 1
        findings += _corpus(home, cdir)
    findings += list(_temporaries(home))
    return Report(str(home), findings, checked)


def fix(home: Path, report: Report) -> list[str]:
    """Remove the fixable findings, leftover temporaries only; return what went.

    Run locks are kernel ``flock``s, released when their holder dies, so a lock file is never
    stale; a lease held by a dead worker (a stale lock of the engine) is expired by the next
    worker, as doctor never writes the database."""
    removed = []
    for f in report.findings:
        if not f.fixable:
            continue
        p = home / f.path
        if f.kind == "leftover":
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(f.path)
    return removed


# --- the database ---------------------------------------------------------------------------


def _rel(home: Path, p: Path) -> str:
    try:
        return str(p.relative_to(home))
    except ValueError:
        return str(p)


def _database(home: Path, checked: dict) -> list[Finding]:
    path = db_path(home)
    rel = _rel(home, path)
    runs = RunHome(home).runs
    has_runs = runs.is_dir() and any(p.is_dir() for p in runs.iterdir())
    if not path.exists():
        if has_runs:
            return [
                Finding(
                    "missing",
                    rel,
                    "no database, yet runs/ holds runs",
                    "their history is not here: ctl train starts a new one, resumes each run from its "
                    "checkpoints and evaluates every checkpoint again",
                )
            ]
        return []
    try:
        store = Store(path, readonly=True)
    except BadInput as err:
        return [
            Finding(
                "damaged",
                rel,
                str(err),
                "no command can read any run's history; restore the file from a backup (checkpoints "
                "and corpora are checked below; ctl train cannot continue on this file)",
            )
        ]
    findings = []
    try:
        for problem in damage_report(store.conn, limit=20):
            findings.append(
                Finding(
                    "damaged",
                    rel,
                    f"SQLite integrity check: {problem}",
                    "some records may not be readable; see the records named below",
                )
            )
        engine = Reader(store)
        rows, bad = engine.list_readable()
        for e in bad:
            findings.append(Finding("damaged", rel, _short(e), _means_for(e.workflow_id)))
        for st in rows:
            checked["workflows"] += 1
            try:
                checked["events"] += len(engine.history(st.workflow_id))
            except DamagedRecord as e:
                findings.append(Finding("damaged", rel, _short(e), _means_for(st.workflow_id)))
                continue
            findings += _activities(engine, rel, st.workflow_id)
    finally:
        store.close()
    return findings


def _short(e: Exception) -> str:
    return str(e).split("; nothing was written")[0]


def _means_for(workflow_id: str | None) -> str:
    return (
        (
            f"{workflow_id}: status, history and train refuse it (exit 2) and nothing is written; its "
            f"checkpoints under runs/ are unaffected; restore the database from a backup"
        )
        if workflow_id
        else "restore the database from a backup"
    )


def _activities(engine: Reader, rel: str, workflow_id: str) -> list[Finding]:
    assert engine.store is not None  # (doctor opens the home's own database)
    out = []
    try:
        rows = engine.store.query(
            "SELECT activity_id, state, input, options, details, owner FROM activities WHERE workflow_id=?",
            (workflow_id,),
        )
    except Exception as e:  # noqa: BLE001 - a damaged page: report, go on
        return [
            Finding(
                "damaged", rel, f"workflow {workflow_id}: its activities cannot be read ({e})", _means_for(workflow_id)
            )
        ]
    for aid, state, *blobs, owner in rows:
        for column, raw in zip(("input", "options", "details"), blobs):
            try:
                if raw is not None:
                    json.loads(raw)
            except (ValueError, TypeError):
                out.append(
                    Finding(
                        "damaged",
                        rel,
                        f"workflow {workflow_id}: activity {aid}: its {column} is not valid JSON",
                        _means_for(workflow_id),
                    )
                )
        try:
            owner_info = json.loads(owner) if owner else None
        except (ValueError, TypeError):
            owner_info = None
        if state == "running" and owner_info is not None and owner_dead(owner_info):
            out.append(
                Finding(
                    "stale",
                    rel,
                    f"workflow {workflow_id}: activity {aid} is leased to a worker that is "
                    f"gone (pid {owner_info.get('pid')})",
                    f"{workflow_id} resumes it from its last checkpoint with the next `ctl train` or "
                    f"`ctl worker` (the engine expires the lease; doctor does not write the database)",
                )
            )
    return out


# --- runs: checkpoints, LATEST, lock --------------------------------------------------------


def _checkpoints(home: Path, run_dir: Path, checked: dict) -> list[Finding]:
    # the contract's verification (sha256 against the manifest): no torch, as the trainer checks before it loads
    name = run_dir.name
    root = run_dir / CKPT
    out: list[Finding] = []
    good: list[Path] = []
    for d in list_step_dirs(root):
        checked["checkpoints"] += 1
        try:
            if verify_checkpoint(d).get("resumable"):
                good.append(d)
        except CheckpointError as e:
            out.append(Finding("damaged", _rel(home, d), str(e).split(": ", 1)[-1], ""))
    newest_good = good[0].name if good else None
    fallback = (
        f"train/{name} resumes from {newest_good} instead (later steps are trained again)"
        if newest_good
        else f"train/{name} has no valid checkpoint left and would train from step 0"
    )
    for f in out:
        f.means = f"refused on resume (never loaded); {fallback}; evaluations already recorded stand"
    latest = root / LATEST
    if latest.exists():
        target = read_latest(latest)
        tdir = root / target
        if target == DAMAGED_LATEST or not tdir.is_dir():
            what = (
                "is damaged (not a checkpoint name)"
                if target == DAMAGED_LATEST
                else f"points at {target!r}, which is not a checkpoint"
            )
            out.append(Finding("damaged", _rel(home, latest), what, f"ignored on resume; {fallback}"))
        elif tdir not in good:
            out.append(
                Finding(
                    "damaged",
                    _rel(home, latest),
                    f"points at {target}, which fails verification",
                    f"ignored on resume; {fallback}",
                )
            )
    elif good:
        out.append(
            Finding(
                "missing",
                _rel(home, latest),
                "no LATEST beside checkpoints",
                f"train/{name} resumes from the newest valid checkpoint, {newest_good}",
            )
        )
    return out


# --- corpora ----------------------------------------------------------------------------------


def _corpus(home: Path, cdir: Path) -> list[Finding]:
    meta = read_meta(cdir)
    if meta is None:
        return [
            Finding(
                "damaged",
                _rel(home, cdir / "meta.json"),
                "missing or not valid JSON",
                f"runs on corpus {cdir.name} are refused (exit 2); remove the folder and rebuild it "
                f"(ctl train builds it again from its sources)",
            )
        ]
    out = []
    for fname, key in (("tokens.bin", "tokens_sha256"), ("heldout.bin", "heldout_sha256")):
        f = cdir / fname
        try:
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                while block := fh.read(1 << 22):
                    h.update(block)
            ok = h.hexdigest() == meta.get(key)
        except OSError:
            ok = False
        if not ok:
            out.append(
                Finding(
                    "damaged",
                    _rel(home, f),
                    "missing or fails its sha256 checksum",
                    f"training and evaluation on corpus {cdir.name} refuse it (exit 2) until it is "
                    f"rebuilt; ctl train rebuilds it from its sources by itself",
                )
            )
    return out


# --- temporaries ----------------------------------------------------------------------------


def _sinks(home: Path, run_dir: Path) -> list[Finding]:
    """An MLflow sink that fell behind metrics.jsonl (tinyllm/sinks/mlflow_sink.py); the server is not contacted."""
    state = mlflow_sink.read_state(run_dir)
    frames = run_dir / METRICS
    last = None
    try:
        tail = frames.read_text(encoding="utf-8").splitlines()[-1:] if frames.is_file() else []
        last = json.loads(tail[0]).get("step") if tail else None
    except (OSError, ValueError):
        pass
    why = mlflow_sink.behind(state, last)
    if why is None:
        return []
    return [
        Finding(
            "behind",
            _rel(home, mlflow_sink.state_path(run_dir)),
            why,
            f"train/{run_dir.name}'s metrics are all in metrics.jsonl; the next train attempt delivers the rest",
        )
    ]


def temp_pid(name: str) -> int | None:
    """The writer's pid a temporary's name ends with, or None when ``name`` is not a temporary."""
    m = _TEMP.match(name)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


def _temporaries(home: Path) -> Iterator[Finding]:
    seen = 0
    for root, dirs, files in os.walk(home):
        for name in sorted(dirs) + sorted(files):
            seen += 1
            if seen > MAX_ENTRIES:
                return
            if name.startswith("engine.db"):
                continue  # SQLite's own files: only SQLite touches them
            pid = temp_pid(name)
            if pid is None or pid_running(pid):
                continue
            p = Path(root) / name
            if name in dirs:
                dirs.remove(name)
            yield Finding(
                "leftover",
                _rel(home, p),
                f"temporary of a write that did not finish (pid {pid} is gone)",
                f"{_owner_of(home, p)}: never read; takes space; --fix removes it",
                fixable=True,
            )


def _owner_of(home: Path, p: Path) -> str:
    parts = Path(_rel(home, p)).parts
    if len(parts) > 1 and parts[0] == "runs":
        return f"run {parts[1]}"
    if len(parts) > 1 and parts[0] == "corpora":
        return "the corpora"
    return "the home"
