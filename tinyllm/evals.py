"""Evaluation suites over checkpoints: ``ppl`` (held-out perplexity) and ``zoo`` (small tasks).

ppl: token-weighted mean negative log-likelihood over ``corpora/<corpus>/heldout.bin`` in
consecutive non-overlapping windows of the model's block size (``max_items`` windows sampled by
``seed`` when set); reports ``loss`` (nats/token), ``ppl`` = exp(loss), ``bpb`` (bits per token: per
byte for the byte tokenizer, per character for char).

Tokenizer: each subject encodes with the vocabulary its checkpoint pins (``meta.tokenizer``; absent:
byte). ppl refuses a corpus whose held-out ids are of another vocabulary; zoo refuses, before any
item is scored, an item with a character outside a char-level subject's vocabulary.

zoo: the tasks shipped in ``tinyllm/data/zoo/*.jsonl``, lm-evaluation-harness-like:
``multiple_choice`` items (``context``, ``choices``, ``gold``) scored by the log-likelihood of each
continuation (``acc``: highest sum, ``acc_norm``: highest per byte) and ``generate`` items
(``context``, ``target``, ``until``, ``max_new_tokens``) decoded greedily and scored by exact match.

Progress (``--progress``): a ``ready`` line ``{"done": 0, "of", "unit"}`` once the subjects are
loaded, then ``progress`` lines with ``done``/``of`` counted over the whole suite (every subject,
every task) in ``unit``s (``windows`` of held-out text for ppl, ``items`` for zoo), at most one
every ``progress.PROGRESS_EVERY_S`` and one at the end of each subject.

Outputs are a pure function of (checkpoints, spec): no timestamps, fixed threads, so a repeat is
byte-identical. Writes ``evals/<suite>/<run>/results.jsonl`` + ``summary.json`` atomically, then
``complete.json`` (the spec): a repeat of the same spec returns those outputs without rewriting them.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from contracts.layout import CKPT, MANIFEST, RunHome

from . import faults, progress, tokenizer
from .sinks import mlflow_sink
from .checkpoint import CheckpointError, load_checkpoint, write_text_atomic
from .corpus import open_corpus
from .errors import STOP, StopRequested, signal_name
from .model import GPT
from .runtime_env import use_deterministic_algorithms
from .spec import EvalResult, EvalSpec, EvalSubject, EvalSummary, ModelConfig, SpecError

_MASK64 = (1 << 64) - 1


def load_subject(home: Path, subject: EvalSubject) -> tuple[GPT, int]:
    """The subject's model (eval mode) and its training step; bad checkpoints are bad input.
    ``subject_tokenizer`` gives the vocabulary it was trained with."""
    path = Path(subject.model) if os.path.isabs(subject.model) else home / subject.model
    if not path.is_dir():
        raise SpecError(f"subject {subject.id!r}: checkpoint not found: {path}")
    try:
        components, manifest = load_checkpoint(path)
        cfg = ModelConfig.model_validate(manifest["meta"]["trajectory"]["model"])
    except CheckpointError as e:
        raise SpecError(f"subject {subject.id!r}: {e}") from None
    except (KeyError, TypeError, ValueError):
        raise SpecError(f"subject {subject.id!r}: {path} has no model config in its manifest") from None
    if "model" not in components:
        raise SpecError(f"subject {subject.id!r}: {path} holds no model")
    try:
        tok = tokenizer.from_identity(manifest["meta"].get("tokenizer"))  # absent: byte (older checkpoints)
    except (ValueError, AttributeError) as e:
        raise SpecError(f"subject {subject.id!r}: {path} has an unusable tokenizer record ({e})") from None
    model = GPT(cfg)
    model.load_state_dict(components["model"])
    model.eval()
    # the vocabulary every text of this subject is encoded with
    model.tok = tok  # type: ignore[assignment]  # torch's stub types Module attributes Tensor | Module; any value is legal
    return model, int(manifest["step"])


def subject_tokenizer(model: GPT) -> tokenizer.Tokenizer:
    return getattr(model, "tok", tokenizer.BYTE)


def _sample(n: int, k: int | None, seed: int, salt: str) -> list[int]:
    """All indices, or ``k`` of them chosen by (seed, salt), in ascending order."""
    if k is None or k >= n:
        return list(range(n))
    rng = np.random.default_rng([seed & _MASK64, zlib.crc32(salt.encode())])
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


def check_stop(where: str) -> None:
    """``StopRequested`` when a stop signal arrived (the CLI's handler set the flag): exit 130."""
    if STOP["requested"]:
        progress.event("stopping", signal=signal_name(STOP["signal"]), where=where)
        raise StopRequested(
            f"evaluation stopped by {signal_name(STOP['signal'])} {where}; nothing written "
            "(the same command runs the suite again)"
        )


class Count:
    """How far a suite is: ``done`` of ``of`` units over all its subjects, in the progress file."""

    hold_folder: Path | None = None  # set by run_eval (eval.hold's file goes there)

    def __init__(self, of: int, unit: str):
        self.done, self.of, self.unit = 0, of, unit
        progress.event("ready", done=0, of=of, unit=unit)

    def add(self, n: int = 1) -> None:
        """``n`` more units done: a timed progress line; a stop signal since (SIGTERM, SIGINT,
        $DURABLE_STOP_SIGNAL) abandons the suite here, before any file is written (StopRequested)."""
        assert n >= 0
        self.done = min(self.of, self.done + n)
        progress.tick(done=self.done, of=self.of, unit=self.unit)
        if self.hold_folder is not None:  # tests only (TINYLLM_FAULT=eval.hold@N): a signal lands here
            faults.hold_at("eval.hold", self.done, self.hold_folder, lambda: bool(STOP["requested"]))
        check_stop(f"after {self.done} of {self.of} {self.unit}")

    def subject_done(self) -> None:
        """A subject is finished: a progress line now."""
        progress.event("progress", done=self.done, of=self.of, unit=self.unit)


# -- ppl ---------------------------------------------------------------------------------------


def heldout_windows(n_tokens: int, block_size: int, max_items: int | None, seed: int) -> list[int]:
    """Start offsets of the held-out windows scored (all, or ``max_items`` sampled by ``seed``)."""
    starts = list(range(0, n_tokens - 1, block_size))
    return [starts[i] for i in _sample(len(starts), max_items, seed, "ppl")]


@torch.no_grad()
def heldout_nll(
    model: GPT, tokens: np.ndarray, max_items: int | None, seed: int, batch: int = 32, count_to: Count | None = None
) -> tuple[float, int]:
    """(sum of token NLL in nats, token count) over the held-out windows (each one added to ``count_to``)."""
    T = model.cfg.block_size
    chosen = heldout_windows(len(tokens), T, max_items, seed)
    total, count = 0.0, 0
    full = [s for s in chosen if s + T + 1 <= len(tokens)]
    for i in range(0, len(full), batch):
        rows = np.stack([np.asarray(tokens[s : s + T + 1], dtype=np.int64) for s in full[i : i + batch]])  # (B, T+1)
        x, y = torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])
        logits, _ = model(x)  # (B, T, V)
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").double().item()
        count += y.numel()
        if count_to is not None:
            count_to.add(len(rows))
    for s in chosen:  # the last, shorter window
        if s + T + 1 > len(tokens):
            row = torch.from_numpy(np.asarray(tokens[s:], dtype=np.int64))[None]  # (1, t+1)
            logits, _ = model(row[:, :-1])
            total += F.cross_entropy(logits[0], row[0, 1:], reduction="sum").double().item()
            count += row.size(1) - 1
            if count_to is not None:
                count_to.add(1)
    return total, count


