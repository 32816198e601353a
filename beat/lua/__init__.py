"""beat's Lua scripts (package data, read with importlib.resources by :mod:`beat.sweep`).

A package rather than a bare directory so setuptools ships the ``*.lua`` files with the wheel.
"""

from __future__ import annotations

__all__: list[str] = []
