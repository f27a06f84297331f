"""Which commit moved the numbers: replaying the selected tests at other commits of a git repo."""
