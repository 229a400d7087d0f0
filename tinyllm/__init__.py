"""tinyllm: a tiny GPT trainer with bitwise-exact resume, corpus building and evaluation suites.

Importing tinyllm before torch chooses the OpenMP wait policy by what the machine is doing
(tinyllm/omp.py): ``ACTIVE`` (spinning threads, full speed) when this process's threads have CPUs
of their own, ``PASSIVE`` (sleeping threads, safe) when the CPUs are busy. ``OMP_WAIT_POLICY`` or
``TINYLLM_OMP_WAIT_POLICY`` in the environment wins. It changes only how idle threads wait, never
the arithmetic, so results stay bit-identical.
"""
from . import omp as _omp

# one reading of the machine's load here (no sleeps): every `ctl` command imports tinyllm for its spec
# models and never loads torch; `tinyllm train` decides again with the full sample and its threads
_omp.configure(busy=lambda: _omp.busy_tasks(samples=1))
