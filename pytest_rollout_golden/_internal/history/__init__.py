"""A run history across CI runs: what each run compared, and the change points in it."""
