"""Internal."""
