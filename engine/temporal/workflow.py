"""The one Temporal workflow class: a dynamic workflow that runs the registered workflow function.

Temporal's sandbox imports this module afresh for each workflow run; everything it uses is passed
through (``engine``, ``workflows``, ``tinyllm``'s spec models, pydantic: deterministic code, no file
I/O, no torch), so ``train_run``, ``eval_suite`` and ``corpus_build`` are the very same function
objects as on the embedded engine. The workflow type name (``TrainRun``...) picks the function.
"""
# no `from __future__ import annotations`: the SDK reads the run signature at decoration time

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from engine.temporal.runtime import run_registered


@workflow.defn(dynamic=True)
class SeamWorkflow:
    """Any workflow registered with ``TemporalEngine.register_workflow``, by its type name."""

    @workflow.run
    async def run(self, args: Sequence[RawValue]) -> Any:
        return await run_registered(args)
