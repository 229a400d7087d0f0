"""A small trainer-like child for the subprocess-runner tests (no tinyllm needed).

    python eng_child.py progress <progress-file> <n>   n progress lines, then a JSON result line
    python eng_child.py badinput                        one line on stderr, exit 2
    python eng_child.py crash                           exit 3 with a message
    python eng_child.py term <pid-file>                 runs until SIGTERM, then "checkpoints" and exits 130
    python eng_child.py forever <out-file> <pid-file>   appends to out-file every 20 ms until killed
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


def main():
    mode = sys.argv[1]
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
    return 64


if __name__ == "__main__":
    sys.exit(main())
