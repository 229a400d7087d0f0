"""A small trainer-like child for the subprocess-runner tests (no tinyllm needed).

python eng_child.py whoami                           a result line: pid, ppid, session, command line, tags, cwd
python eng_child.py progress <progress-file> <n>   n progress lines, then a JSON result line
python eng_child.py badinput                        one line on stderr, exit 2
python eng_child.py crash                           exit 3 with a message
python eng_child.py term <pid-file>                 runs until SIGTERM, then "checkpoints" and exits 130
python eng_child.py forever <out-file> <pid-file>   appends to out-file every 20 ms until killed
python eng_child.py launcher <progress> <out-file> <pid-file> <n>
    a launcher (like torchrun): forks a rank that calls setsid and appends to out-file every
    20 ms (its "pid start" in pid-file), writes n progress lines, then falls silent; on SIGTERM
    it exits 130 at once, leaving the rank to whoever cleans up
python eng_child.py check <pid-file> <report>        writes "alive" or "gone": the process named
    in pid-file (pid and start time) at this child's start; then a result line
python eng_child.py locker <progress> <lock> <log> <hang|finish> <grace-s>
    a trainer-contract child: flock(lock) or exit 75; logs "started"/"locked"/"released";
    hang: one progress line, then silent; on SIGTERM "checkpoints" for grace-s, exits 130.
    finish: one progress line, a result line, exit 0
"""

import json
import os
import signal
import sys
import time


def write_pid(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def proc_start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def progress_line(path, **fields):
    with open(path, "a") as f:
        f.write(json.dumps(fields) + "\n")


def rank(out, pidfile):
    """The grandchild: its own session (as torchrun's ranks may be), writing until killed."""
    os.setsid()
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {proc_start(os.getpid())}")
    os.replace(pidfile + ".tmp", pidfile)
    deadline = time.monotonic() + 120  # a bound, so a failing test cannot leave it running for long
    while time.monotonic() < deadline:
        with open(out, "a") as f:
            f.write("x\n")
        time.sleep(0.02)
    os._exit(0)


def main():
    mode = sys.argv[1]
    if mode == "whoami":  # who started this process, as a result line (the fork server's tests)
        with open("/proc/self/environ", "rb") as f:
            tags = [x for x in f.read().split(b"\0") if x.startswith(b"DURABLE_ATTEMPT=")]
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = [x.decode() for x in f.read().split(b"\0") if x]
        print(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "ppid": os.getppid(),
                    "sid": os.getsid(0),
                    "cmdline": cmdline,
                    "proc_tag": tags[0].decode().partition("=")[2] if tags else None,
                    "env_tag": os.environ.get("DURABLE_ATTEMPT"),
                    "cwd": os.getcwd(),
                }
            )
        )
        return 0
    if mode == "progress":
        path, n = sys.argv[2], int(sys.argv[3])
        for i in range(1, n + 1):
            with open(path, "a") as f:
                f.write(json.dumps({"step": i * 10, "checkpoint": f"ckpt/step-{i * 10:06d}"}) + "\n")
            time.sleep(0.05)
        print("some log line")
        print(json.dumps({"steps": n * 10, "final_loss_hex": (1.5).hex()}))
        return 0
    if mode == "badinput":
        print("loading spec", file=sys.stderr)
        print("bad spec: 'steps' must be a positive integer", file=sys.stderr)
        return 2
    if mode == "crash":
        print("Traceback ...\nRuntimeError: CUDA out of memory", file=sys.stderr)
        return 3
    if mode == "term":
        stop = []
        signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
        write_pid(sys.argv[2])
        deadline = time.monotonic() + 60
        while not stop and time.monotonic() < deadline:
            time.sleep(0.01)
        print("checkpointed at SIGTERM", file=sys.stderr)
        return 130
    if mode == "forever":
        out, pidfile = sys.argv[2], sys.argv[3]
        write_pid(pidfile)
        deadline = time.monotonic() + 120  # a bound, so a failing test cannot leave it running for long
        while time.monotonic() < deadline:
            with open(out, "a") as f:
                f.write("x\n")
            time.sleep(0.02)
        return 0
    if mode == "launcher":
        progress, out, pidfile, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        signal.signal(signal.SIGTERM, lambda *a: os._exit(130))
        if os.fork() == 0:
            rank(out, pidfile)
        for i in range(n):
            progress_line(progress, event="progress", step=i)
            time.sleep(0.05)
        time.sleep(120)
        return 0
    if mode == "check":
        pidfile, report = sys.argv[2], sys.argv[3]
        pid, start = open(pidfile).read().split()
        with open(report, "w") as f:
            f.write("alive" if proc_start(int(pid)) == start else "gone")
        print(json.dumps({"checked": True}))
        return 0
    if mode == "locker":
        import fcntl

        progress, lock, logf, how, grace_s = sys.argv[2:7]

        def log(what):
            with open(logf, "a") as f:
                f.write(f"{what} {os.getpid()} {time.time()}\n")

        log("started")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("run directory locked by another live trainer", file=sys.stderr)
            return 75
        log("locked")
        stop = []
        signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
        progress_line(progress, event="progress", step=0)
        if how == "finish":
            log("released")
            print(json.dumps({"finished": True}))
            return 0
        deadline = time.monotonic() + 120
        while not stop and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(float(grace_s))  # "writing its checkpoint" with the lock held
        log("released")
        return 130
    return 64


if __name__ == "__main__":
    sys.exit(main())