def check_ppl_corpus(spec: EvalSpec, meta: dict, models: dict) -> None:
    """held-out ids mean something only in the vocabulary they were built with: each subject's must be
    the corpus's (a byte model on a char corpus, or another char vocabulary, is refused before work)."""
    try:
        theirs = tokenizer.from_corpus_meta(meta)
    except ValueError as e:
        raise SpecError(f"corpus {spec.corpus!r}: its meta.json tokenizer is unusable ({e}); rebuild it") from None
    for subject in spec.subjects:
        mine = subject_tokenizer(models[subject.id][0])
        if mine.identity() != theirs.identity():
            raise SpecError(
                f"subject {subject.id!r} was trained with the {mine.describe()}, but corpus "
                f"{spec.corpus!r} holds ids of the {theirs.describe()}; evaluate it on its own corpus"
            )


def run_ppl(spec: EvalSpec, home: Path, models: dict) -> list[EvalResult]:
    tokens, meta = open_corpus(home, spec.corpus, "heldout")
    check_ppl_corpus(spec, meta, models)
    rows = []
    windows = Count(
        sum(
            len(heldout_windows(len(tokens), models[s.id][0].cfg.block_size, spec.max_items, spec.seed))
            for s in spec.subjects
        ),
        "windows",
    )
    for subject in spec.subjects:
        model, step = models[subject.id]
        nll, n = heldout_nll(model, tokens, spec.max_items, spec.seed, count_to=windows)
        windows.subject_done()
        loss = nll / n
        for metric, value in (("loss", loss), ("ppl", math.exp(loss)), ("bpb", loss / math.log(2))):
            rows.append(_row(spec, subject, step, "heldout", metric, value, n))
    return rows


