"""The test cluster's own guarantees (slurm_cluster.py): where Slurm cannot run, ``Unavailable`` says exactly
why and nothing is left running; two clusters at once do not collide.

The missing binary and the non-root user are simulated (monkeypatched names, a patched geteuid): the
machine under test has Slurm and runs as root, and what is checked is the message and the cleanup, not
Slurm. munged failing and two clusters side by side are real.
"""

from __future__ import annotations

import os

import pytest

import slurm_cluster
from slurm_cluster import Cluster, Unavailable


def _started(c: Cluster) -> list[str]:
    return [name for name, f in c.pid_files.items() if f.exists()]


def test_a_missing_binary_is_named_with_the_install_command(monkeypatch) -> None:
    monkeypatch.setattr(slurm_cluster, "BINARIES", (*slurm_cluster.BINARIES, "slurmd-nonexistent"))
    c = Cluster()
    try:
        with pytest.raises(Unavailable, match=r"slurmd-nonexistent not found \(apt-get install slurmctld slurmd "):
            c.start()
        assert not _started(c)
    finally:
        c.stop()
        c.remove()
    assert not c.root.exists()


def test_not_root_is_said(monkeypatch) -> None:
    if any(
        slurm_cluster.shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}") for b in slurm_cluster.BINARIES
    ):
        pytest.skip("Slurm is not installed here (the missing-binary message comes first)")
    monkeypatch.setattr(slurm_cluster.os, "geteuid", lambda: 1000)
    c = Cluster()
    try:
        with pytest.raises(Unavailable, match="slurmd must run as root to launch jobs; these tests run as uid 1000"):
            c.start()
        assert not _started(c)
    finally:
        c.remove()


@pytest.mark.slow  # real munged and Slurm daemons
def test_munged_failing_without_a_fallback_says_why_and_two_clusters_coexist(monkeypatch, cluster) -> None:
    """munged refuses a socket directory others cannot search (as it does under a 0700 pytest tmp): with no
    Debian munged to fall back on, the reason is munged's own line. Meanwhile the module's cluster runs,
    and a second full cluster comes up beside it and goes (other ports, other munged) without touching it."""
    monkeypatch.setattr(slurm_cluster, "DEBIAN_MUNGE_SOCKET", slurm_cluster.Path("/nonexistent/munge.socket.2"))
    c = Cluster()
    try:
        os.chmod(c.root, 0o700)
        with pytest.raises(Unavailable, match=r"munged cannot start here \(.*execute permissions for all required"):
            c.start()
        assert not _started(c)
    finally:
        c.stop()
        c.remove()
    monkeypatch.undo()
    other = Cluster()
    try:
        other.start()
        assert other.conf.read_text() != cluster.conf.read_text()
        assert set(other.cmd("sinfo", "-h", "-o", "%T").stdout.split()) == {"idle"}
    finally:
        assert other.stop() == []
        other.remove()
    assert set(cluster.cmd("sinfo", "-h", "-o", "%T").stdout.split()) == {"idle"}  # the first one still answers
