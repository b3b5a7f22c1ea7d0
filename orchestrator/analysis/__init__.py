"""Reading results documents: best configs, comparisons, the tuned table, plots, the report page."""