# -- zoo ---------------------------------------------------------------------------------------


def zoo_tasks() -> dict[str, list[dict]]:
    """Task name -> items, from the package's data/zoo/*.jsonl (sorted by task name)."""
    tasks = {}
    folder = resources.files("tinyllm").joinpath("data/zoo")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".jsonl"):
            tasks[entry.name[:-6]] = [
                json.loads(line) for line in entry.read_text(encoding="utf-8").splitlines() if line.strip()
            ]
    return tasks


@torch.no_grad()
def continuation_logprob(model: GPT, context: str, continuation: str) -> float:
    """Sum of log p(continuation tokens | context), context cut from the left to fit the block."""
    tok = subject_tokenizer(model)
    ctx, cont = tok.encode(context).astype(np.int64), tok.encode(continuation).astype(np.int64)
    seq = np.concatenate([ctx, cont])[-(model.cfg.block_size + 1) :]
    x = torch.from_numpy(seq[:-1])[None]  # (1, t)
    logits, _ = model(x)
    logp = F.log_softmax(logits[0, -len(cont) :].double(), dim=-1)  # (len(cont), V)
    target = torch.from_numpy(seq[-len(cont) :])
    return logp.gather(1, target[:, None]).sum().item()


@torch.no_grad()
def greedy_generate(model: GPT, context: str, max_new_tokens: int, until: list[str]) -> str:
    tok = subject_tokenizer(model)
    ids = list(tok.encode(context).astype(np.int64))
    out: list[int] = []
    for _ in range(max_new_tokens):
        x = torch.tensor(ids[-model.cfg.block_size :], dtype=torch.long)[None]
        logits, _ = model(x)
        nxt = int(torch.argmax(logits[0, -1]).item())  # ties: the lowest id
        ids.append(nxt)
        out.append(nxt)
        text = tok.decode(out)
        if any(u in text for u in until):
            break
    text = tok.decode(out)
    for u in until:
        text = text.split(u)[0] if u else text
    return text


def score_task(model: GPT, items: list[dict], count_to: Count | None = None) -> dict[str, float]:
    """The task's metrics over ``items`` (each one added to ``count_to`` once scored)."""
    kind = items[0]["type"]
    add = count_to.add if count_to is not None else (lambda n=1: None)
    if kind == "multiple_choice":
        acc = acc_norm = 0
        for item in items:
            lls = [continuation_logprob(model, item["context"], c) for c in item["choices"]]
            norm = [ll / max(1, len(c.encode())) for ll, c in zip(lls, item["choices"])]
            acc += int(max(range(len(lls)), key=lambda i: (lls[i], -i)) == item["gold"])
            acc_norm += int(max(range(len(norm)), key=lambda i: (norm[i], -i)) == item["gold"])
            add()
        return {"acc": acc / len(items), "acc_norm": acc_norm / len(items)}
    if kind == "generate":
        hits = 0
        for it in items:
            out = greedy_generate(model, it["context"], it.get("max_new_tokens", 16), it.get("until", ["\n"]))
            hits += out.strip() == it["target"].strip()
            add()
        return {"exact_match": hits / len(items)}
    raise SpecError(f"zoo task item type {kind!r} is unknown")


def check_zoo_texts(spec: EvalSpec, tasks: dict[str, list[dict]], models: dict) -> None:
    """Every text a subject would read must encode in its vocabulary: a char-level subject and an item
    with a character outside it is one bad-input line before any item is scored."""
    for subject in spec.subjects:
        tok = subject_tokenizer(models[subject.id][0])
        if tok.kind == "byte":
            continue
        for task, chosen in tasks.items():
            for n, item in enumerate(chosen, start=1):
                texts = [item.get("context", "")] + list(item.get("choices", []))
                for text in texts:
                    try:
                        tok.check(text, f"zoo task {task!r} item {n} for subject {subject.id!r}")
                    except tokenizer.UnknownCharacter as e:
                        raise SpecError(
                            f"{e}; the zoo suite needs a byte-level subject or a corpus holding "
                            "every character of its tasks"
                        ) from None


def run_zoo(spec: EvalSpec, models: dict) -> list[EvalResult]:
    rows = []
    tasks = {
        task: [items[i] for i in _sample(len(items), spec.max_items, spec.seed, task)]
        for task, items in zoo_tasks().items()
    }
    check_zoo_texts(spec, tasks, models)
    count = Count(len(spec.subjects) * sum(len(chosen) for chosen in tasks.values()), "items")
    for subject in spec.subjects:
        model, step = models[subject.id]
        for task, chosen in tasks.items():
            for metric, value in score_task(model, chosen, count).items():
                rows.append(_row(spec, subject, step, task, metric, value, len(chosen)))
        count.subject_done()
    return rows


