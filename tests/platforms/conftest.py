"""Fixtures of the platform tests: the real one-node Slurm cluster (slurm_cluster.py), one per module, and the
uninterrupted reference run every test compares its final bits with.

Skipped, with the exact reason, where Slurm cannot run here (not installed, not root, munged
failing); a configuration Slurm refuses is an error. The bring-up time is printed (``-s`` shows it)
and kept on the cluster (``startup_s``).
"""

from __future__ import annotations

import pytest

from preempt_run import reference_run
from slurm_cluster import Cluster, Unavailable


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        try:
            c.start()
        except Unavailable as e:
            pytest.skip(f"no Slurm here: {e}")
        print(f"\nslurm: one-node cluster up in {c.startup_s:.2f} s under {c.root}")
        yield c
    finally:
        swept = c.stop()
        c.remove()
    assert not swept, f"processes of the cluster's jobs outlived their jobs and the daemons (SIGKILLed): {swept}"


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run of preempt_run.SPEC (ctl train, no scheduler), once for every test here."""
    return reference_run(tmp_path_factory.mktemp("reference"))
