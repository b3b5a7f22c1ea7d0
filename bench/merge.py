"""How fast and lean `tilesweep merge` is on 1,000 partials of 1,000 records (1,000,000).

Builds a real sweep directory (``orchestrator/store/synthetic.py``: the spec expands to exactly
the 1,000,000 items; units of whole shapes in shuffled order; partials written in the worker's
line format) and times, each in a fresh subprocess, one after another, ``--runs`` times:

- ``merge``: a first merge (no merge cache): lock, read, validate, dedupe, order, write; from
  the second run on over the document the first wrote, which it judges first (through the key
  index beside it: the output stamp went with the cache), and once more without that index
  (``merge_peak_mem_vs_doc_noindex``: the document judged batch by batch);
- its floor: the fastest way we know to produce the same document bytes from the same partials
  with the same libraries. Read: each unit's plan positions from its unit file and each
  partial's record lines (found by their ``{"id":`` prefix; header and start lines are not
  parsed) with ``orjson``, the garbage collector off while a million dicts are made, records
  placed in plan order. Write, every candidate timed and its bytes compared with the merge's
  document; the floor takes the fastest whose bytes are identical:
  ``record_text`` (the stdlib's C encoder, one encode per record: the merge's own without orjson),
  ``one_encode`` (one C-encoder call over the whole list, then one ``str.replace``),
  ``orjson`` (orjson's 2-space indent, then a fix-up: one ``bytes.replace`` for the field
  indent, the few floats below 1e-4 that orjson spells otherwise respelled by ``repr``,
  non-ASCII escaped; not identical for records holding NaN, which orjson writes as null),
  ``batched`` (the merge's own writer, ``texts.record_texts`` over a thousand records at a
  time, written as it goes: the same fix-ups on small buffers, where one ``orjson.dumps`` of the
  whole list makes the document's size in new memory three times);
- ``io``: the raw I/O floor: every partial's bytes read, the document's bytes (already in
  memory) written;
- ``remerge``: the merge after one more unit finished (999 partials merged before, the 1,000th
  appears), 1,000 new records into the document (cache of the earlier merge in place);
- its floor: the final document parsed with orjson (collector off) and written with the
  fastest identical one of the same writers.

What the figures leave out. The floors do none of the merge's checking: no record validated
against the schema, no dedupe of attempts, no header or environment check, no lock, no merge
cache written, and the document's head (device, config, the tilesweep block) is copied from
the merge's own document rather than built from the headers. They write with neither fsync nor
temp file and rename (the merge does both: its document must survive a crash). All of this
only favours the floors. Every file is in the page cache (the sweep was just written, the
machine has RAM to spare), so the figures are CPU figures; on a cold or network filesystem
the shared I/O would weigh more and every ratio would move towards 1 (reasoned, not measured). Peak memory is the merge
child's ``ru_maxrss`` after the merge minus before it (after imports and the spec), over the
document's size on disk; it leaves out the page cache and the memory the child held before;
the sweep is built in a child too, so no child inherits a big parent's maxrss (Linux carries
it across exec); /proc's VmHWM is printed beside it as a cross-check. Prints medians, one
figure a line::

    merge_vs_floor=X
    merge_cpu_s=X floor_cpu_s=X
    merge_vs_floor_cpu=X
    merge_vs_io=X
    remerge_vs_floor=X
    merge_peak_mem_vs_doc=X
    merge_peak_mem_vs_doc_noindex=X
    merge_check_cpu_s: parse=X classify=X layout=X id=X unit=X encode=X starts=X judge=X

``merge_vs_floor`` is of wall seconds, ``merge_vs_floor_cpu`` of the same runs' CPU seconds (the
floor's: its read and the writer it chose; the merge's with its parse workers'), which the other
engineers' load on a shared machine moves less. The merge parses partials in one worker process
per CPU it may use (``store/parse_procs.py``; ``TILESWEEP_MERGE_PROCS=1`` merges in one process);
the floor is one process: the wall ratio counts that, the CPU ratio does not. Peak memory is the
merge process's; its workers' largest is printed per run (each holds one partial at a time).
The last line is what each of the merge's per-line checks costs alone (``bench/merge_checks.py``).

Run: ``.venv/bin/python -m bench.merge [--units 1000] [--runs 3] [--dir DIR] [--stdlib-json]``;
``--units`` scales the sweep (1,000 records a unit); ``--stdlib-json`` merges without orjson
(the merger parses partial lines with orjson when it is installed, the stdlib otherwise; the
floors always use orjson).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.merge_checks import child_checks
from bench.merge_floors import child_docfloor, child_floor, child_io, floor_cpu_s, floor_s, writers_line

ROOT = Path(__file__).resolve().parent.parent
STDLIB_ENV = "TILESWEEP_BENCH_STDLIB_JSON"


def _child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.merge", "--child", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _proc_kb(field: str) -> int:
    """A /proc/self/status figure in kB (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return 0


# ---------------------------------------------------------------------------- children: ours


def child_merge(sweep: str, cold: bool, bare: bool = False) -> dict[str, Any]:
    from orchestrator.store import jsonline, keyindex, texts
    from orchestrator.store.merge import merge
    from orchestrator.store.sweepdir import SweepDir

    if os.environ.get(STDLIB_ENV):
        jsonline._orjson = None  # what a user without orjson gets
        texts._ORJSON_AGREES = False
    sd = SweepDir.open(sweep)
    if cold:
        shutil.rmtree(sd.root / "merge-cache", ignore_errors=True)
    if bare:  # the document there without its key index: judged batch by batch
        keyindex.index_path(sd.output).unlink(missing_ok=True)
    sd.spec  # noqa: B018 - parsed before the baseline, like any caller holding a SweepDir
    base, rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _proc_kb("VmRSS")
    t0, c0, w0 = time.perf_counter(), time.process_time(), _children_cpu()
    summary = merge(sd)
    dt, cpu, workers = time.perf_counter() - t0, time.process_time() - c0, _children_cpu() - w0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "s": dt,
        "cpu": cpu + workers,  # its parse workers' too (store/parse_procs.py)
        "workers_cpu": workers,
        "worker_peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "records": summary.records,
        "cached": summary.partials_cached,
        "mem_delta": (peak - base) * 1024,
        "hwm_delta": (_proc_kb("VmHWM") - rss0) * 1024,
        "doc_bytes": summary.output.stat().st_size,
    }


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended (the merge's parse workers)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def child_build(sweep: str, spec_json: str, n_units: str) -> dict[str, Any]:
    from orchestrator.store.synthetic import build_sweep

    _, units = build_sweep(Path(sweep), json.loads(spec_json), int(n_units))
    return {"records": sum(len(u.items) for u in units), "units": len(units)}


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "merge": lambda s: child_merge(s, cold=False),
    "merge-cold": lambda s: child_merge(s, cold=True),
    "merge-bare": lambda s: child_merge(s, cold=True, bare=True),
    "checks": child_checks,
    "build": child_build,
    "floor": child_floor,
    "docfloor": child_docfloor,
    "io": child_io,
}


