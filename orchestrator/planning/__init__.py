"""Planning: a spec expanded into work items and packed into units by cost. Pure: no I/O."""
