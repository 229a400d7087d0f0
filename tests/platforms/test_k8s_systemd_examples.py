"""examples/k8s/job.yaml and examples/systemd/ctl-train.service: what Kubernetes and systemd would do with them.

Neither platform runs on these machines, so this checks what can be checked without them:

- the files themselves (the manifest with PyYAML, the unit with the standard library's configparser):
  the grace the platform gives (terminationGracePeriodSeconds, TimeoutStopSec) exceeds ctl's
  ``--stop-grace`` with a margin, the stop signal goes to ctl's main process, the home is on a volume;
- what the platform decides from ctl's exit status, by the rules their documentation gives (the Job
  controller's podFailurePolicy: rules in order, the first match wins, no match counts against
  backoffLimit; systemd.service(5): Restart=on-failure, SuccessExitStatus, RestartForceExitStatus,
  RestartPreventExitStatus, and no restart of a unit asked to stop): a polite stop (143) brings the
  run back without counting as a failure, a crash (1) is retried, bad input (2) is not. These rules
  are a model written from the documentation, not the platforms' code;
- with real processes and signals, the stop both platforms perform: SIGTERM to the main process
  (ctl) only, then SIGKILL to every process left once the grace has passed (scaled down here), and
  the restart: the same command again, which must end with the uninterrupted run's bits and 0 steps
  lost (preempt_run.py).
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from app import errors
from preempt_run import BOUND_S, SPEC, STEPS, attempts, final_result, furthest_step, history, steps_lost
from simulator.proving import procs

ROOT = Path(__file__).resolve().parents[2]
JOB_YAML = ROOT / "examples" / "k8s" / "job.yaml"
UNIT = ROOT / "examples" / "systemd" / "ctl-train.service"
PREEMPTED = 143  # the contract's exit status of a polite stop (app.errors.EXIT_PREEMPTED, issue 39)
MARGIN_S = 5  # ctl needs a moment after its grace: kill the trainer's tree, record, exit


def _stop_grace(argv: list[str]) -> float:
    assert "--stop-grace" in argv, argv
    return float(argv[argv.index("--stop-grace") + 1])


def test_the_preempted_exit_status_is_the_one_the_examples_name() -> None:
    assert getattr(errors, "EXIT_PREEMPTED", None) == PREEMPTED, "app.errors.EXIT_PREEMPTED (issue 39's stop path)"


# -- Kubernetes ------------------------------------------------------------------------------


def _k8s() -> tuple[dict, dict]:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest (it comes with the mlflow and hf extras)")
    docs = {d["kind"]: d for d in yaml.safe_load_all(JOB_YAML.read_text())}
    return docs["Job"], docs["PersistentVolumeClaim"]


def pod_failure_action(policy: dict, exit_code: int, conditions: tuple[str, ...] = ()) -> str:
    """What the Job controller does with a failed pod (kubernetes.io, Pod failure policy): the first rule that
    matches decides (Ignore: a new pod, not counted; FailJob; Count); no rule matching counts it."""
    for rule in policy["rules"]:
        on_codes = rule.get("onExitCodes")
        if on_codes is not None:
            inside = exit_code in on_codes["values"]
            if exit_code != 0 and (inside if on_codes["operator"] == "In" else not inside):
                return rule["action"]
        for cond in rule.get("onPodConditions", ()):
            if cond["type"] in conditions:
                return rule["action"]
    return "Count"


def test_k8s_job_restarts_a_preempted_pod_without_counting_it_and_gives_ctl_its_grace() -> None:
    job, pvc = _k8s()
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # the API refuses podFailurePolicy with OnFailure
    (train,) = [c for c in pod["containers"] if c["name"] == "train"]
    argv = train["command"]
    assert argv[:2] == ["ctl", "train"]
    # SIGTERM -> SIGKILL after terminationGracePeriodSeconds: ctl must be done before
    assert _stop_grace(argv) + MARGIN_S <= pod["terminationGracePeriodSeconds"]
    policy = job["spec"]["podFailurePolicy"]
    assert pod_failure_action(policy, PREEMPTED) == "Ignore"  # stopped politely: resume
    assert pod_failure_action(policy, PREEMPTED, ("DisruptionTarget",)) == "Ignore"  # evicted, drained
    assert pod_failure_action(policy, 137, ("DisruptionTarget",)) == "Ignore"  # killed at the grace
    assert pod_failure_action(policy, errors.EXIT_FAILED) == "Count" and job["spec"]["backoffLimit"] >= 1
    assert pod_failure_action(policy, errors.EXIT_BAD_INPUT) == "FailJob"
    # the home outlives the pod: a PersistentVolumeClaim mounted where --home points
    home = argv[argv.index("--home") + 1]
    (mount,) = [m for m in train["volumeMounts"] if m["mountPath"] == home]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


# -- systemd ----------------------------------------------------------------------------------


def _unit() -> configparser.SectionProxy:
    cp = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    cp.optionxform = str  # systemd's keys are case-sensitive
    cp.read_string(UNIT.read_text())
    return cp["Service"]


def _statuses(service: configparser.SectionProxy, key: str) -> set[int]:
    return {int(x) for x in service.get(key, "").split() if x.isdigit()}


def systemd_restarts(
    service: configparser.SectionProxy,
    exit_code: int | None,
    *,
    signal_name: str | None = None,
    asked_to_stop: bool = False,
) -> tuple[bool, str]:
    """(restarted, the unit's result) after the main process ended (systemd.service(5)): a unit asked to stop
    is never restarted; RestartPreventExitStatus wins, then RestartForceExitStatus; Restart=on-failure restarts
    an unclean end (an exit status that is not 0 nor in SuccessExitStatus, a kill by an unclean signal)."""
    clean = ({0} | _statuses(service, "SuccessExitStatus")) if exit_code is not None else set()
    unclean = (
        exit_code not in clean
        if exit_code is not None
        else signal_name not in ("SIGHUP", "SIGINT", "SIGTERM", "SIGPIPE")
    )
    result = "failed" if unclean else "success"
    if asked_to_stop or exit_code in _statuses(service, "RestartPreventExitStatus"):
        return False, result
    if exit_code in _statuses(service, "RestartForceExitStatus"):
        return True, result
    return service["Restart"] == "on-failure" and unclean, result


def test_systemd_unit_restarts_a_preempted_run_and_stops_cleanly_when_asked() -> None:
    service = _unit()
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # SIGTERM to ctl alone, SIGKILL to the whole cgroup after TimeoutStopSec
    assert _stop_grace(shlex.split(service["ExecStart"])) + MARGIN_S <= float(service["TimeoutStopSec"])
    assert systemd_restarts(service, PREEMPTED) == (True, "success")  # a SIGTERM not from systemd: resume
    assert systemd_restarts(service, PREEMPTED, asked_to_stop=True) == (False, "success")  # systemctl stop
    assert systemd_restarts(service, errors.EXIT_FAILED) == (True, "failed")  # a crash: retried
    assert systemd_restarts(service, None, signal_name="SIGKILL") == (True, "failed")  # kill -9, OOM
    assert systemd_restarts(service, errors.EXIT_BAD_INPUT) == (False, "failed")  # bad input: not
    assert systemd_restarts(service, 0) == (False, "success")


# -- the stop both platforms perform, with real processes --------------------------------------


@pytest.mark.slow  # real ctl and trainer processes and signals
def test_sigterm_to_ctl_alone_then_sigkill_after_the_grace_loses_no_step(reference, tmp_path: Path) -> None:
    """The kubelet's and systemd's (KillMode=mixed) stop, scaled down: SIGTERM to ctl, the main process,
    while it trains; SIGKILL to whatever is left of the run's processes once ``grace_s`` passed (the
    platform's grace; ctl's own --stop-grace is below it, as in the examples). Then the platform's restart:
    the same command again."""
    stop_grace_s, grace_s = 8, 8 + MARGIN_S
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    home = tmp_path / "home"
    env = {**procs.env(), "CTL_STOP_GRACE": str(stop_grace_s)}
    argv = [*procs.CTL, "train", "--spec", str(spec), "--no-eval", "--home", str(home)]
    p = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    killed_at_grace, err = [], ""
    try:
        procs.wait_for("training past step 20", lambda: furthest_step(home) >= 20, timeout_s=BOUND_S, alive=p)
        assert furthest_step(home) < STEPS
        p.send_signal(signal.SIGTERM)  # the main process only
        try:
            _, err = p.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            killed_at_grace.append(True)
    finally:
        left = [pid for pid, _ in procs.processes_in(home)]
        for pid in left:  # the platform's SIGKILL after the grace: every process still there (a cgroup)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            procs.killpg(p)
    first = p.returncode
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=BOUND_S)  # the restart
    assert again.returncode == 0, again.stderr[-3000:]
    events = history(home)
    result = final_result(events)
    assert (result["final_loss_hex"], result["digest"]) == (reference["final_loss_hex"], reference["digest"])
    # the contract of issue 39: ctl was done before the platform's SIGKILL, exited 143, lost no step
    assert not killed_at_grace and not left, (killed_at_grace, left)
    assert first == PREEMPTED, (first, err[-2000:])
    lost = steps_lost(attempts(home))
    assert not lost, "steps lost:\n" + "\n".join(lost)
    preempted = [e["attrs"] for e in events if e["type"] == "activity_preempted"]
    assert preempted and not [a for a in preempted if a.get("killed_at_grace")], [e["type"] for e in events]
