"""Copies of TrainRun with one of the seed's pitfalls planted (section 5); the simulator must catch each.

A mutant is the *current* ``workflows.train_run`` (and ``eval_suite``) function, copied with
its code unchanged but one of its dependencies replaced (a new function object over a patched
copy of its module globals), or run over a Runtime that plants the bug at the call site. So
the mutants follow the real workflow as it evolves; a mutant whose hook point disappeared
fails loudly (``MutantError``) instead of silently testing nothing.
"""

from __future__ import annotations

import json
import time
import types
from typing import Any, Callable

from engine import ActivityError, Canceled, StepOptions, is_canceled
import workflows
from workflows import release as rel
from workflows import (
    ACTIVITY_EVAL,
    EvalActivityInput,
    EvalSuiteInput,
    EvalSuiteResult,
    SuiteOutputs,
    TrainRunInput,
    eval_options,
    marshal_spec,
)

from .scenario import Scenario
from .sweep import Simulator

MUTANTS: dict[str, tuple[int, str]] = {
    "s01-last-dropped": (1, "the last, shorter segment dropped"),
    "s04-boundary-repeated": (1, "a boundary repeated"),
    "s02-train-id": (2, "train activity ids that do not name the segment"),
    "s03-eval-id": (2, "eval activity ids that do not name the suite"),
    "s05-train-to-end": (3, "every segment trains to the end"),
    "s06-no-retries": (4, "no retries for train"),
    "s07-cancel-moves-on": (5, "a cancel treated as move on"),
    "s10-one-eval-activity": (8, "all suites in one activity"),
    "s11-continue-after-failed-suite": (9, "continuing after a failed suite"),
    "s13-wall-clock-sleep": (11, "a wall-clock sleep instead of the durable rt.sleep"),
    "s14-early-stop-ignored": (0, "an early stop not read from the segment's result (not a seed pitfall: issue 28)"),
    # ModelRelease (issue 28; simulator/release.py): not seed pitfalls
    "r01-publish-twice": (0, "publish without its once-guard (a version of the same digest is not the publication)"),
    "r02-gate-ignored": (0, "a failed gate publishes anyway"),
    "r03-eval-per-request": (0, "release evaluations keyed by the request, not the checkpoint's digest (no reuse)"),
}
RELEASE_MUTANTS = frozenset(n for n in MUTANTS if n.startswith("r"))


class MutantError(RuntimeError):
    """The workflow code no longer has the hook point a mutant plants its bug at."""


def _copy(fn: Callable, **patch: Any) -> Callable:
    """``fn`` with the same code over a copy of its globals where ``patch`` replaces names."""
    g = dict(fn.__globals__)
    for name in patch:
        if name not in g:
            raise MutantError(f"{fn.__module__}.{fn.__name__} no longer uses {name!r}; update simulator/mutants.py")
    g.update(patch)
    out = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


class _Proxy:
    """A Runtime that delegates to the engine's (a mutant overrides one method)."""

    def __init__(self, rt: Any):
        self._rt = rt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rt, name)

    @property
    def workflow_id(self) -> str:
        return self._rt.workflow_id

    def now(self) -> float:
        return self._rt.now()

    async def execute_activity(self, *args: Any, **kw: Any) -> Any:
        return await self._rt.execute_activity(*args, **kw)

    async def sleep(self, seconds: float) -> None:
        await self._rt.sleep(seconds)


class _MoveOnRuntime(_Proxy):
    """Pitfall 5: every command that ends by a cancel is ignored and the code moves on."""

    def __init__(self, rt: Any):
        super().__init__(rt)
        self.last: dict[str, Any] = {}

    async def execute_activity(self, name: str, *args: Any, **kw: Any) -> Any:
        try:
            self.last[name] = await self._rt.execute_activity(name, *args, **kw)
        except (ActivityError, Canceled) as e:
            if not is_canceled(e):
                raise
        return self.last.get(name)

    async def sleep(self, seconds: float) -> None:
        try:
            await self._rt.sleep(seconds)
        except Canceled:
            pass


