"""The version of this library."""

__version__ = "0.1.0"
