"""``ctl history ID`` as a table: seq, ISO local time, event, activity#attempt, the details that matter.

Details per event: the spec's name/steps/eval_every/suites when the workflow starts; the worker
that started an attempt; a heartbeat's step, loss and checkpoint; a finished segment's step,
loss and checkpoint; an evaluation's figures; an error's class and first message line (and
whether it is retried); a timer's local fire time and length. ``--json`` is not built here
(it prints the events in full, unchanged).
"""

from __future__ import annotations

from typing import Any

from contracts.activity_ids import CORPUS_PREFIX, is_eval, is_train

from app.runview import figures_text, first_subject_metrics, local_time
from .tables import align


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = str(err.get("message", "")).strip().splitlines()
        return f"{err.get('type', 'Error')}: {msg[0] if msg else ''}"
    return str(err).splitlines()[0] if err else ""


def _loss(value: Any) -> str:
    return f"loss {value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def details(e: Any) -> str:
    """The one-line details of event ``e`` (empty when there is nothing worth saying)."""
    a = e.attrs if isinstance(e.attrs, dict) else {}
    aid = str(a.get("activity_id", ""))
    t = e.type
    if t == "workflow_started":
        inp = a.get("input") or {}
        spec = inp.get("spec") if isinstance(inp, dict) else None
        if isinstance(spec, dict):
            parts = [
                f"{a.get('workflow', '')} {spec.get('name', '')}",
                f"steps {spec.get('steps')}",
                f"eval_every {spec.get('eval_every', 0)}",
            ]
            suites = inp.get("eval_suites")
            if suites:
                parts.append("suites " + ",".join(suites))
            prior = inp.get("prior") or {}
            if prior.get("train") or prior.get("evals"):
                parts.append(
                    f"continues {len(prior.get('train') or {})} segment(s), "
                    f"{len(prior.get('evals') or {})} evaluation(s) done earlier"
                )
            return "; ".join(parts)
        return str(a.get("workflow", ""))
    if t == "activity_scheduled":
        return str(a.get("name", ""))
    if t == "activity_started":
        return f"worker {a.get('worker')}" if a.get("worker") else ""
    if t == "activity_heartbeat":
        d = a.get("details")
        if isinstance(d, dict):
            return " ".join(
                x
                for x in (
                    f"step {d['step']}" if "step" in d else "",
                    _loss(d.get("loss")),
                    f"checkpoint {d['checkpoint']}" if d.get("checkpoint") else "",
                )
                if x
            )
        return ""
    if t == "activity_completed":
        r = a.get("result")
        if not isinstance(r, dict):
            return ""
        if is_train(aid):
            resumed = f" (resumed from {r['resumed_from']})" if r.get("resumed_from") else ""
            refused = "".join(
                f"; refused checkpoint {x.get('checkpoint')}: {x.get('reason')}"
                for x in r.get("refused_checkpoints") or []
                if isinstance(x, dict)
            )
            return (
                f"step {r.get('steps')} {_loss(r.get('final_loss'))} checkpoint {r.get('checkpoint')}{resumed}{refused}"
            )
        if is_eval(aid):
            return f"{r.get('suite', '')}: {figures_text(first_subject_metrics(r)) or 'done'}"
        if aid.startswith(CORPUS_PREFIX):
            return f"corpus {r.get('name', '')}: {r.get('tokens', '?')} tokens"
        return ""
    if t in ("activity_failed", "activity_timed_out"):
        retry = "failed for good" if a.get("final") else "will retry"
        return f"{_error_text(a.get('error'))} ({retry})"
    if t == "activity_preempted":
        saved = f"saved step {a.get('step')}" if a.get("step") is not None else "no checkpoint"
        lost = f", {a.get('steps_lost')} steps lost" if a.get("steps_lost") is not None else ""
        grace = "; killed at the grace" if a.get("killed_at_grace") else ""
        return f"preempted by {a.get('signal')}: {saved}{lost}{grace} (no retry counted)"
    if t == "preempted":
        return f"stopped by {a.get('signal')} while {a.get('waiting_on') or 'nothing ran'}"
    if t == "activity_canceled":
        return _error_text(a.get("error")) if a.get("error") else ""
    if t == "timer_started":
        fire = a.get("fire_at")
        when = f"fires at {local_time(fire)}" if isinstance(fire, (int, float)) else ""
        return f"{when} ({a.get('seconds')} s)"
    if t == "workflow_completed":
        r = a.get("result")
        if isinstance(r, dict) and "final_loss_hex" in r:
            return f"step {r.get('steps')} final_loss_hex {r.get('final_loss_hex')} checkpoint {r.get('checkpoint')}"
        return ""
    if t in ("workflow_failed", "workflow_canceled"):
        return _error_text(a.get("error"))
    return ""


def rows(events: list[Any]) -> list[tuple[str, str, str, str, str]]:
    out = []
    for e in events:
        a = e.attrs if isinstance(e.attrs, dict) else {}
        act = str(a.get("activity_id", ""))
        if act and "attempt" in a:
            act += f"#{a['attempt']}"
        out.append((str(e.seq), local_time(e.time, date=True), e.type, act, details(e)))
    return out


def table(events: list[Any]) -> list[str]:
    """Aligned lines (a header, then one per event)."""
    return align(("SEQ", "TIME", "EVENT", "ACTIVITY", "DETAILS"), rows(events), right=(0,))
