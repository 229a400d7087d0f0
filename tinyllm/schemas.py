"""JSON Schemas of tinyllm's specs and results, generated from the pydantic models.

``python -m tinyllm.schemas --write`` regenerates ``contracts/*.schema.json``;
``python -m tinyllm.schemas --check`` exits 1 when a file is out of date (the tests do the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .spec import CorpusSpec, EvalSpec, EvalSummary, TrainSpec
from .trainer_spec import CustomTrainSpec

CONTRACTS = Path(__file__).resolve().parent.parent / "contracts"

MODELS = {
    "train-spec.schema.json": TrainSpec,
    "custom-train-spec.schema.json": CustomTrainSpec,  # a spec naming its own "trainer"
    "corpus-spec.schema.json": CorpusSpec,
    "eval-spec.schema.json": EvalSpec,
    "eval-result.schema.json": EvalSummary,  # summary.json; each results.jsonl line is its $defs/EvalResult
}


def render(model) -> str:
    schema = model.model_json_schema()
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"tinyllm/{model.__name__}", **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def stale(folder: Path = CONTRACTS) -> list[str]:
    return [
        name
        for name, model in MODELS.items()
        if not (folder / name).exists() or (folder / name).read_text() != render(model)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="regenerate the schema files")
    parser.add_argument("--check", action="store_true", help="exit 1 when a schema file is out of date")
    args = parser.parse_args(argv)
    if args.write:
        for name, model in MODELS.items():
            (CONTRACTS / name).write_text(render(model))
            print(f"wrote contracts/{name}")
        return 0
    out = stale()
    for name in out:
        print(f"contracts/{name} is out of date: run python -m tinyllm.schemas --write", file=sys.stderr)
    return 1 if out else 0


if __name__ == "__main__":
    sys.exit(main())