# ---------------------------------------------------------------------------- driver


def first_merges(root: Path, tmp: Path, output: Path, n: int, runs: int) -> dict[str, list[float]]:
    """A first merge (no merge cache) ``runs`` times beside the floors; from the second on, over
    the document the first wrote (judged through its key index: the output stamp went with the
    cache); then once more over it without its key index (``bare``)."""
    out: dict[str, list[float]] = {k: [] for k in ("merge", "floor", "io", "mem", "bare", "cpu", "floor_cpu")}
    for r in range(runs):
        m = _child(["merge-cold", str(root)])
        assert m["records"] == n, m
        f = _child(["floor", str(root), str(output), str(tmp / "floor.json")])
        io = _child(["io", str(root), str(output), str(tmp / "io.json")])
        fs, best = floor_s(f)
        out["merge"].append(m["s"])
        out["floor"].append(fs)
        out["cpu"].append(m["cpu"])
        out["floor_cpu"].append(floor_cpu_s(f, best))
        out["io"].append(io["s"])
        out["mem"].append(m["mem_delta"] / m["doc_bytes"])
        print(
            f"  run {r}: merge_s={m['s']:.2f} (cpu {m['cpu']:.2f}, of it its parse workers' {m['workers_cpu']:.2f}, "
            f"their largest {m['worker_peak'] / 1e6:.0f} MB) floor_s={fs:.2f} (cpu {out['floor_cpu'][-1]:.2f}; "
            f"read {f['read_s']:.2f} + {best}; writers: "
            f"{writers_line(f)}) io_s={io['s']:.2f} peak_mem_delta_mb={m['mem_delta'] / 1e6:.0f} "
            f"(VmHWM: {m['hwm_delta'] / 1e6:.0f}) doc_mb={m['doc_bytes'] / 1e6:.0f}",
            flush=True,
        )
    bare = _child(["merge-bare", str(root)])
    out["bare"].append(bare["mem_delta"] / bare["doc_bytes"])
    print(
        f"  over the document without its key index: merge_s={bare['s']:.2f} peak_mem_delta_mb="
        f"{bare['mem_delta'] / 1e6:.0f}",
        flush=True,
    )
    return out


