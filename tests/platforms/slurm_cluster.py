"""A private, real one-node Slurm cluster for the tests, brought up from nothing and torn down by pid.

Debian's ``slurmctld``, ``slurmd`` and ``munge`` (``.ci/run`` installs them where missing) run as
root under one scratch root in /tmp (``/work/shared/slurm.md`` has the facts this follows):

- munged with its own key, socket, pid and log file under the root (Debian's daemon, if one runs,
  is left alone; when our own cannot start but Debian's socket answers, that one is used);
- slurm.conf with free ports chosen at runtime (two clusters on one machine never collide), one node
  of ONE declared CPU (``SlurmdParameters=config_overrides``: a job fills the node, so a high-priority
  job really needs the low one's place), partitions ``low`` (default; ``PreemptMode=REQUEUE`` with a
  ``GraceTime``) and ``high`` (``PriorityTier`` above: ``PreemptType=preempt/partition_prio``;
  ``preempt_send_user_signal``: a preempted job's ``--signal`` goes out at once, with ``B:`` to the
  batch shell too),
  ``KillWait`` 10 s, ``AuthInfo=cred_expire`` short (a requeued job may start again after about that
  long instead of ~2 minutes) and fast scheduler intervals;
- the commands get ``SLURM_CONF`` and a marker variable through ``Cluster.env()`` (never through this
  process's own environment), and teardown stops the daemons by the pids in their pid files, then
  SIGKILLs every process still carrying the marker: a job's children can escape to PID 1 when
  proctrack/linuxproc loses them (slurm.md), and they must not outlive the test.

``Unavailable`` says exactly why a cluster cannot exist here (binaries missing, not root, munged
failing): the tests skip with that reason. A slurmctld or slurmd that fails to come up with this
configuration is an error, not a skip (it would hide a broken configuration). Never a fake scheduler.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo")
INSTALL_HINT = "apt-get install slurmctld slurmd slurm-client munge"
MARKER = "DURABLE_SLURM_TEST_ROOT"  # in the daemons' and the jobs' environment: the teardown's sweep finds them by it
KILL_WAIT_S = 10  # TERM -> KILL at requeue, time limit, scancel, the end of a preemption grace
GRACE_TIME_S = 5  # partition low's preemption GraceTime
CRED_EXPIRE_S = 5  # a requeued job is held about this long (Slurm's default: 120 s)
DEBIAN_MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class Unavailable(Exception):
    """Slurm cannot run on this machine; the message says exactly why (the tests skip with it)."""


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free now (all held open together while they are chosen)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"({path}: {e})"


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _stop_pid(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM ``pid``, SIGKILL it if it is still there after ``timeout_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.05)
        if not _pid_alive(pid):
            return


def marked_processes(root: Path) -> list[int]:
    """Live processes (not this one) whose environment carries this cluster's marker."""
    needle = f"{MARKER}={root}\0".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env + b"\0" and _pid_alive(int(d.name)):
            out.append(int(d.name))
    return out


