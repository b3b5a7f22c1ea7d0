"""The text of ``tilesweep status``: the sweep's totals, its rounds, one line per unit, the
final merge job, and the next step when units ended unfinished; and its ``--json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator import PROG, counted, word
from orchestrator.control.status_model import REPLACED, SweepStatus, UnitStatus
from orchestrator.store.sweep_paths import UNITS_CUT_SHORT


def format_status(st: SweepStatus, *, max_lines: int = 40) -> str:
    """The text ``tilesweep status`` shows: totals, then one line per unit (all of them on a
    small sweep, the unfinished ones on a large one)."""
    counts = ", ".join(f"{n} {s}" for s, n in st.counts().items())
    lines = [
        _head_line(st),
        *([replay_line(st.replay_of)] if st.replay_of else []),
        *rounds_lines(st),
        f"units: {len(st.units)} ({counts or 'none written yet'})" + (f"; {st.scheduler}" if st.scheduler else ""),
    ]
    if st.gpu_hours is not None:
        lines.append(f"GPU-hours: {st.gpu_hours:.3f} (sacct: elapsed x allocated GPUs, every run of every task)")
    shown = st.units if len(st.units) <= max_lines else [u for u in st.units if u.state != "done"]
    widths = Widths(
        job=max((len(u.job_id or "-") for u in shown), default=1),
        gpu=max((len(u.gpu or "-") for u in shown), default=1),
        state=max((len(_state_of(u)) for u in shown[:max_lines]), default=0),
    )
    lines += [unit_line(u, widths) for u in shown[:max_lines]]
    more, done = len(shown) - len(shown[:max_lines]), len(st.units) - len(shown)
    hidden = [*([f"{more} more"] if more else []), *([f"{done} done"] if done else [])]
    if hidden:
        lines.append(f"  ... {' and '.join(hidden)} units not shown (--json lists every unit)")
    lines += _merge_lines(st)
    if st.records_unmerged:  # before the next step, which ends the text
        why = f" ({st.unmerged})" if st.unmerged else ""
        what = "lacks records the units wrote since it was merged" if st.output_exists else "is not written"
        lines.append(
            f"not merged{why}: {st.output} {what}; to merge the records done: {PROG} merge {word(st.sweep_dir)}"
        )
    if not st.complete and st.settled and st.run_stop is not None:
        lines.append(st.run_stop.line())
    elif not st.complete and st.settled and (st.ended_unfinished() or st.never_started()):
        lines.append(f"to redo the missing items: {PROG} resume {word(st.sweep_dir)}")
    elif not st.settled and (ended := st.ended_unfinished()) + (never := st.never_started()):
        lines.append(_while_others_run(st, len(ended), len(never)))
    if st.complete and st.unmerged:
        lines.append(f"to write the results document: {PROG} merge {word(st.sweep_dir)}")
    if st.plan_finish is not None:
        lines.append(f"to finish the plan, run the command that started it again: {st.plan_finish}")
    return "\n".join(lines)


def _while_others_run(st: SweepStatus, ended: int, never: int) -> str:
    """What ``resume`` does while other units run: it redoes the items of the ``ended`` units
    that ended unfinished, and submits those of the ``never`` units never submitted (sbatch
    refused a later array, a submission stopped before them), which nothing else starts."""
    what = [f"redo the items of the {counted(ended, 'unit')} that ended unfinished"] if ended else []
    what += [f"submit the {counted(never, 'unit')} never submitted"] if never else []
    return f"to {' and '.join(what)} while the others run on: {PROG} resume {word(st.sweep_dir)}"


# The units of ``--json`` are flat objects at depth 2: with these separators the stdlib's C encoder
# spells each as ``indent=1`` does (a field a line), less the lines that open and close it.
_FLAT = json.JSONEncoder(separators=(",\n   ", ": ")).encode
_SCALARS = (str, int, float, bool, type(None))


def status_json(st: SweepStatus) -> str:
    """``json.dumps(st.to_json(), indent=1)``, the units (10,000s of them) written by the C encoder:
    the indent=1 encoder is pure Python, several times slower."""
    data = st.to_json()
    units = data.pop("units")
    if not all(type(v) in _SCALARS for u in units for v in u.values()):
        return json.dumps({**data, "units": units}, indent=1)
    text = json.dumps({**data, "units": []}, indent=1)  # the units last, as to_json has them
    if not units:
        return text
    body = _FLAT(units)[2:-2].replace("},\n   {", "\n  },\n  {\n   ")  # strings hold no raw newline
    return text.removesuffix("[]\n}") + "[\n  {\n   " + body + "\n  }\n ]\n}"


def _head_line(st: SweepStatus) -> str:
    """Planned items done (a later round's timings are the rounds line's; a search's configs
    measured of its grid, over every round), errors, where the sweep stands, and its ETA."""
    eta = st.eta_s()
    errors = f"{st.errors} error record{'s' if st.errors != 1 else ''}"
    return f"{st.sweep_dir}: {done_of_planned(st)} ({errors}), {sweep_state(st)}" + (
        f", ETA ~{format_duration(eta)}" if eta is not None else ""
    )


def done_of_planned(st: SweepStatus) -> str:
    """What a sweep has done of what it planned, as a user counts it: its planned items with a
    record ("12/40 items done"), or for a search, which plans a part of its grid round by round,
    the configs of the grid measured ("22/66 configs of the grid measured")."""
    if st.search is not None and st.grid is not None:
        return f"{st.configs_measured}/{st.grid} configs of the grid measured"
    return f"{st.items_done}/{st.planned} items done"


def sweep_state(st: SweepStatus, *, advice: bool = True) -> str:
    """Where a sweep stands in a few words (``status``; ``ls``, one line per sweep, without
    ``advice``: what writes a complete sweep's missing document)."""
    state = "complete" if st.complete else "in progress" if not st.settled else "incomplete"
    if st.plan_finish is not None:
        return UNITS_CUT_SHORT
    if state == "complete" and not st.merged:
        state = f"complete, {_not_merged(st, advice)}"
    if state == "in progress" and (stopped := st.stopped()):
        workers = "workers" if len(stopped) > 1 else "worker"
        state += f", the {workers} of {counted(len(stopped), 'unit')} stopped (Ctrl-Z / SIGSTOP)"
    elif state == "in progress" and st.runner_stopped is not None:
        state += f", the {st.runner} that runs it stopped (Ctrl-Z / SIGSTOP)"
    if state == "incomplete" and st.round2_pending and st.items_done >= st.planned:
        state = "round 1 done, round 2 to plan"
    if state == "incomplete" and st.search_pending and st.done >= st.total:
        state = f"round {st.next_round - 1} done, round {st.next_round} to plan"
    return state


def _not_merged(st: SweepStatus, advice: bool) -> str:
    """Why a complete sweep's document is missing or lacks records (the partials hold records
    written after it), and with ``advice`` what writes it: what runs, or the command that does."""
    if st.unmerged:  # its final merge job refused, or ended first: the line after the units says `merge`
        return f"not merged ({st.unmerged})"
    if st.merging:
        return "not merged yet" + (f": {st.merging} writes {st.output}" if advice else "")
    merge = f"`{PROG} merge {word(st.sweep_dir)}`"
    if st.output_foreign:  # another sweep's merge of the same output replaced it
        elsewhere = f"`{PROG} merge {word(st.sweep_dir)} --output FILE`"
        return f"not merged: {st.output} holds another sweep's records" + (
            f", not this one's; {elsewhere} writes this sweep's" if advice else ""
        )
    if st.output_carried:  # its plan carried records from the document, which no merge of it wrote since
        return f"not merged: {st.output} is the document this sweep carried records from, as its sweep wrote it" + (
            f"; {merge} writes this sweep's" if advice else ""
        )
    if st.output_exists:
        return "not merged since its last records" + (f": {merge} updates {st.output}" if advice else "")
    return "not merged" + (f": {merge} writes {st.output}" if advice else "")


def rounds_summary(st: SweepStatus) -> str:
    """The rounds after the first, each as its timings done of planned ("round 2: 3/9 timings"),
    for a sweep whose strategy has rounds (a search's as the configs they measure: "round 2: 4/4
    configs"); empty otherwise."""
    what = "configs" if st.search is not None else "timings"
    return ", ".join(f"round {r.number}: {r.done}/{r.total} {what}" for r in st.rounds() if r.number > 1)


def replay_line(source: str) -> str:
    """What a replay's records are: no measurement, draws from its source's."""
    return f"replayed from {source}: its records' times are drawn on a virtual clock, not measured"


@dataclass(frozen=True)
class Widths:
    """Column widths shared by the unit lines of one status text."""

    job: int
    gpu: int
    state: int = 0  # the longest state shown (at least 20 wide)


def unit_line(u: UnitStatus, widths: Widths) -> str:
    """One unit: id, state (resumed, its round after the first), records, errors, job, GPU,
    then why it is in that state and its log."""
    state = _state_of(u)
    text = (
        f"  {u.id}  {state:<{max(20, widths.state)}} {u.done:>6}/{u.total:<6} errors {u.errors or 0:<4} "
        f"job {u.job_id or '-':<{widths.job}} gpu {u.gpu or '-':<{widths.gpu}}"
    )
    if u.detail:
        text += f"  {u.detail}"
    if u.log:
        text += f"  log: {u.log}"
    return text.rstrip()


def _state_of(u: UnitStatus) -> str:
    """The state, and in one pair of brackets what else is so of it: ``interrupted (resumed, round 2)``."""
    also = ["resumed"] if u.resumed and u.state != REPLACED else []  # a replaced unit's detail says by whom
    also += [f"round {u.round}"] if u.round != 1 else []
    return u.state + (f" ({', '.join(also)})" if also else "")


def merge_job_line(m: dict[str, Any], *, unknown: str = "not in squeue/sacct", then: str = "") -> str:
    """The final merge job: its state (and pending reason), ``then``, its log once it ended other
    than completed, or why the merge it ran was refused; ``unknown``: what stands for a state SLURM
    did not give."""
    if m.get("error"):
        return f"final merge: job {m['job_id']} failed: {m['error']}{then}"
    return (
        f"final merge: job {m['job_id']} {m['state'].lower() if m['state'] else unknown}"
        + (f" ({m['reason']})" if m.get("reason") not in (None, "", "None") else "")
        + then
        + (f"  log: {m['log']}" if m["log"] and m["state"] not in (None, "PENDING", "RUNNING", "COMPLETED") else "")
    )


def _merge_lines(st: SweepStatus) -> list[str]:
    """The sweep's last final merge job, or sbatch's refusal of it (none was submitted since); where
    none follows the units that still run (refused, or ended first), what merges once they end."""
    then = ""
    if st.no_merge_follows:
        sweep = word(st.sweep_dir)
        merges = f"`{PROG} wait {sweep}` or `{PROG} merge {sweep}` merges"
        then = f", so no merge job follows the units; once they end, {merges}"
    if st.merge_refused is not None and not st.merged:
        return [f"final merge: not submitted ({st.merge_refused}){then}"]
    view = st.view
    unknown = "(SLURM not asked)" if view is None or not view.asked else "not in squeue/sacct"
    if view is not None and view.asked and not (view.squeue_ok or view.sacct_ok):
        unknown = "(squeue and sacct could not be asked)"  # the scheduler line says why
    return [merge_job_line(m, unknown=unknown, then=then) for m in st.merge_jobs[-1:]]


def rounds_lines(st: SweepStatus) -> list[str]:
    """What a halving sweep's rounds have done, and who plans round 2 while it is not planned;
    a search's rounds in one line; for another strategy with rounds, each round's timings."""
    if st.search is not None:
        return [_search_line(st)]
    if not st.halving:
        later = rounds_summary(st)
        return [f"round 1: {st.items_done}/{st.planned} items, {later}"] if later else []
    one = f"round 1 (screening): {st.items_done}/{st.planned} items"
    if st.round2 is not None:
        r2 = st.round2
        return [
            f"{one}; round 2 (full timing of the survivors): {st.done_of(2, st.round2_total)}/{st.round2_total} "
            f"timings ({r2.get('survivors')} of {r2.get('screened')} screened configs survived)"
        ]
    if st.round2_deferred:
        return [
            f"{one}; round 2 not planned: the merge job could not submit it ({st.round2_deferred}); "
            f"`{PROG} wait {word(st.sweep_dir)}` or `{PROG} resume {word(st.sweep_dir)}` does"
        ]
    if st.round_stalled:  # nothing runs that would plan it
        return [f"{one}; round 2 is still to plan: `{PROG} resume {word(st.sweep_dir)}` plans and runs it"]
    return [f"{one}; round 2 (full timing of the survivors) is planned once round 1 is complete ({_planners(st)})"]


def _planners(st: SweepStatus) -> str:
    """Who plans a sweep's next round once the last one is complete: on SLURM its final merge
    job too, and ``wait``; here the command that runs the units (``wait`` only merges)."""
    if st.on_slurm:
        return f"by the final merge job, `{PROG} wait`, `{PROG} resume` or `{PROG} run`"
    return f"by the `{PROG} run` or `{PROG} resume` that runs it here"


def _search_line(st: SweepStatus) -> str:
    """What each round of a search has done, how many problems still search, and who plans the
    next round (or why the merge job could not)."""
    rounds = "; ".join(
        f"round {r['round']} ({r['kind']}): {st.done_of(r['round'], r['planned'])}/{r['planned']} configs"
        for r in st.search or []
    )
    if st.search_end is not None:
        n = st.search_end["search_round"]
        units = max((r["round"] for r in st.search or []), default=n)  # with search.screen: two per round
        of_units = f" ({units} rounds of units: each screens, then times its survivors)" if units != n else ""
        return f"search: {rounds}; ended after {n} round{'s' if n != 1 else ''}{of_units}"
    problems = st.search[-1]["problems"] if st.search else []
    searching = sum(1 for p in problems if p.get("state") == "searching")
    head = f"search: {rounds}; {searching} of {len(problems)} problems searching"
    if st.search_deferred:
        return (
            f"{head}; round {st.next_round} not planned: the merge job could not submit it ({st.search_deferred}); "
            f"`{PROG} wait {word(st.sweep_dir)}` or `{PROG} resume {word(st.sweep_dir)}` does"
        )
    if st.round_stalled:  # nothing runs that would plan it
        return f"{head}; round {st.next_round} is still to plan: `{PROG} resume {word(st.sweep_dir)}` plans and runs it"
    last = st.search[-1] if st.search else None
    max_rounds, screen = st.search_rounds or (None, False)
    if last is not None and last["search_round"] == max_rounds and (not screen or last["kind"] == "survivors"):
        return f"{head}; the search ends once round {last['round']} is complete (search.max_rounds: {max_rounds})"
    return f"{head}; round {st.next_round} is planned once round {st.next_round - 1} is complete ({_planners(st)})"


def format_duration(seconds: float) -> str:
    """12s, 3m05s, 2h07m: short enough for a progress line."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
