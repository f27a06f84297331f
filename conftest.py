"""Root conftest: this repository's own goldens live in ./golden (see pyproject.toml)."""
