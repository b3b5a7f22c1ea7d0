"""Running a sweep: dispatch through submitit, the scheduler's view, status."""