class _WallClockRuntime(_Proxy):
    """Pitfall 11: the cadence waits on the wall clock (scaled down), not on a durable timer."""

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds * 1e-6)  # noqa: ASYNC251 - the pitfall itself: a blocking wall-clock wait


def _segments_last_dropped(steps: int, every: int) -> list[int]:
    ends = workflows.segments(steps, every)
    return ends[:-1] if len(ends) > 1 and ends[-1] % every else ends


def _segments_repeated(steps: int, every: int) -> list[int]:
    ends = workflows.segments(steps, every)
    return ends + [ends[-1]]


def _train_options_shared_id(until: int, **kw: Any) -> StepOptions:
    real = workflows.train_options(until, **kw)
    return StepOptions(
        id="train",
        start_to_close_timeout_s=real.start_to_close_timeout_s,
        heartbeat_timeout_s=real.heartbeat_timeout_s,
        retry=real.retry,
    )


def _train_options_no_retries(until: int, **kw: Any) -> StepOptions:
    return workflows.train_options(until, **{**kw, "max_attempts": 1})


def _eval_options_no_suite(tag: str, suite: str, *heartbeat: float) -> StepOptions:
    real = eval_options(tag, suite, *heartbeat)
    return StepOptions(
        id=f"eval-{tag}" if tag else "eval",
        start_to_close_timeout_s=real.start_to_close_timeout_s,
        heartbeat_timeout_s=real.heartbeat_timeout_s,
        retry=real.retry,
    )


def _segment_spec_to_end(run_spec: dict[str, Any], until: int) -> dict[str, Any]:
    return dict(run_spec)  # the run's own steps: every segment trains to the end


async def _eval_suite_one_activity(rt: Any, input: EvalSuiteInput) -> EvalSuiteResult:
    """Pitfall 8: every suite in one activity (the fake evaluator accepts a ``suites`` list)."""
    spec = json.loads(marshal_spec(input, input.suites[0]))
    del spec["suite"]
    spec["suites"] = list(input.suites)
    result = await rt.execute_activity(ACTIVITY_EVAL, EvalActivityInput(spec=spec), eval_options(input.tag, "all"))
    return EvalSuiteResult(suites=[SuiteOutputs.model_validate(s) for s in result["suites"]])


class _SkipFailedSuiteRuntime(_Proxy):
    """Pitfall 9: a suite failing for good is skipped and the next one runs."""

    async def execute_activity(self, name: str, *args: Any, **kw: Any) -> Any:
        try:
            return await self._rt.execute_activity(name, *args, **kw)
        except ActivityError as e:
            if is_canceled(e) or name != ACTIVITY_EVAL:
                raise
            return {"suite": "skipped", "run": "", "results": ""}


def _release_mutant(name: str) -> dict[str, Callable]:
    """The release with pitfall ``name`` planted: {"ModelRelease": workflow} or {"publish": publish function}
    (what ``simulator.scenario`` registers instead of the real ones)."""
    if name == "r01-publish-twice":
        return {workflows.ACTIVITY_PUBLISH: _copy(rel.publish, list_releases=lambda home, name=None: [])}
    if name == "r02-gate-ignored":

        def passing(gate: Any, figures: dict) -> Any:
            return rel.GateOutcome(**{**rel.check_gate(gate, figures).model_dump(), "passed": True})

        return {workflows.WORKFLOW_MODEL_RELEASE: _copy(rel.model_release, check_gate=passing)}
    if name == "r03-eval-per-request":

        async def per_request(rt: Any, request: EvalSuiteInput) -> EvalSuiteResult:
            return await rel.eval_suite(rt, request.model_copy(update={"tag": f"{request.tag}-{rt.workflow_id[-8:]}"}))

        return {workflows.WORKFLOW_MODEL_RELEASE: _copy(rel.model_release, eval_suite=per_request)}
    raise MutantError(f"unknown mutant {name!r} (known: {', '.join(MUTANTS)})")


