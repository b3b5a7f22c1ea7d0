"""How fast and lean `tilesweep merge` is on 1,000 partials of 1,000 records (1,000,000).

Builds a real sweep directory (``bench/_synth.py``: the spec expands to exactly the 1,000,000
items; units of whole shapes in shuffled order; partials written the way the worker writes
them) and times, each in a fresh subprocess, alternating, ``--runs`` times:

- ``merge``: a first merge (no merge cache): lock, read, validate, dedupe, order, write;
- its floor: every partial line read once with the stdlib's ``json.loads``, plus the same
  records written once with ``json.dumps(doc, indent=1)`` (the reference format);
- ``remerge``: the merge after one more unit finished (999 partials merged before, the 1,000th
  appears), 1,000 new records into the document (cache of the earlier merge in place);
- its floor: the final document parsed with ``json.loads`` and written with ``json.dumps``.

The merge writes with fsync (its documents must survive a crash); the floors do not, which
only favours the floors. Peak memory is the merge child's ``ru_maxrss`` (resource.getrusage)
after the merge minus before it (after imports), over the document's size on disk; the sweep
is built in a child too, so no child inherits a big parent's maxrss (Linux carries it across
exec); /proc's VmHWM is printed beside it as a cross-check. Prints
medians, one figure a line::

    merge_vs_floor=X
    remerge_vs_floor=X
    merge_peak_mem_vs_doc=X

Run: ``.venv/bin/python -m bench.merge [--units 1000] [--runs 3] [--dir DIR] [--stdlib-json]``;
``--units`` scales the sweep (1,000 records a unit); ``--stdlib-json`` merges without orjson
(the merger parses partial lines with orjson when it is installed, the stdlib otherwise).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


STDLIB_ENV = "TILESWEEP_BENCH_STDLIB_JSON"


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.merge", "--child", *args], cwd=ROOT,
                         capture_output=True, text=True, check=False)
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


def child_main(kind: str, paths: list[str]) -> None:
    if kind in ("merge", "merge-cold"):
        from orchestrator.store import partials
        from orchestrator.store.merge import merge
        from orchestrator.store.sweepdir import SweepDir

        if os.environ.get(STDLIB_ENV):
            partials._orjson = None  # what a user without orjson gets

        sd = SweepDir.open(paths[0])
        if kind == "merge-cold":
            shutil.rmtree(sd.root / "merge-cache", ignore_errors=True)
        sd.spec  # noqa: B018 - parsed before the baseline, like any caller holding a SweepDir
        base, rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _proc_kb("VmRSS")
        t0 = time.perf_counter()
        summary = merge(sd)
        dt = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"s": dt, "records": summary.records, "cached": summary.partials_cached,
                          "mem_delta": (peak - base) * 1024, "hwm_delta": (_proc_kb("VmHWM") - rss0) * 1024,
                          "doc_bytes": summary.output.stat().st_size}))
    elif kind == "build":
        from bench._synth import build_sweep

        spec = json.loads(paths[1])
        sd, units = build_sweep(Path(paths[0]), spec, int(paths[2]))
        print(json.dumps({"records": sum(len(u.items) for u in units), "units": len(units)}))
    elif kind == "floor":
        sweep, out = Path(paths[0]), Path(paths[1])
        units = json.loads((sweep / "units.json").read_text())
        t0 = time.perf_counter()
        results = []
        for u in units:
            with open(sweep / "partials" / f"{u['id']}.jsonl", "rb") as f:
                for line in f:
                    obj = json.loads(line)
                    if "record" in obj:
                        rec = obj["record"]
                        rec["unit"], rec["attempt"] = u["id"], obj["attempt"]
                        results.append(rec)
        t1 = time.perf_counter()
        doc = {"device": {}, "config": {}, "results": results}
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1))
        t2 = time.perf_counter()
        print(json.dumps({"s": t2 - t0, "read_s": t1 - t0, "write_s": t2 - t1}))
    elif kind == "docfloor":
        doc_path, out = Path(paths[0]), Path(paths[1])
        t0 = time.perf_counter()
        doc = json.loads(doc_path.read_bytes())
        t1 = time.perf_counter()
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc, indent=1))
        t2 = time.perf_counter()
        print(json.dumps({"s": t2 - t0, "read_s": t1 - t0, "write_s": t2 - t1}))
    else:
        raise SystemExit(f"unknown child {kind}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=1000, help="units of 1,000 records (default 1000: 1M records)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="build the sweep here (default: a temp dir, removed after)")
    ap.add_argument("--stdlib-json", action="store_true", help="merge without orjson (the stdlib parser only)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args.child[0], args.child[1:])
    if args.stdlib_json:
        os.environ[STDLIB_ENV] = "1"
    try:
        import orjson  # noqa: F401
        parser = "stdlib json" if args.stdlib_json else "orjson"
    except ImportError:
        parser = "stdlib json (orjson not installed)"

    sys.path.insert(0, str(ROOT))
    from bench._synth import million_spec

    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tilesweep-bench-merge-"))
    try:
        root = tmp / "sweep"
        spec = million_spec()
        if args.units != 1000:  # 10 shapes (1,000 items) per unit
            spec["seq_lens"] = [128 * k for k in range(1, args.units + 1)]
            spec["head_dims"] = spec["head_dims"][:5]
        t0 = time.perf_counter()
        # Built in a child, so this process stays small: a child started from a big parent
        # inherits the parent's ru_maxrss, which would hide the merge's own peak.
        built = _child(["build", str(root), json.dumps(spec), str(args.units)])
        n, n_units = built["records"], built["units"]
        output = Path(json.loads((root / "sweep.json").read_text())["output"])
        partials_mb = sum(p.stat().st_size for p in (root / "partials").iterdir()) / 1e6
        print(f"records={n} units={n_units} partials_mb={partials_mb:.0f} build_s={time.perf_counter() - t0:.0f} "
              f"merge_parser={parser}", flush=True)
        floor_out = tmp / "floor.json"

        merges, floors, mems = [], [], []
        for r in range(args.runs):
            f = _child(["floor", str(root), str(floor_out)])
            m = _child(["merge-cold", str(root)])
            floors.append(f["s"])
            merges.append(m["s"])
            mems.append(m["mem_delta"] / m["doc_bytes"])
            print(f"  run {r}: merge_s={m['s']:.2f} floor_s={f['s']:.2f} (read {f['read_s']:.2f} + write "
                  f"{f['write_s']:.2f}) peak_mem_delta_mb={m['mem_delta'] / 1e6:.0f} (VmHWM: {m['hwm_delta'] / 1e6:.0f}) "
                  f"doc_mb={m['doc_bytes'] / 1e6:.0f}", flush=True)
            assert m["records"] == n, m

        # Re-merge after one more unit finished: a unit in the middle of the plan.
        unit_ids = [u["id"] for u in json.loads((root / "units.json").read_text())]
        late = root / "partials" / f"{unit_ids[len(unit_ids) // 2]}.jsonl"
        aside = tmp / "late.jsonl"
        remerges, docfloors = [], []
        for r in range(args.runs):
            shutil.move(late, aside)
            before = _child(["merge", str(root)])
            assert before["records"] == n - n // n_units, before
            shutil.copyfile(aside, late)  # a new file: new inode and mtime, as a finished unit
            os.unlink(aside)
            m = _child(["merge", str(root)])
            assert m["records"] == n, m
            f = _child(["docfloor", str(output), str(floor_out)])
            remerges.append(m["s"])
            docfloors.append(f["s"])
            print(f"  run {r}: remerge_s={m['s']:.2f} ({m['cached']} partials from cache) doc_floor_s={f['s']:.2f} "
                  f"(parse {f['read_s']:.2f} + write {f['write_s']:.2f})", flush=True)

        print(f"merge_s={statistics.median(merges):.2f} floor_s={statistics.median(floors):.2f} "
              f"remerge_s={statistics.median(remerges):.2f} doc_floor_s={statistics.median(docfloors):.2f}")
        print(f"merge_vs_floor={statistics.median(m / f for m, f in zip(merges, floors)):.3f}")
        print(f"remerge_vs_floor={statistics.median(m / f for m, f in zip(remerges, docfloors)):.3f}")
        print(f"merge_peak_mem_vs_doc={statistics.median(mems):.3f}")
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
