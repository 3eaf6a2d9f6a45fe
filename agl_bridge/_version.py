"""The package version, in a module of its own so that any part can name it without importing the package root."""

from __future__ import annotations

__version__ = "0.1.0"
