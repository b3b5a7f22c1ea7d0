"""What a SLURM task of units is given and does before any unit runs: the executor settings as
submitit's parameters and the grace after the time-limit warning; the task's checkpoint (the
same call again) and its requeue once its workers never reach a stop; and how its process
leaves once its units all ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from orchestrator.spec.executor_section import ExecutorSettings


def test_executor_settings_become_submitit_parameters() -> None:
    from orchestrator.control.dispatch import executor_parameters, grace_s

    s = ExecutorSettings(kind="slurm", slurm_partition="gpu", gpus_per_node=1, max_requeues=5, merge_partition="cpu")
    params = executor_parameters(s)
    assert params == {"slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min": 60}
    assert grace_s(s) == 30.0 and grace_s(ExecutorSettings(slurm_signal_delay_s=20)) == 10.0
    assert grace_s(ExecutorSettings(slurm_signal_delay_s=0)) == 5.0  # no warning asked for: the shortest grace
    # a config whose samples take longer (timing.target_ms x repeats) gets the time to finish them,
    # up to 5 s before the hard limit: a config timed at the spec's own pace is not called hung
    assert grace_s(s, 40.0) == 45.0 and grace_s(ExecutorSettings(slurm_signal_delay_s=20), 60.0) == 15.0
    assert grace_s(s, 0.4) == 30.0


def test_the_seconds_of_one_config_are_its_samples_at_the_specs_pace_with_room() -> None:
    from orchestrator.control.dispatch.slurm import config_seconds
    from orchestrator.spec.files import spec_from_data

    assert config_seconds(spec_from_data({"repeats": 3, "timing": {"target_ms": 20000}})) == 90.0


def test_unit_task_checkpoints_the_same_call_and_requeues_when_stuck() -> None:
    from submitit.helpers import DelayedSubmission

    from orchestrator.control.dispatch import UnitTask
    from orchestrator.control.dispatch.node import TaskWorkers
    from orchestrator.control.dispatch.tasks import task_units

    task = UnitTask(grace_s=0.2)
    again = task.checkpoint("/sweep", ["abc", "def"], {"abc": {"x": 1}})
    assert isinstance(again, DelayedSubmission) and isinstance(again.function, UnitTask)
    assert again.args == ("/sweep", ["abc", "def"], {"abc": {"x": 1}}) and again.function.grace_s == 0.2
    # a task pickled when a task held one unit still runs
    assert task_units("abc", {"x": 1}) == (["abc"], {"abc": {"x": 1}})

    requeued = []
    old = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGALRM, signal.SIGTERM)}
    signal.signal(signal.SIGUSR2, lambda signum, frame: requeued.append(signum))  # stands for submitit's handler
    try:
        task._workers = TaskWorkers("/sweep", [], {}, None)
        task._install_handlers()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert task._warned and not requeued  # the warning only asks the workers to stop
        end = time.monotonic() + 60  # the workers never reach a stop: requeued once the grace is over
        while not requeued and time.monotonic() < end:
            time.sleep(0.01)  # the grace's alarm runs its handler between two of these
        assert requeued == [signal.SIGUSR2]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in old.items():
            signal.signal(s, h)


LEAVES = """
import atexit, sys
from orchestrator.control.dispatch.tasks import leave_without_teardown

class Module:
    def __del__(self) -> None:
        print("torn down", flush=True)

kept = Module()  # freed by the interpreter's teardown, which prints it
atexit.register(print, "atexit ran", flush=True)
atexit.register(leave_without_teardown)  # what a task whose units all ended registers
if sys.argv[1:] == ["fail"]:  # submitit could not write the result
    raise RuntimeError("the result could not be written")
"""


def test_a_task_whose_units_ended_leaves_without_the_teardown_and_an_error_keeps_its_status() -> None:
    done = subprocess.run([sys.executable, "-c", LEAVES], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "atexit ran\n"), done.stderr
    failed = subprocess.run([sys.executable, "-c", LEAVES, "fail"], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "the result could not be written" in failed.stderr
    assert failed.stdout.splitlines() == ["atexit ran", "torn down"]
