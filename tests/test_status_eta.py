"""The ETA ``status`` gives a sweep that runs: the pace of the records its jobs wrote, not of those
carried from earlier documents at plan time (the reuse unit's), which were there before any job ran;
after a resume, of the records its units wrote since, not of the days between a failure and it."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.control.scheduler import TaskState
from orchestrator.control.status import format_status, sweep_status
from orchestrator.store import synthetic
from orchestrator.store.sweepdir import SweepDir
from orchestrator.store.synthetic import build_sweep
from tests.helpers import TINY_SPEC, replay_spec, run_cli, scheduler_view, synthetic_source

GRID = {**TINY_SPEC, "modes": ["fwd"], "seq_lens": [64, 128], "fwd_block_q": [16, 32, 64]}


def _replay_spec(folder: Path, name: str, **over: Any) -> Path:
    source, output = folder / "source.json", folder / "out.json"
    return replay_spec(folder / name, GRID, source, output, replay={"pace": "instant"}, **over)


def test_the_eta_of_a_sweep_that_reused_records_is_the_pace_of_its_jobs_alone(tmp_path: Path) -> None:
    synthetic_source(tmp_path / "source.json", GRID)
    first = _replay_spec(tmp_path, "first.json", fwd_block_q=[16], executor={"kind": "local"})
    assert run_cli("run", str(first), "--sweep-dir", str(tmp_path / "first")).returncode == 0
    spec = _replay_spec(tmp_path, "all.json", executor={"kind": "slurm"})
    r = run_cli("plan", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--units", "1")
    assert r.returncode == 0 and "reused 4 items" in r.stdout, r.stdout + r.stderr
    sd = SweepDir.open(tmp_path / "sweep")
    (measured,) = [u["id"] for u in sd.unit_index() if u["origin"] != "reuse"]
    items = sd.unit_items(measured)
    record = {"id": items[0].id, "attempt": 1, "record": synthetic.record_for(items[0], random.Random(0))}
    header = synthetic.header(sd, measured, 1)
    sd.partial_path(measured).write_text(json.dumps(header) + "\n" + json.dumps(record) + "\n")
    submitted = time.time() - 100
    sd.record_jobs([{"unit": measured, "executor": "slurm", "job_id": "70", "submitted_ts": submitted}])
    st = sweep_status(sd, view=scheduler_view(j70=TaskState("RUNNING", "squeue")))
    assert (st.done, st.total, len(items)) == (5, 8, 4), format_status(st)
    # 1 record measured in the ~100 s since the job was submitted, 3 to go: ~300 s (not 5 records: ~60 s)
    assert st.eta_s() == pytest.approx((st.taken - submitted) * 3 / 1), format_status(st)


def test_the_eta_after_a_resume_is_the_pace_of_the_units_it_submitted_since_it_did(tmp_path: Path) -> None:
    """A sweep submitted ten days ago, one unit done, the other failed and resumed 100 s ago: the pace is
    the resumed unit's records since the resume, not every record over the ten days."""
    sd, units = build_sweep(tmp_path / "sweep", synthetic.small_spec(n_seqs=1), 2, write_partials=[0])
    ids = [u.id for u in units]
    resumed = ids[1:]
    now = time.time()
    first, again = now - 10 * 86400, now - 100
    sd.record_jobs(
        [{"unit": u, "executor": "slurm", "job_id": f"60_{k}", "submitted_ts": first} for k, u in enumerate(ids)]
    )
    sd.record_jobs(
        [{"unit": u, "executor": "slurm", "job_id": f"61_{k}", "submitted_ts": again} for k, u in enumerate(resumed)]
    )
    sd.record_jobs([{"event": "resume", "replaces": [], "units": resumed, "ts": again}])
    items = sd.unit_items(resumed[0])[:10]
    rng = random.Random(0)
    lines = [synthetic.header(sd, resumed[0], 2)] + [
        {"id": it.id, "attempt": 2, "record": synthetic.record_for(it, rng)} for it in items
    ]
    sd.partial_path(resumed[0]).write_text("".join(json.dumps(line) + "\n" for line in lines))
    view = scheduler_view(j61_0=TaskState("RUNNING", "squeue"))
    st = sweep_status(sd, view=view)
    left = st.total - st.done
    assert st.done == len(units[0].items) + 10 and left > 0, format_status(st)
    # 10 records in the ~100 s since the resume, not 10 + a whole unit's over ten days
    assert st.eta_s() == pytest.approx((st.taken - again) * left / 10), format_status(st)


def test_the_eta_of_a_round_the_final_merge_job_submitted_is_the_pace_of_its_units_since_then(
    tmp_path: Path,
) -> None:
    """A halving sweep whose round 1 was submitted ten days ago and whose round 2 the final merge
    job submitted 100 s ago (as ``rounds.after_merge`` does, origin "round2"): the pace is round 2's
    records since then, not every record over the ten days and the gap between the rounds."""
    from orchestrator.control import dispatch
    from orchestrator.control.rounds import advance
    from orchestrator.control.sweeps import prepare_sweep
    from tests.test_halving import spec_file

    sd, unit_ids, _ = prepare_sweep(str(spec_file(tmp_path)), str(tmp_path / "sweep"), None, None)
    assert all(o.ok for o in dispatch.run_units_locally(sd, unit_ids, kind="debug"))
    now = time.time()
    first, again = now - 10 * 86400, now - 100
    # round 1 as SLURM ran it ten days ago (the debug run's own lines replaced)
    jobs = [
        {"unit": u, "executor": "slurm", "job_id": f"60_{k}", "submitted_ts": first, "origin": "plan"}
        for k, u in enumerate(unit_ids)
    ]
    (sd.root / "jobs.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    second = advance(sd, sd.spec.executor)  # the debug executor plans round 2 and submits nothing
    assert second is not None and second.units
    round2 = [u.id for u in second.units]
    sd.record_jobs(
        [
            {"unit": u, "executor": "slurm", "job_id": f"61_{k}", "submitted_ts": again, "origin": "round2"}
            for k, u in enumerate(round2)
        ]
    )
    items = sd.unit_items(round2[0])[:3]
    rng = random.Random(0)
    header = json.loads(sd.partial_path(unit_ids[0]).read_text().splitlines()[0])  # as round 1's workers wrote it
    header["header"].update(unit=round2[0], measure={**header["header"]["measure"], "round": 2})
    lines = [header] + [{"id": it.id, "attempt": 1, "record": synthetic.record_for(it, rng)} for it in items]
    sd.partial_path(round2[0]).write_text("".join(json.dumps(line) + "\n" for line in lines))
    view = scheduler_view(**{f"j61_{k}": TaskState("RUNNING", "squeue") for k in range(len(round2))})
    st = sweep_status(sd, view=view)
    left = st.total - st.done
    assert left > 0 and st.round2 is not None, format_status(st)
    # 3 records in the ~100 s since round 2 was submitted, not round 1's and those over ten days
    assert st.eta_s() == pytest.approx((st.taken - again) * left / 3), format_status(st)
