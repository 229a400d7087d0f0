"""A threaded worker under group commit, for the SIGKILL test (tests/engine/test_engine_group_commit.py).

    python eng_group_child.py <db> <ledger> <workflows> <steps>

Starts (or attaches to) workflows g/0 .. g/<workflows-1> of <steps> no-op activities each and runs
them on the threaded worker until all have ended. Every attempt an activity function really runs
appends ``<workflow> <activity> <attempt>`` to <ledger> first (one O_APPEND write: a SIGKILL leaves
whole lines), so the test can tell what this process acted on.
"""

import os
import sys

from engine import Engine, StepOptions, SystemClock

DB, LEDGER, WORKFLOWS, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
FD = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def step(ctx, x):
    os.write(FD, f"{ctx.workflow_id} {ctx.activity_id} {ctx.attempt}\n".encode())
    return x + 1


async def steps(rt, n):
    total = 0
    for i in range(n):
        total = await rt.execute_activity("step", total, StepOptions(id=f"s{i}"))
    return total


eng = Engine(DB, clock=SystemClock(), max_concurrent_activities=WORKFLOWS, poll_interval_s=0.01)
eng.register_workflow("steps", steps)
eng.register_activity("step", step)
for w in range(WORKFLOWS):
    eng.start("steps", f"g/{w}", STEPS)
for w in range(WORKFLOWS):
    eng.run_until_complete(f"g/{w}", timeout_s=300)
eng.close()
