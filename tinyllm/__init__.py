"""tinyllm: a tiny GPT trainer with bitwise-exact resume, corpus building and evaluation suites.

Importing tinyllm before torch sets ``OMP_WAIT_POLICY=PASSIVE`` (unless already set): on a shared,
oversubscribed CPU, OpenMP threads that spin while waiting made 2-thread training several times
slower than 1 thread (measured: 68 s vs 15 s for 20 steps of specs/tiny.json at load 7 on 2 cores).
It changes only how idle threads wait, never the arithmetic, so results stay bit-identical.
"""
import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
