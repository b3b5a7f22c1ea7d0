"""Running a sweep, without printing: dispatch through submitit (``dispatch/``), the scheduler's
view (``scheduler``), status, and the flows the CLI drives (``sweeps``, ``submit``, ``resume``,
``wait``), which return what happened or raise a ``TilesweepError``."""