def remerges(root: Path, tmp: Path, output: Path, n: int, n_units: int, runs: int) -> dict[str, list[float]]:
    """Re-merge after one more unit finished: a unit in the middle of the plan."""
    unit_ids = [u["id"] for u in json.loads((root / "units.json").read_text())]
    late = root / "partials" / f"{unit_ids[len(unit_ids) // 2]}.jsonl"
    aside = tmp / "late.jsonl"
    out: dict[str, list[float]] = {"remerge": [], "floor": []}
    for r in range(runs):
        shutil.move(late, aside)
        # the merge without it writes fewer records: it keeps the document as .prev, and refuses a
        # second such merge while a .prev is there (a user moves it away once checked): so here
        output.with_name(output.name + ".prev").unlink(missing_ok=True)
        before = _child(["merge", str(root)])
        assert before["records"] == n - n // n_units, before
        shutil.copyfile(aside, late)  # a new file: new inode and mtime, as a finished unit
        os.unlink(aside)
        m = _child(["merge", str(root)])
        assert m["records"] == n, m
        f = _child(["docfloor", str(output), str(tmp / "floor.json")])
        fs, best = floor_s(f)
        out["remerge"].append(m["s"])
        out["floor"].append(fs)
        print(
            f"  run {r}: remerge_s={m['s']:.2f} ({m['cached']} partials from cache) doc_floor_s={fs:.2f} "
            f"(parse {f['read_s']:.2f} + {best}; writers: {writers_line(f)})",
            flush=True,
        )
    return out


def _spec(units: int) -> dict[str, Any]:
    from orchestrator.store.synthetic import million_spec

    spec = million_spec()
    if units != 1000:  # 10 shapes (1,000 items) per unit
        spec["seq_lens"] = [128 * k for k in range(1, units + 1)]
        spec["head_dims"] = spec["head_dims"][:5]
    return spec


def _ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=1000, help="units of 1,000 records (default 1000: 1M records)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="build the sweep here (default: a temp dir, removed after)")
    ap.add_argument("--stdlib-json", action="store_true", help="merge without orjson (the stdlib parser only)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](*args.child[1:])))
        return
    if args.stdlib_json:
        os.environ[STDLIB_ENV] = "1"
    parser = "stdlib json" if args.stdlib_json else "orjson"
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tilesweep-bench-merge-"))
    try:
        root = tmp / "sweep"
        t0 = time.perf_counter()
        # Built in a child, so this process stays small: a child started from a big parent
        # inherits the parent's ru_maxrss, which would hide the merge's own peak.
        built = _child(["build", str(root), json.dumps(_spec(args.units)), str(args.units)])
        n, n_units = built["records"], built["units"]
        output = Path(json.loads((root / "sweep.json").read_text())["output"])
        partials_mb = sum(p.stat().st_size for p in (root / "partials").iterdir()) / 1e6
        print(
            f"records={n} units={n_units} partials_mb={partials_mb:.0f} build_s={time.perf_counter() - t0:.0f} "
            f"merge_parser={parser}",
            flush=True,
        )
        first = first_merges(root, tmp, output, n, args.runs)
        again = remerges(root, tmp, output, n, n_units, args.runs)
        print(
            f"merge_s={statistics.median(first['merge']):.2f} floor_s={statistics.median(first['floor']):.2f} "
            f"io_s={statistics.median(first['io']):.2f} remerge_s={statistics.median(again['remerge']):.2f} "
            f"doc_floor_s={statistics.median(again['floor']):.2f}"
        )
        print(f"merge_vs_floor={_ratio(first['merge'], first['floor']):.3f}")
        cpu, floor_cpu = statistics.median(first["cpu"]), statistics.median(first["floor_cpu"])
        print(f"merge_cpu_s={cpu:.2f} floor_cpu_s={floor_cpu:.2f}")
        print(f"merge_vs_floor_cpu={_ratio(first['cpu'], first['floor_cpu']):.3f}")
        print(f"merge_vs_io={_ratio(first['merge'], first['io']):.3f}")
        print(f"remerge_vs_floor={_ratio(again['remerge'], again['floor']):.3f}")
        print(f"merge_peak_mem_vs_doc={statistics.median(first['mem']):.3f}")
        print(f"merge_peak_mem_vs_doc_noindex={first['bare'][0]:.3f}")
        checks = _child(["checks", str(root)])
        keys = ("parse", "classify", "layout", "id", "unit", "encode", "starts", "judge")
        steps = " ".join(f"{k}={checks[k]:.2f}" for k in keys)
        print(f"merge_check_cpu_s: {steps} (each alone over {checks['records']} records; bench/merge_checks.py)")
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
