"""The report page a sweep writes beside its results document (``report.html: true``): where it
goes (``page_path``), whether a file holds a page tilesweep wrote (``is_page``: its generator tag,
``GENERATOR``; what ``--html`` also replaces), and the file it is written at (``page_target``): a
symbolic link's target, the link kept; refused in one line where the path holds a directory, a
device or pipe, or a file that is not a tilesweep page (a hand-written HTML file too), which the
page would destroy. ``run``, ``resume``, ``wait`` and ``submit`` ask it before anything
runs (``merge.check_target``), so the page's refusal never comes after the GPU time."""

from __future__ import annotations

from pathlib import Path

from orchestrator import PROG
from orchestrator.devicefiles import what_it_is
from orchestrator.errors import ResultsError
from orchestrator.store.files import link_target

# every tilesweep page carries it in its head (``analysis.page.shell``): what tells one from
# another HTML file, which writing a page over would destroy
GENERATOR = '<meta name="generator" content="tilesweep">'
_HEAD_BYTES = 4096  # how much of an existing file is read to tell it is a page (its head, before the style)


def page_path(results: Path) -> Path:
    """Where ``report.html: true`` puts the page: beside the results document, suffix .html."""
    return results.with_name(results.name + ".html") if results.suffix == ".html" else results.with_suffix(".html")


def is_page(path: Path) -> bool:
    """Whether ``path`` holds a page tilesweep wrote (what ``--html`` writes): HTML whose head
    carries tilesweep's generator tag. Another HTML file is not one."""
    with path.open("rb") as f:
        head = f.read(_HEAD_BYTES).lstrip()
    html = head.lower().startswith((b"<!doctype html", b"<html"))
    return html and GENERATOR.encode() in head.partition(b"</head>")[0]


def page_target(page: Path) -> Path:
    """The file the page at ``page`` is written at (a link's target); ``ResultsError`` where
    writing it there would replace what is not a page."""
    target = link_target(page)
    instead = f"move it away, or set report.html to false (`{PROG} report RESULTS --html PAGE` writes it anywhere)"
    if target.is_dir():
        raise ResultsError(f"{page} is a directory, where report.html: true puts the sweep's page; {instead}")
    if target.exists() and not target.is_file():
        raise ResultsError(
            f"{page} is {what_it_is(target)}, not a regular file, where report.html: true puts the sweep's page; "
            f"{instead}"
        )
    try:
        if target.exists() and target.stat().st_size and not is_page(target):
            raise ResultsError(
                f"{page} exists and is not a tilesweep page, which the sweep's page (report.html: true) would replace; "
                f"{instead}"
            )
    except OSError as exc:
        raise ResultsError(f"{page}: cannot read it ({exc.strerror or exc}); {instead}") from None
    return target
