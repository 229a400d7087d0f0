"""The real one-node Slurm cluster of this folder's tests (slurm_cluster.py), one per module.

Skipped, with the exact reason, where Slurm cannot run here (not installed, not root, munged
failing); a configuration Slurm refuses is an error. The bring-up time is printed (``-s`` shows it)
and kept on the cluster (``startup_s``).
"""
from __future__ import annotations

import pytest

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
