"""The run history (``--golden-history DIR``): each session's compared values and distances,
appended to a bounded folder, read back by ``rollout-golden history``, and the change points
in a metric's distances across runs."""
