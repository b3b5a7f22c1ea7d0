"""The schema version of what tilesweep writes for a sweep (``sweep.json``, the partials'
headers): in a module of its own, so the store's readers take it without the spec model and
pydantic (a merge's parse workers, ``store/parse_procs.py``, start in a fraction of the time)."""

SCHEMA_VERSION = 1
