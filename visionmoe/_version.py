"""The package version, in a module of its own so that ``--version`` and the packaging read
it without importing torch or either plug-in."""

__version__ = "0.1.0"