class Cluster:
    """One node, two partitions, started by ``start()`` and gone after ``stop()`` (see the module docstring)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="durable-slurm-", dir="/tmp"))
        os.chmod(self.root, 0o755)  # munged wants its socket's directories searchable by all
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.pid_files = {
            "slurmd": self.root / "slurmd.pid",
            "slurmctld": self.root / "slurmctld.pid",
            "munged": self.root / "munge" / "munged.pid",
        }
        self.own_munged = False
        self.startup_s: float | None = None  # measured: from nothing to the node idle

    # -- the environment of every Slurm command and job ------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        out = dict(os.environ)
        out.update({"SLURM_CONF": str(self.conf), MARKER: str(self.root)})
        for k in ("SLURM_JOB_ID", "SLURM_JOBID"):  # a pytest run inside a Slurm job must not leak its own
            out.pop(k, None)
        out.update(extra or {})
        return out

    def cmd(self, *args: str, check: bool = True, timeout_s: float = 60.0, **kw) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster (its output captured)."""
        p = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout_s, env=kw.pop("env", self.env()), **kw
        )
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
        return p

    # -- bring-up ------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
        if missing:
            raise Unavailable(f"Slurm/munge not installed: {', '.join(missing)} not found ({INSTALL_HINT})")
        if os.geteuid() != 0:
            raise Unavailable(f"slurmd must run as root to launch jobs; these tests run as uid {os.geteuid()}")
        self._start_munge()
        self._write_conf()
        for d in ("state", "spool"):
            (self.root / d).mkdir()
        for daemon in ("slurmctld", "slurmd"):
            exe = shutil.which(daemon) or f"/usr/sbin/{daemon}"
            p = subprocess.run(
                [exe, "-f", str(self.conf)], capture_output=True, text=True, env=self.env(), timeout=START_TIMEOUT_S
            )
            if p.returncode != 0:
                raise AssertionError(
                    f"{daemon} did not start ({p.returncode}): {p.stderr.strip()}\n"
                    f"{_tail(self.root / (daemon + '.log'))}"
                )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            p = self.cmd("sinfo", "-h", "-N", "-o", "%T", check=False)
            if p.returncode == 0 and set(p.stdout.split()) == {"idle"}:  # one line per partition
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the node is not idle after {START_TIMEOUT_S} s (sinfo: {p.stdout.strip()!r} "
                    f"{p.stderr.strip()!r})\nslurmctld.log:\n{_tail(self.root / 'slurmctld.log')}\n"
                    f"slurmd.log:\n{_tail(self.root / 'slurmd.log')}"
                )
            time.sleep(0.1)
        self.startup_s = time.monotonic() - t0

    def _munge_works(self, sock: Path) -> str | None:
        """None when a credential made through ``sock`` decodes; else what went wrong."""
        try:
            cred = subprocess.run(["munge", "-n", "-S", str(sock)], capture_output=True, text=True, timeout=30)
            if cred.returncode != 0:
                return cred.stderr.strip()
            back = subprocess.run(
                ["unmunge", "-S", str(sock)], input=cred.stdout, capture_output=True, text=True, timeout=30
            )
            return None if back.returncode == 0 else back.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)

    def _start_munge(self) -> None:
        d = self.munge_socket.parent
        d.mkdir(mode=0o755)
        os.chmod(d, 0o755)
        key = d / "munge.key"
        with open(key, "wb", opener=lambda p, f: os.open(p, f, 0o400)) as f:
            f.write(os.urandom(128))
        exe = shutil.which("munged") or "/usr/sbin/munged"
        p = subprocess.run(
            [
                exe,
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.pid_files['munged']}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=START_TIMEOUT_S,
        )
        own_error = p.stderr.strip() or f"exit {p.returncode}"
        if p.returncode == 0:
            self.own_munged = True
            why = self._munge_works(self.munge_socket)
            if why is None:
                return
            own_error = f"its credentials do not decode: {why}"
        if DEBIAN_MUNGE_SOCKET.exists() and self._munge_works(DEBIAN_MUNGE_SOCKET) is None:
            self.munge_socket = DEBIAN_MUNGE_SOCKET  # Debian's munged (not ours: left running at teardown)
            return
        raise Unavailable(
            f"munged cannot start here ({own_error}) and no working munged answers on {DEBIAN_MUNGE_SOCKET}"
        )

    def _write_conf(self) -> None:
        r = self.root
        ctld_port, slurmd_port = _free_ports(2)
        lines = [
            f"ClusterName=dt{os.getpid()}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={self.pid_files['slurmctld']}",
            f"SlurmdPidFile={self.pid_files['slurmd']}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            f"KillWait={KILL_WAIT_S}",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=bf_interval=1,sched_interval=1",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "SlurmctldParameters=preempt_send_user_signal",
            "MinJobAge=600",  # finished jobs stay visible to `scontrol show job` (no slurmdbd here)
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs=1 RealMemory=1000 State=UNKNOWN",
            f"PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
            f"PreemptMode=REQUEUE GraceTime={GRACE_TIME_S}",
            "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    # -- jobs ------------------------------------------------------------------------------

    def sbatch(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
        """``sbatch --parsable ARGS``; the job's id."""
        p = self.cmd("sbatch", "--parsable", *args, env=self.env(env), cwd=cwd)
        return p.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict (JobState, Restarts, ExitCode, ...); {} once Slurm forgot it."""
        p = self.cmd("scontrol", "show", "job", "-o", job_id, check=False)
        if p.returncode != 0:
            return {}
        return dict(re.findall(r"(\S+?)=(\S*)", p.stdout))

    # -- teardown --------------------------------------------------------------------------

    def stop(self) -> list[int]:
        """Cancel what runs, stop the daemons by pid, SIGKILL what the jobs left; the pids swept (should be none)."""
        if self.pid_files["slurmctld"].exists():
            self.cmd(
                "scancel", "--full", "--quiet", "--state=RUNNING", f"--user={os.geteuid()}", check=False, timeout_s=30
            )
            self.cmd("scancel", "--quiet", f"--user={os.geteuid()}", check=False, timeout_s=30)
            deadline = time.monotonic() + KILL_WAIT_S + STOP_TIMEOUT_S  # TERM, KILL after KillWait, then gone
            while time.monotonic() < deadline:
                p = self.cmd("squeue", "-h", "-o", "%i", check=False)
                if p.returncode != 0 or not p.stdout.strip():
                    break
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            if name == "munged" and not self.own_munged:
                continue
            try:
                pid = int(self.pid_files[name].read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            _stop_pid(pid)
        swept = marked_processes(self.root)
        for pid in swept:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return swept

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
