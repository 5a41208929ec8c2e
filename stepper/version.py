"""stepper's version, below everything: the manifest of a fixture and `stepper --version` say it."""

__version__ = "0.1.0"
