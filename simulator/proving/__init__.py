"""Proofs with real processes: kill a real trainer (or all of ``ctl train``), resume it, compare bit for bit.

Three proofs share one kill-and-compare core (``core``: reading a run home, signalling an attempt, the
bitwise comparison, the steps an interruption lost, which resume proves anything):

- ``verify``: ``ctl verify-resume`` (any trainer that follows the contract, killed at seeded steps and
  run in segments; ``contract``: its rules, checked on every run; ``diagnose``: the state most likely
  not restored; ``segments``: the run in segments; ``record``: the verdict remembered in the home);
- ``kill_loop``: ``python -m simulator kill-loop`` (SIGKILL the whole ``ctl train`` at seeded moments);
- ``campaign``: ``python -m simulator campaign`` (real ctl, worker and trainer processes under seeded
  random faults, with an oracle; ``campaign_*``: its faults, progress, reference run and targets);
- ``procs``: real ``ctl`` processes for all of them and their tests.

Why here, in the simulator package, and not in ctl or a folder of its own: the simulator is the
project's prover (DESIGN: "a deterministic simulator proves all this by killing the worker at every
position"; "a real kill loop does the same with real processes"), and these are its real-process
half, beside the in-process sweeps (``simulator.sweep``); a new top-level folder would change the
layout the project's owner asked for. This subpackage imports nothing of ctl (the dependencies stay
``simulator -> workflows -> engine``); ``ctl verify-resume`` is a thin click command over
``verify``, and ``ctl train/status/show`` read the recorded verdict through ``record``. It imports
nothing of the in-process simulator either (nor it of this): the two halves share the package, not
code.
"""
