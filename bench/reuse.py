"""Reuse at scale: planning a 1,000,000-item spec against a 1,000,000-record document that holds
half of its items, beside planning the same spec without a document.

- ``reuse_plan_1m_s``: ``control.reuseplan.plan_with_reuse`` (expand the spec, read the key
  index beside the document, parse the records of the plan's items and decide for each whether
  it stands for its item, the sources' cost table, shard the half left to measure); the
  document's other half are records of seq lengths the spec does not have, never parsed;
- ``reuse_plan_1m_noindex_s``: the same with the document's key index deleted first: the plan
  parses the whole document once, to build the index (written beside it), then plans as above.
- ``plain_plan_1m_s``: ``planning.plan`` of the same spec, no document (what planning costs a
  user who measures everything again: the honest baseline of the planning step itself).
- ``*_cpu_s``: the CPU seconds (user + system) of the same processes: less at the mercy of the
  load than wall seconds on a shared machine (not free of it: a shared core's caches).
- ``reuse_plan_step_*``: the steps of the reuse plan timed apart (expand; load: read the key
  index and the document's head; match: find the plan's items in the index, parse their records
  a chunk at a time and judge them; shard what is left), in one more process.
- ``reuse_prepare_1m_s``: ``control.sweeps.prepare_sweep``, which also writes the sweep
  directory, the measuring units and the reuse unit's partial (one line per reused record).
- ``*_peak_rss_mb``: the peak resident memory of the process that did each (one fresh process
  per figure, its own ``VmHWM``: ``ru_maxrss`` would be the bench parent's, inherited across the
  exec), and ``doc_mb`` the document's size. The document is written as the
  merger writes one (indent=1), with the key index the merger writes beside it.

Left out: writing the document (setup), the merge that later carries the records (``bench.merge``
measures merging at this scale), and the machine's load: other engineers share its 2 cores, so
ratios from one run mean more than seconds across runs. The environment is taken from the
document (executor slurm), so jax is not imported.

Run: ``.venv/bin/python -m bench.reuse`` (about two minutes here; ``--scale 0.1`` for a quick look).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.planning import expand
from orchestrator.spec.compat import env_fingerprint
from orchestrator.spec.model import SweepSpec
from orchestrator.store.synthetic import DEVICE, million_spec, record_for

N_UNITS_IN_DOC = 64


def specs(scale: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The planned spec (100 seq lengths) and the document's (the upper 50 of them and 50 more)."""
    n = max(2, int(100 * scale))
    plan = million_spec(seq_lens=[128 * k for k in range(1, n + 1)], executor={"kind": "slurm"})
    doc = million_spec(seq_lens=[128 * k for k in range(n // 2 + 1, n // 2 + n + 1)])
    return plan, doc


def write_doc(path: Path, plan_spec: dict[str, Any], doc_spec: dict[str, Any]) -> int:
    """A tilesweep results document of every item of ``doc_spec``, measured as ``plan_spec`` would,
    written as the merger writes one (``merge.write_document``: the indent=1 layout), with the key
    index the merger writes beside it (``keyindex``)."""
    import random

    from orchestrator.store import keyindex
    from orchestrator.store.merge import write_document
    from orchestrator.store.texts import record_text

    rng = random.Random(0)
    items = expand(SweepSpec.model_validate(doc_spec))
    units = [f"u{i:03d}" for i in range(N_UNITS_IN_DOC)]
    block = {
        "env": env_fingerprint(DEVICE),
        "spec": SweepSpec.model_validate(plan_spec).model_dump(mode="json"),
        "attempts": {u: [{"attempt": 1, "started": "2026-11-01T00:00:00+00:00"}] for u in units},
    }
    texts = [
        record_text({**record_for(it, rng), "unit": units[i * N_UNITS_IN_DOC // len(items)], "attempt": 1})
        for i, it in enumerate(items)
    ]
    first = write_document(path, {"device": DEVICE, "config": {"repeats": 5}, "tilesweep": block}, texts)
    keyindex.write(path, first, map(len, texts), [it.id for it in items], [it.tag for it in items])
    return len(items)


def child(what: str, spec_path: str, doc: str, work: str) -> None:
    """One figure in this fresh process: seconds and peak RSS, as JSON on stdout."""
    from orchestrator.spec.files import load_spec

    spec = load_spec(spec_path)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = ru.ru_utime + ru.ru_stime
    t = time.perf_counter()
    out: dict[str, float]
    if what == "plain":
        from orchestrator.planning import plan

        items, units = plan(spec)
        out = {"items": len(items), "units": len(units)}
    elif what in ("reuse", "noindex"):
        from orchestrator.control.reuseplan import plan_with_reuse

        if what == "noindex":
            from orchestrator.store.keyindex import index_path

            index_path(Path(doc)).unlink()
        p = plan_with_reuse(spec, Path(work) / "sweep", Path(doc), None, None, None)
        out = {"items": len(p.items), "reused": p.found.reused, "measured": sum(len(u.items) for u in p.units)}
    elif what == "stages":
        out = stages(spec, Path(doc))
    else:
        from orchestrator.control.sweeps import prepare_sweep

        sd, ids, _ = prepare_sweep(spec_path, str(Path(work) / "sweep"), None, doc)
        out = {"units": len(ids)}
    out["s"] = time.perf_counter() - t
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = ru.ru_utime + ru.ru_stime - cpu0
    out["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(out))


def peak_rss_mb() -> float:
    """This process's own peak resident memory: ``VmHWM``, which an exec starts afresh (``ru_maxrss``
    keeps the peak of the process before the exec: the bench parent's, which wrote the document)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # an upper bound


def stages(spec: SweepSpec, doc: Path) -> dict[str, float]:
    """``plan_with_reuse``'s steps timed one by one: where the seconds go."""
    from orchestrator.planning import shard_items
    from orchestrator.store.reuse import document_env, find_reuse
    from orchestrator.store.reuse_sources import load_sources

    out: dict[str, float] = {}
    t = time.perf_counter()
    items = expand(spec)
    out["expand_s"], t = time.perf_counter() - t, time.perf_counter()
    sources = load_sources(doc, [])
    out["load_s"], t = time.perf_counter() - t, time.perf_counter()
    found = find_reuse(spec, items, sources, document_env(sources[0].doc), "", errors=False)
    out["match_s"], t = time.perf_counter() - t, time.perf_counter()
    shard_items(spec, [it for it in items if it.index not in found.records], None, found.costs)
    out["shard_s"] = time.perf_counter() - t
    return out


def measure(what: str, spec_path: Path, doc: Path, work: Path) -> dict[str, float]:
    r = subprocess.run(
        [sys.executable, "-m", "bench.reuse", "--child", what, str(spec_path), str(doc), str(work)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the seq lengths (1.0: 1,000,000 items)")
    ap.add_argument("--child", nargs=4, metavar=("WHAT", "SPEC", "DOC", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    plan_spec, doc_spec = specs(args.scale)
    with tempfile.TemporaryDirectory(prefix="bench-reuse-") as tmp:
        work = Path(tmp)
        doc = work / "results.json"
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps({**plan_spec, "output": str(doc)}))
        n_doc = write_doc(doc, plan_spec, doc_spec)
        print(f"doc_records={n_doc}")
        print(f"doc_mb={doc.stat().st_size / 1e6:.0f}")
        plain = measure("plain", spec_path, doc, work)
        reuse = measure("reuse", spec_path, doc, work)
        bare = measure("noindex", spec_path, doc, work)
        prep = measure("prepare", spec_path, doc, work)
        steps = measure("stages", spec_path, doc, work)
    print(f"plan_items={reuse['items']}")
    print(f"reused={reuse['reused']}")
    print(f"left_to_measure={reuse['measured']}")
    print(f"plain_plan_1m_s={plain['s']:.2f}")
    print(f"reuse_plan_1m_s={reuse['s']:.2f}")
    print(f"reuse_vs_plain_plan={reuse['s'] / plain['s']:.2f}")
    print(f"reuse_plan_1m_noindex_s={bare['s']:.2f} (cpu {bare['cpu_s']:.2f}, peak {bare['peak_rss_mb']:.0f} MB)")
    print(f"plain_plan_1m_cpu_s={plain['cpu_s']:.2f}")
    print(f"reuse_plan_1m_cpu_s={reuse['cpu_s']:.2f}")
    print(f"reuse_vs_plain_plan_cpu={reuse['cpu_s'] / plain['cpu_s']:.2f}")
    print(f"reuse_prepare_1m_s={prep['s']:.2f}")
    for k in ("expand_s", "load_s", "match_s", "shard_s"):
        print(f"reuse_plan_step_{k}={steps[k]:.2f}")
    print(f"reuse_plan_1m_noindex_peak_rss_mb={bare['peak_rss_mb']:.0f}")
    print(f"plain_plan_peak_rss_mb={plain['peak_rss_mb']:.0f}")
    print(f"reuse_plan_peak_rss_mb={reuse['peak_rss_mb']:.0f}")
    print(f"reuse_prepare_peak_rss_mb={prep['peak_rss_mb']:.0f}")


if __name__ == "__main__":
    main()
