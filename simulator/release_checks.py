"""The oracle of the simulated releases (simulator/release.py), independent of the workflow code.

The expected candidate is the run's last checkpoint (``--select latest``) or the fake early stop's
best, its figures the fake evaluator's formulas on the uninterrupted trainer's state at that step;
files and ledger are read as they are: one version per digest under ``releases/<run>/``, ``CURRENT``
naming it with the candidate's files, a failed gate leaving nothing, one publication and at most one
completed evaluation per (checkpoint digest, suite) in the ledger.
"""

from __future__ import annotations

import json
import math
from typing import Any

from contracts.layout import MANIFEST, RunHome, checkpoint_ref
import workflows

from .checks import first_difference
from .fakes import _noise, reference_state
from .release import checkpoint_digest, release_suites

WORK = ("train-start", "steps", "ckpt", "eval-start", "eval-done", "publish-start", "corpus")  # what disturbs


def expected_candidate(scn: Any) -> int:
    """The candidate's step, written independently of the workflow: the run's last checkpoint, or the
    best one of the fake early stop (tinyllm/selection.py's rule as the fake trainer plays it)."""
    if scn.select == "latest":
        return scn.final_step()
    return max(scn.checkpoint_every, scn.stop_at - 2 * scn.checkpoint_every)


def _figure(scn: Any, suite: str, step: int) -> tuple[str, float]:
    loss = reference_state(scn.spec(), step).loss
    if suite == "ppl":
        return "ppl/heldout/ppl", math.exp(loss)
    return f"{suite}/fake/acc", 1.0 / (1.0 + loss + _noise(scn.seed, step))


def check_releases(o: Any) -> list[str]:
    """The release requests of a completed run against the oracle (see the module docstring)."""
    scn = o.scenario
    if not scn.release or o.state != "completed":
        return []
    bad: list[str] = []
    rels = o.extra.get("releases") or []
    if len(rels) != len(scn.release):
        return [f"{len(rels)} release workflows ran, expected {len(scn.release)}"]
    step = expected_candidate(scn)
    ckpt = checkpoint_ref(scn.name, step)
    digest = checkpoint_digest(o.home, ckpt) if (o.home / ckpt / "state.json").exists() else None
    figures = dict(_figure(scn, s, step) for s in release_suites(scn))
    for outcome, rel in zip(scn.release, rels):
        r, wid = rel["result"] or {}, rel["workflow_id"]
        if rel["state"] != "completed":
            err = rel["error"] or {}
            bad.append(f"{wid} ended {rel['state']} ({err.get('type')}: {err.get('message')})")
            continue
        if r.get("checkpoint") != ckpt or r.get("step") != step or r.get("digest") != digest:
            bad.append(
                f"{wid} released {r.get('checkpoint')} (digest {str(r.get('digest'))[:12]}), "
                f"expected {ckpt} ({str(digest)[:12]})"
            )
        if r.get("figures") != figures:
            bad.append(f"{wid} figures {r.get('figures')} != the candidate's {figures}")
        if outcome == "pass" and not r.get("published"):
            bad.append(f"{wid}: a passing gate was not published ({r.get('reason')})")
        if outcome == "fail" and (r.get("published") or "failed" not in str(r.get("reason"))):
            bad.append(
                f"{wid}: a failing gate published {r.get('version')} or recorded no reason ({r.get('reason')!r})"
            )
        if outcome == "fail" and any(c == workflows.ACTIVITY_PUBLISH for c in rel["commands"]):
            bad.append(f"{wid}: a failing gate scheduled publish")
    bad += _check_release_files(o, digest)
    bad += _check_release_ledger(o)
    return bad


def _check_release_files(o: Any, digest: str | None) -> list[str]:
    scn = o.scenario
    root = RunHome(o.home).release_dir(scn.name)
    versions = sorted(p.name for p in root.glob("v*")) if root.is_dir() else []
    leftovers = sorted(p.name for p in root.glob(".tmp-*")) if root.is_dir() else []
    bad = [f"a publication left {leftovers[0]}"] if leftovers else []
    published = "pass" in scn.release
    if len(versions) != int(published):
        return bad + [f"releases {versions}, expected {'one' if published else 'none'} (one per digest)"]
    current = root / "CURRENT"
    if not published:
        return bad + ([f"{current} exists though nothing was published"] if current.exists() else [])
    if not current.exists():
        return bad + [f"{current} is missing"]
    name = current.read_text().strip()
    v = root / name
    try:
        manifest = json.loads((v / MANIFEST).read_text())
    except (OSError, ValueError):
        return bad + [f"CURRENT names {name}, which has no readable manifest"]
    if name != versions[0] or manifest.get("checkpoint_digest") != digest or manifest.get("version") != name:
        bad.append(
            f"CURRENT names {name} (manifest digest {str(manifest.get('checkpoint_digest'))[:12]}), "
            f"expected {versions[0]} of digest {str(digest)[:12]}"
        )
    model = v / "model" / "state.json"
    src = RunHome(o.home).checkpoint(scn.name, expected_candidate(scn)) / "state.json"
    if not model.is_file() or not src.is_file() or model.read_bytes() != src.read_bytes():
        bad.append(f"{name}/model is not the candidate checkpoint's files")
    return bad


def _check_release_ledger(o: Any) -> list[str]:
    """Publications once per digest; no suite evaluated twice for one checkpoint's digest.

    A release evaluation started again is allowed only where the worker died during the first,
    before it wrote complete outputs (at-least-once delivery cannot do better): its start, then a
    crash, with no other work between. Outputs written once are reused, never made again."""
    bad = []
    published: dict[str, int] = {}
    started: set[tuple] = set()
    done: set[tuple] = set()
    pending: dict[tuple, str] = {}  # key -> "p" (started, nothing since) or "i" (a crash came first)
    for e in o.ledger.entries:
        kind = e["kind"]
        if kind == "crash":
            pending = {k: "i" for k in pending}
            continue
        if kind in WORK:  # other work came first: a restart of what was pending is not one after a kill
            mine = (e.get("digest"), e.get("suite"))
            pending = {k: s for k, s in pending.items() if k == mine}
        if not str(e.get("wf", "")).startswith("release/"):
            continue
        if kind == "published":
            published[e["digest"]] = published.get(e["digest"], 0) + 1
            if published[e["digest"]] > 1:
                bad.append(f"digest {e['digest'][:12]} published again (v{e['version']:04d}, ledger #{e['seq']})")
        elif kind == "eval-start":
            key = (e.get("digest"), e["suite"])
            if key in done or (key in started and pending.get(key) != "i"):
                bad.append(f"suite {key[1]} evaluated again for digest {str(key[0])[:12]} (ledger #{e['seq']})")
            started.add(key)
            pending[key] = "p"
        elif kind == "eval-done":
            key = (e.get("digest"), e["suite"])
            done.add(key)
            pending.pop(key, None)
    return bad


def compare_releases(o: Any, ref: Any) -> list[str]:
    """The same release workflows, results and commands as the uninterrupted run's."""
    if not o.scenario.release or o.state != "completed":
        return []
    a, b = o.extra.get("releases") or [], ref.extra.get("releases") or []
    if a != b:
        for x, y in zip(a, b):
            if x != y:
                return [f"release {x['workflow_id']} differs from the uninterrupted run's: {first_difference(x, y)}"]
        return [f"{len(a)} release workflows, the uninterrupted run {len(b)}"]
    return []