def make_mutant(name: str) -> Callable | dict[str, Callable]:
    """TrainRun with pitfall ``name`` planted (see ``MUTANTS``); for a release mutant (``RELEASE_MUTANTS``)
    a dict of what replaces the release's workflow or publish function."""
    if name in RELEASE_MUTANTS:
        return _release_mutant(name)
    real = workflows.train_run
    real_eval = workflows.eval_suite
    if name == "s01-last-dropped":
        fn = _copy(real, segments=_segments_last_dropped)
    elif name == "s04-boundary-repeated":
        fn = _copy(real, segments=_segments_repeated)
    elif name == "s02-train-id":
        fn = _copy(real, train_options=_train_options_shared_id)
    elif name == "s03-eval-id":
        fn = _copy(real, eval_suite=_copy(real_eval, eval_options=_eval_options_no_suite))
    elif name == "s05-train-to-end":
        fn = _copy(real, segment_spec=_segment_spec_to_end)
    elif name == "s06-no-retries":
        fn = _copy(real, train_options=_train_options_no_retries)
    elif name == "s14-early-stop-ignored":
        fn = _copy(real, stopped_early=lambda trained: None)
    elif name == "s10-one-eval-activity":
        fn = _copy(real, eval_suite=_eval_suite_one_activity)
    elif name in ("s07-cancel-moves-on", "s11-continue-after-failed-suite", "s13-wall-clock-sleep"):
        proxy = {
            "s07-cancel-moves-on": _MoveOnRuntime,
            "s11-continue-after-failed-suite": _SkipFailedSuiteRuntime,
            "s13-wall-clock-sleep": _WallClockRuntime,
        }[name]

        async def fn(rt: Any, input: TrainRunInput) -> Any:
            return await real(proxy(rt), input)
    else:
        raise MutantError(f"unknown mutant {name!r} (known: {', '.join(MUTANTS)})")
    return fn


def catch_scenarios() -> list[tuple[str, Scenario]]:
    """Where the simulator looks for a planted pitfall, cheapest first."""
    return [
        ("hand example with ppl,zoo, uninterrupted", Scenario(suites=("ppl", "zoo"))),
        ("a retryable trainer failure at step 740", Scenario(oom_at=((740, 1),))),
        ("suite ppl failing for good", Scenario(suites=("ppl", "zoo"), fail_suites=("ppl",))),
        ("an early stop at step 700", Scenario(stop_at=700)),
    ]


RELEASE_SCENARIO = Scenario(steps=300, eval_every=100, checkpoint_every=50, release=("fail", "pass"))


def catch_release_mutant(name: str) -> list[str]:
    """A release mutant: the uninterrupted run, then a kill at every position of its release workflows."""
    fn = make_mutant(name)
    sim = Simulator(RELEASE_SCENARIO, workflow_fn=fn, mutant=name)
    m = sim.check_reference()
    if m is not None:
        return [f"two release requests, uninterrupted: {line}" for line in m.lines]
    assert sim.release_from is not None  # (the reference run reached its release workflows)
    report = sim.kill_every_position(
        positions=range(sim.release_from, len(sim.trace)), stop_at_first=True, mode="snapshot"
    )
    if report.mismatches:
        m = report.mismatches[0]
        return [f"a kill in the release ({m.command}): {line}" for line in m.lines]
    return []


def catch_mutant(name: str, *, seed: int = 1) -> list[str]:
    """The first mismatch lines the simulator reports on mutant ``name`` (empty: not caught)."""
    if name in RELEASE_MUTANTS:
        return catch_release_mutant(name)
    fn = make_mutant(name)
    for what, scn in catch_scenarios():
        m = Simulator(scn, workflow_fn=fn, mutant=name).check_reference()
        if m is not None:
            return [f"{what}: {line}" for line in m.lines]
    sim = Simulator(Scenario(), workflow_fn=fn, mutant=name)
    for report in (
        sim.cancels(seed=seed, runs=10, stop_at_first=True),
        sim.random_kills(seed=seed, runs=20, kills_per_run=3, stop_at_first=True),
    ):
        if report.mismatches:
            m = report.mismatches[0]
            return [f"{report.name} ({m.command}): {line}" for line in m.lines]
    return []
