"""The process that runs one unit for the local executor and says how its worker ended.

submitit's local executor starts a controller process per job (``submitit.local._local``),
which starts the worker, waits for it and then exits, keeping the worker's exit status to
itself. A worker killed by a signal (``kill -9``, the kernel's OOM killer) writes nothing, so
its log alone would leave ``tilesweep run`` and ``status`` to guess from whatever line came
last. This controller is submitit's, plus what ``node`` does for a SLURM task's workers: when
its worker died without a word it writes the reason (``why.signal_reason``) as the last line
of the worker's log (``why.failure_line``), where ``run``, ``status`` and ``wait`` read it.

``UnitExecutor`` is submitit's ``LocalExecutor`` with this controller (the unit it runs named
in its environment); ``start_controller`` is submitit's, but for the module it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from submitit.core.utils import JobPaths
from submitit.local.local import Controller, LocalExecutor, LocalJob

from orchestrator.control.dispatch.nodelog import note_start
from orchestrator.control.why import death_reason, failure_line, oom_kills
from orchestrator.pyproc import module_command, module_env
from orchestrator.store.files import open_append

UNIT_ENV = "TILESWEEP_LOCAL_UNIT"  # the unit a controller's worker runs


class UnitController(Controller):
    """submitit's controller, naming the unit first in its worker's log, and saying why a worker
    that a signal ended died."""

    def start_tasks(self) -> None:
        unit = os.environ.get(UNIT_ENV)
        if unit:
            gpus = os.environ.get("CUDA_VISIBLE_DEVICES") or "-"
            for k in range(self.ntasks):
                note_start(JobPaths(self.folder, self.pid, k).stderr, unit, f"GPU {gpus}, local job {self.pid}")
        super().start_tasks()

    def wait(self, freq: int = 24) -> Sequence[int | None]:
        before = oom_kills()
        codes = super().wait(freq)
        unit = os.environ.get(UNIT_ENV)
        for k, code in enumerate(codes):
            if unit and code is not None and code < 0:
                self._say(k, failure_line(unit, death_reason(-code, before, where="local")))
        return codes

    def _say(self, task: int, line: str) -> None:
        """Append ``line`` to the task's log (its stderr, which submitit opened for it)."""
        try:
            out = self.stderrs[task]
            out.write(f"{line}\n")
            out.flush()
        except (IndexError, OSError, ValueError):
            pass  # a log that cannot be written: status falls back on the process being gone


def start_controller(folder: Path, command: str, *, unit: str, cuda_devices: str, timeout_min: float) -> Any:
    """submitit's ``local.start_controller`` (one task, no setup commands), starting this
    module's controller; it outlives the command that started it, as submitit's does. Unlike
    submitit's, it holds none of the command's streams (``out=$(tilesweep resume --no-wait)``
    and a pipe to ``tee`` end when the command does, not when the unit does: its own output
    goes to ``<unit>.controller.log`` in ``folder``) and runs in a session of its own (a
    terminal that closes does not hang it up)."""
    env = dict(os.environ)
    env.update(
        SUBMITIT_LOCAL_NTASKS="1",
        SUBMITIT_LOCAL_COMMAND=command,
        SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * timeout_min)),
        SUBMITIT_LOCAL_SIGNAL_DELAY_S="30",
        SUBMITIT_LOCAL_NODEID="0",
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_STDERR_TO_STDOUT="",
        SUBMITIT_EXECUTOR="local",
        CUDA_VISIBLE_DEVICES=cuda_devices,
        SUBMITIT_LOCAL_WITH_SHELL="",
    )
    env[UNIT_ENV] = unit
    folder.mkdir(parents=True, exist_ok=True)
    with open_append(folder / f"{unit}.controller.log", "ab") as out:
        return subprocess.Popen(
            module_command(__name__, str(folder)),
            env=module_env(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )


class UnitExecutor(LocalExecutor):
    """submitit's local executor whose jobs run under ``UnitController``; ``unit`` names the
    unit the next submitted job runs."""

    unit = ""

    def _submit_command(self, command: str) -> LocalJob[Any]:
        n_gpus = self.parameters.get("gpus_per_node", 0)
        visible = self.parameters.get("visible_gpus", ())
        gpus = range(n_gpus) if visible == () else visible[:n_gpus]
        process = start_controller(
            self.folder,
            command,
            unit=self.unit,
            cuda_devices=",".join(str(k) for k in gpus),
            timeout_min=self.parameters.get("timeout_min", 2.0),
        )
        return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=[0])


if __name__ == "__main__":
    # started with SIGINT blocked (``local_procs.children_block_sigint``): ignored from here,
    # so one that came meanwhile is dropped, until the unit's own handlers take it over
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'local_controller'} SUBMITIT_FOLDER")
    UnitController(Path(sys.argv[1])).run()
