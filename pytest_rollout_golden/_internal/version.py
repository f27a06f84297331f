"""The package's version, where the code below the package root can read it."""

VERSION = "0.1.0"