# -- the command -------------------------------------------------------------------------------


def _row(spec: EvalSpec, subject: EvalSubject, step: int, task: str, metric: str, value: float, n: int) -> EvalResult:
    return EvalResult(
        suite=spec.suite,
        run=spec.run,
        subject=subject.id,
        model=subject.model,
        step=step,
        task=task,
        metric=metric,
        value=value,
        value_hex=float(value).hex(),
        n=n,
    )


COMPLETE = "complete.json"
"""Written last, holding the eval spec: the outputs beside it are complete for exactly that spec."""


def _result(spec: EvalSpec, home: Path, out: Path, summary: dict) -> dict:
    return {
        "suite": spec.suite,
        "run": spec.run,
        "results": str((out / "results.jsonl").relative_to(home)),
        "summary_path": str((out / "summary.json").relative_to(home)),
        "summary": summary,
    }


def finished_before(spec: EvalSpec, home: Path) -> dict | None:
    """The result of an earlier run of exactly this spec whose outputs are complete, else None.

    An evaluation killed after writing its files but before its result was recorded is then
    not run again, and its outputs are never rewritten (each checkpoint is evaluated once).
    """
    out = RunHome(home).eval_dir(spec.suite, spec.run)
    try:
        done = json.loads((out / COMPLETE).read_text(encoding="utf-8"))
        if done != spec.model_dump(mode="json"):
            return None
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (out / "results.jsonl").is_file():
        return None
    return _result(spec, home, out, summary)


def deliver_to_trackers(spec: EvalSpec, home: Path, metrics: dict[str, dict[str, float]]) -> None:
    """Each subject that is a checkpoint of a run with an MLflow sink gets its figures logged there, at the
    checkpoint's step, once (tinyllm/sinks/mlflow_sink.py). Called after the files are complete, and again when an
    earlier complete run is reused (a kill may have come between the files and the delivery)."""
    for subject in spec.subjects:
        path = Path(subject.model) if os.path.isabs(subject.model) else home / subject.model
        run_dir = path.parent.parent
        if path.parent.name != CKPT or not mlflow_sink.state_path(run_dir).is_file():
            continue  # no MLflow sink on that run: mlflow is not imported
        try:
            manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
            step = int(manifest["step"])
            digest = manifest["files"]["model.pt"]["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        mlflow_sink.log_evaluation(
            run_dir,
            step,
            spec.suite,
            metrics.get(subject.id, {}),
            str(path.relative_to(home)) if path.is_relative_to(home) else str(path),
            digest,
        )


def run_eval(spec: EvalSpec, home: Path) -> dict:
    """Run the suite, write its files, return the CLI's result object (an earlier complete run's, if any)."""
    earlier = finished_before(spec, home)
    if earlier is not None:
        deliver_to_trackers(spec, home, earlier["summary"].get("metrics", {}))
        return earlier
    try:
        faults.arm_from_env()  # tests only: a misspelled TINYLLM_FAULT would run unarmed
    except faults.FaultError as e:
        raise SpecError(str(e)) from None
    Count.hold_folder = RunHome(home).evals / spec.suite
    torch.set_num_threads(spec.threads)
    use_deterministic_algorithms()
    if spec.suite == "ppl":
        open_corpus(home, spec.corpus, "heldout")  # a missing corpus is bad input, before any work
    models = {s.id: load_subject(home, s) for s in spec.subjects}  # every subject checked first
    check_stop("before the first item")
    rows = run_ppl(spec, home, models) if spec.suite == "ppl" else run_zoo(spec, models)
    metrics: dict[str, dict[str, float]] = {}
    for r in rows:
        metrics.setdefault(r.subject, {})[f"{r.task}/{r.metric}"] = r.value
    summary = EvalSummary(
        suite=spec.suite, run=spec.run, name=spec.name, tag=spec.tag, seed=spec.seed, results=rows, metrics=metrics
    )
    out = RunHome(home).eval_dir(spec.suite, spec.run)
    check_stop("before writing its files")  # from here on the files are written to the end (a signal waits)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        out / "results.jsonl", "".join(json.dumps(r.model_dump(mode="json"), sort_keys=True) + "\n" for r in rows)
    )
    write_text_atomic(
        out / "summary.json", json.dumps(summary.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
    )
    (out / COMPLETE).unlink(missing_ok=True)  # (an older spec's marker; the files are this spec's now)
    write_text_atomic(out / COMPLETE, json.dumps(spec.model_dump(mode="json"), sort_keys=True) + "\n")
    deliver_to_trackers(spec, home, metrics)
    return _result(spec, home, out, summary.model_dump(mode="json"))
