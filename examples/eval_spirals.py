"""The durable example's `eval_command`: accuracy of each subject checkpoint on held-out spirals.

Called by EvalSuite's `eval` activity as `python examples/eval_spirals.py --spec FILE --home DIR --progress FILE`
with one suite's eval spec ({"name", "suite", "subjects": [{"id", "model"}], "seed", "tag"?, ...}).
It rebuilds each model from the config recorded in its checkpoint's manifest, writes
evals/<suite>/<run>/results.jsonl and summary.json, and prints the contract's result line.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from plain_train import build, spirals
from tinyllm.checkpoint import CheckpointError, load_checkpoint, write_text_atomic


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--home", required=True)
    p.add_argument("--progress", default=None)  # liveness: a line per subject evaluated
    args = p.parse_args()
    spec, home = json.loads(Path(args.spec).read_text()), Path(args.home)
    run = f"{spec['name']}-{spec['tag']}" if spec.get("tag") else spec["name"]
    rows = []
    for subject in spec["subjects"]:
        path = Path(subject["model"]) if Path(subject["model"]).is_absolute() else home / subject["model"]
        try:
            comps, manifest = load_checkpoint(path)
        except CheckpointError as e:
            print(f"eval_spirals: {e}", file=sys.stderr)
            sys.exit(2)
        trained = manifest["meta"]["trajectory"]
        model = build(trained.get("config", {}))[0]
        model.load_state_dict(comps["model"])
        model.eval()
        x, y = spirals(400, trained.get("seed", 0) + 1000).tensors  # held out: another seed
        with torch.no_grad():
            acc = (model(x).argmax(dim=1) == y).float().mean().item()
        rows.append({"suite": spec["suite"], "run": run, "subject": subject["id"], "model": subject["model"],
                     "step": manifest["step"], "task": "spirals", "metric": "acc", "value": acc,
                     "value_hex": acc.hex(), "n": len(y)})
        if args.progress:
            with open(args.progress, "a") as f:
                f.write(json.dumps({"event": "evaluated", "subject": subject["id"]}) + "\n")
    out = home / "evals" / spec["suite"] / run
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "results.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    summary = {"suite": spec["suite"], "run": run, "name": spec["name"], "results": rows,
               "metrics": {r["subject"]: {"spirals/acc": r["value"]} for r in rows}}
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(json.dumps({"suite": spec["suite"], "run": run, "results": str(out.relative_to(home) / "results.jsonl"),
                      "summary_path": str(out.relative_to(home) / "summary.json"), "summary": summary}, sort_keys=True))


if __name__ == "__main__":
    main()
