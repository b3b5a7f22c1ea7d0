"""Running a sweep, without printing: dispatch through submitit (``dispatch/``), the scheduler's
view (``scheduler``), status, and the flows the CLI drives (``sweeps``, ``submit``, ``resume``,
``wait``, and ``rounds``, which advances a sweep to its next round whoever calls it), which
return what happened or raise a ``TilesweepError``."""
