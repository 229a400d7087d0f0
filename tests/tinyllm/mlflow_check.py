"""Reading an MLflow run back against metrics.jsonl (the tracking tests' one comparison)."""

from __future__ import annotations

import json
from pathlib import Path


def history_vs_jsonl(uri: str, run_dir: Path) -> tuple[dict, dict]:
    """({key: {step: value}} from MLflow, the same from metrics.jsonl); raises on a step logged twice.

    ``timer/*`` values are wall-clock readings: of a step redone after a resume, MLflow keeps the first
    attempt's (delivered once), metrics.jsonl the redo's. Their steps are compared, not their values."""
    from mlflow.tracking import MlflowClient

    state = json.loads((run_dir / "sinks" / "mlflow.json").read_text())
    client = MlflowClient(uri)
    run = client.get_run(state["run_id"])
    got: dict = {}
    for key in run.data.metrics:
        if key.startswith("eval/"):
            continue
        hist = client.get_metric_history(state["run_id"], key)
        steps = [m.step for m in hist]
        assert len(steps) == len(set(steps)), f"{key}: a step logged twice: {sorted(steps)}"
        got[key] = {m.step: m.value for m in hist}
    frames = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    want: dict = {}
    for f in frames:
        for k, v in f.items():
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                want.setdefault(k, {})[f["step"]] = float(v)
    for table in (got, want):
        for key in table:
            if key.startswith("timer/"):
                table[key] = dict.fromkeys(table[key], "timer")
    return got, want
