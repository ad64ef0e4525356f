"""The package version (one place; the package, run.json and --version read it)."""

__version__ = "0.1.0"
