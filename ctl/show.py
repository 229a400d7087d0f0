"""``ctl show train/<name>``: the run as tables (segments with their evaluations; validation frames).

One row per segment: its end step, state, checkpoint, train loss, time taken, attempts, and
one column per evaluation suite with its headline figure (``ppl 7.41``). When the spec has
held-out validation, a second table lists every frame of ``metrics.jsonl`` that carries
``val/*`` metrics. A warning a frame carries (GRPO without a learning signal for a whole window:
tinyllm/objectives/no_signal.py) is one line under the segments (``warnings`` in ``--json``).
Each kept attempt output (``ctl logs``) is counted, with the newest one's folder (``logs`` in ``--json``).
``--json`` prints the same as objects (``RunView`` segments, frames).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import workflows
from tinyllm.sinks import mlflow_sink, tracing
from tinyllm.objectives.no_signal import warning_text

from contracts.layout import RunHome

from .logs import run_logs
from app.runview import RunView, fmt_duration, headline, local_time, read_frames, stopped_early_text
from .tables import align
from simulator.proving.record import verdict_line, verdict_of


def segment_table(view: RunView) -> list[str]:
    header = ["SEG", "END STEP", "STATE", "CHECKPOINT", "TRAIN LOSS", "TIME", "ATTEMPTS", *view.suites]
    body = []
    for s in view.segments:
        loss = f"{s.final_loss:.4f}" if isinstance(s.final_loss, (int, float)) else "-"
        took = "earlier run" if s.reused else (fmt_duration(s.duration_s) if s.duration_s is not None else "-")
        row = [
            f"{s.index}/{len(view.segments)}",
            str(s.until),
            s.state,
            s.checkpoint or "-",
            loss,
            took,
            str(s.attempts) if s.attempts else "-",
        ]
        for ev in s.evals:
            row.append(headline(ev.suite, ev.metrics) if ev.state == "done" else ev.state)
        body.append(row)
    return align(header, body, right=(1, 6))


def validation_frames(frames: list[dict]) -> list[dict]:
    return [f for f in frames if any(k.startswith("val/") for k in f)]


def validation_table(frames: list[dict]) -> list[str]:
    keys = sorted({k for f in frames for k in f if k.startswith("val/")})
    body = []
    for f in frames:
        loss = f.get("train/loss")
        body.append(
            [str(f["step"]), f"{loss:.4f}" if isinstance(loss, (int, float)) else "-"]
            + [f"{f[k]:.4g}" if isinstance(f.get(k), (int, float)) else "-" for k in keys]
        )
    return align(["STEP", "TRAIN LOSS", *keys], body, right=(0,))


def show(view: RunView, home: Path, spec: dict[str, Any], trace: dict | None = None) -> tuple[list[str], dict]:
    """(lines, json) of ``ctl show`` for a run (``trace``: the one its history records, if any)."""
    frames = read_frames(RunHome(home).run(view.name).metrics)
    lines = [
        f"{view.workflow_id}: {view.state}; {view.total_steps} steps in {len(view.segments)} segment(s); "
        f"suites {', '.join(view.suites) or 'none'}",
        *segment_table(view),
    ]
    lines += selection_lines(view)
    lines += [
        f"  preempted: {p.get('activity_id')} attempt {p.get('attempt')} by {p.get('signal')} at "
        f"{local_time(p['time'], date=True)}: "
        + (f"saved step {p.get('step')}" if p.get("step") is not None else "no checkpoint")
        + (f" ({p.get('steps_lost')} steps lost)" if p.get("steps_lost") is not None else "")
        + (", killed at the grace" if p.get("killed_at_grace") else "")
        for p in view.preemptions
    ]
    final = final_of(view)
    if final is not None:
        lines.append(f"  {final_line(final, view.state)}")
    warnings = [{"step": f["step"], "text": t} for f in frames if (t := warning_text(f))]
    lines += [f"  warning at step {w['step']}: {w['text']}" for w in warnings]
    releases = workflows.list_releases(home, view.name)  # ctl release (workflows/release.py)
    lines += [f"  release {r['path']}{' (CURRENT)' if r['current'] else ''}: {r['checkpoint']}" for r in releases]
    val = validation_frames(frames) if spec.get("validation") else []
    if spec.get("validation"):
        lines += ["", f"validation ({len(val)} frame(s)):", *(validation_table(val) if val else ["  none yet"])]
    data = {
        "workflow_id": view.workflow_id,
        "state": view.state,
        "name": view.name,
        "total_steps": view.total_steps,
        "suites": view.suites,
        "segments": [s.to_json() for s in view.segments],
        "validation_frames": val,
        "preemptions": view.preemptions,
    }
    if final is not None:
        data["final"] = final
    if warnings:
        data["warnings"] = warnings
    if releases:
        data["releases"] = releases
    if (proof := verdict_of(home, spec)) is not None:  # a spec's own trainer: what ctl verify-resume proved
        lines.append(f"  {verdict_line(proof)}")
        data["resume_proof"] = proof
    data.update(
        {
            k: v
            for k, v in (("stopped_early", view.stopped_early), ("best_checkpoints", view.best_checkpoints))
            if v is not None
        }
    )
    sink = mlflow_sink.read_state(RunHome(home).run(view.name).path)
    if sink is not None:  # the spec's sinks.mlflow: where its run is, and whether it fell behind
        last = frames[-1]["step"] if frames else None
        lines += [
            "",
            f"mlflow: run {sink.get('run_id')} in experiment {sink.get('experiment')!r} at "
            f"{sink.get('tracking_uri')}; delivered up to step {sink.get('delivered_step')}"
            + (f"; status {sink['run_status']}" if sink.get("run_status") else ""),
        ]
        if (why := mlflow_sink.behind(sink, last)) is not None:
            lines.append(f"  {why}")
        data["sinks"] = {"mlflow": {**sink, "behind": why}}
    kept = run_logs(home, view.name)  # each attempt's stdout/stderr (ctl/logs.py)
    if kept:
        newest = max(kept, key=lambda a: a.directory.stat().st_mtime_ns)
        lines += [
            "",
            f"output: {len(kept)} attempt(s) kept under runs/{view.name}/activity/*/logs/; newest "
            f"{newest.directory.relative_to(home)}/ (`ctl logs train/{view.name}`; --activity ID --attempt N)",
        ]
        data["logs"] = [
            {
                "activity_id": a.activity_id,
                "generation": a.generation,
                "attempt": a.attempt,
                "path": str(a.directory.relative_to(home)),
            }
            for a in kept
        ]
    if (traced := trace_info(trace, RunHome(home).run(view.name).path)) is not None:
        lines += ["", f"trace: {traced['trace_id']} (spans sent to {', '.join(traced['sent_to']) or 'nowhere yet'})"]
        data["trace"] = traced
    return lines, data


def final_of(view: RunView) -> dict | None:
    """The last finished segment's end: step, checkpoint, loss (``float.hex``, bit for bit) and checkpoint
    digest, the figures users compare between runs (None before any segment finished)."""
    done = [s for s in view.segments if s.state == "done" and (s.final_loss_hex or s.digest)]
    if not done:
        return None
    s = max(done, key=lambda x: x.until)
    return {
        "step": view.last_checkpoint_step if s.checkpoint == view.last_checkpoint else s.until,
        "checkpoint": s.checkpoint,
        "final_loss": s.final_loss,
        "final_loss_hex": s.final_loss_hex,
        "digest": s.digest,
    }


def final_line(final: dict, state: str) -> str:
    loss = final.get("final_loss")
    shown = f" ({loss:.6f})" if isinstance(loss, (int, float)) else ""
    what = "final" if state == "completed" else "last finished segment"
    return (
        f"{what}: step {final.get('step')} loss {final.get('final_loss_hex') or '-'}{shown} "
        f"digest {final.get('digest') or '-'}"
    )


def trace_info(trace: dict | None, run_dir: Path) -> dict | None:
    """The run's OpenTelemetry trace id (recorded in its history, else in ctl's mark) and where its spans went."""
    mark = tracing.read_mark(run_dir)
    trace_id = (trace or {}).get("trace_id") or mark.get("trace_id")
    if not trace_id:
        return None
    return {"trace_id": trace_id, "sent_to": sorted(mark.get("destinations") or {})}


def selection_lines(view: RunView) -> list[str]:
    """Model selection (tinyllm/selection.py): the best checkpoint(s), marked, and an early stop."""
    out = [
        f"  best: {b.get('checkpoint') or 'step ' + str(b.get('step'))} ({b.get('metric')} {b.get('value'):.4g})  <- best"
        for b in view.best_checkpoints or []
        if isinstance(b, dict) and isinstance(b.get("value"), (int, float))
    ]
    if view.stopped_early is not None:
        out.append(f"  {stopped_early_text(view.stopped_early)}")
    return out
