"""The deterministic simulator: the real engine and the real TrainRun, killed at every position.

- ``fakes``: fake train/eval/corpus activities (float-recurrence trainer, real checkpoint files);
- ``faults``: the fault plan (one seed), a crashing ``Store`` subclass and clock wrapper;
- ``scenario``: one simulated run, restarted on the same files after every kill;
- ``checks``: the oracle (seed section 3) and the comparison with the uninterrupted run;
- ``sweep``: kill at every position, random multi-kills, kills during cancel (``Simulator``);
  its parts, each handed its ``sweep_context.SweepContext`` (single runs, the reference, the checks):
  ``snapshot_sweep`` (kills recovered from snapshots, convergence, shared replays),
  ``random_sweeps`` (random kills, cancels), ``report`` (``Mismatch``, ``Report``);
- ``mutants``: TrainRun with the seed's pitfalls planted, which the simulator must catch;
- ``proving``: the real-process proofs over one kill-and-compare core: ``ctl verify-resume``, the
  real kill loop (SIGKILL the real ``ctl train`` and compare bit for bit), the fault campaign.

Run ``python -m simulator --help``.
"""
