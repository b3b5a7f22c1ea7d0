"""A round planned by ``control.rounds.advance`` is in the sweep directory whole or not at all:
its units go into the index only together with the strategy's record of it (a search's
``search/round<N>.json``), whose presence means the round is planned. Where the record cannot be
written (a full disk), the round's units are taken out again, so that the next ``resume`` plans
the round once and the counts stay true. The disk is a real tmpfs, filled with a real file."""

from __future__ import annotations

import functools
import os

from orchestrator.control import dispatch
from orchestrator.control.rounds import advance, run_rounds_here
from orchestrator.control.status import sweep_status
from orchestrator.control.sweeps import prepare_sweep
from orchestrator.store.document import load
from orchestrator.store.merge import merge
from orchestrator.store.searchrounds import planned_total
from tests.search_helpers import spec_file
from tests.test_full_disk import SmallDisk, disk  # noqa: F401  (the fixture)

PAGE = 4096  # what a tmpfs file takes room in


def test_a_search_round_the_disk_had_no_room_to_record_leaves_no_unit_of_it(disk: SmallDisk) -> None:  # noqa: F811
    spec = spec_file(disk.root.parent)
    sd, unit_ids, _ = prepare_sweep(str(spec), str(disk.root / "sweep"), None, None)
    run = functools.partial(dispatch.run_units_locally, sd, kind="debug")
    assert all(o.ok for o in run(unit_ids))
    before = (sd.root / "units.json").read_bytes()
    planned = None
    for room in range(16):  # pages left free: too few for the units, then for the record alone, then enough
        disk.fill()
        os.truncate(disk.filler, disk.filler.stat().st_size - room * PAGE)
        try:
            planned = advance(sd, sd.spec.executor)
        except OSError:
            assert (sd.root / "units.json").read_bytes() == before, f"{room} pages: units of an unrecorded round"
            continue
        finally:
            disk.free()
        break
    assert planned is not None and planned.units
    run_rounds_here(sd, sd.spec.executor, run, planned=planned)
    st = sweep_status(sd, query_slurm=False)
    doc = load(merge(sd).output)
    assert st.complete and st.search_end is not None
    assert st.configs_measured == len(doc.results) == planned_total(sd), (st.configs_measured, planned_total(sd))
