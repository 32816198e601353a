"""A wrong wall clock for one test process: ``time.time`` (and ``time_ns``) shifted by
``SKEW_SECONDS``. Put this directory first on ``PYTHONPATH`` of a beat to get a host whose
clock is off, as an unsynchronised NTP client leaves it; monotonic time is untouched, as on a
real host."""

from __future__ import annotations

import os
import time

_SKEW = float(os.environ.get("SKEW_SECONDS", "0") or 0)

if _SKEW:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _SKEW
    time.time_ns = lambda: _time_ns() + int(_SKEW * 1e9)
