"""The spec and record models: what a sweep asks for, and what one record is."""
