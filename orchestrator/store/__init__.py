"""Everything on disk about one sweep: the sweep directory, the partial-line protocol, locks,
quarantine, the merge and the results document."""
