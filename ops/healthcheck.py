#!/usr/bin/env python3
"""Container health checks for the soulfleet image (installed as ``soulfleet-healthcheck``).

Two checks, standard library only, so a check never imports Celery or opens a Redis
connection of its own (a health check that needs the thing it checks hides the failure):

- ``beat [--max-age S]``: this beat process's ``/metrics`` answers and its newest sweep
  (``soulfleet_last_sweep_timestamp_seconds``) is at most S seconds old. A beat that is up but
  no longer sweeping is exactly the failure that silences a fleet, so liveness is the sweep.
- ``http URL``: the URL answers 2xx (Flower's ``/healthcheck``).

Exit 0 when healthy, 1 otherwise, with one line saying why (Docker keeps it in
``docker inspect``'s health log).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.error
import urllib.request

__all__ = ["check_beat", "check_http", "main"]

_LAST_SWEEP = re.compile(
    r"^soulfleet_last_sweep_timestamp_seconds(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE
)


def _get(url: str, timeout: float) -> tuple[int, str]:
    # http(s) only: the URLs are this script's own and compose's healthcheck lines.
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    request = urllib.request.Request(url, headers={"User-Agent": "soulfleet-healthcheck"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return int(response.status), response.read().decode("utf-8", "replace")


def check_http(url: str, *, timeout: float = 5.0) -> str | None:
    """None when ``url`` answers 2xx, else why not."""
    try:
        status, _ = _get(url, timeout)
    except urllib.error.HTTPError as exc:
        return f"{url} answered HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"{url} unreachable: {exc}"
    if not 200 <= status < 300:
        return f"{url} answered HTTP {status}"
    return None


def check_beat(metrics_url: str, *, max_age: float, timeout: float = 5.0) -> str | None:
    """None when the newest sweep finished at most ``max_age`` seconds ago, else why not."""
    try:
        _, body = _get(metrics_url, timeout)
    except (OSError, ValueError) as exc:
        return f"metrics at {metrics_url} unreachable: {exc}"
    match = _LAST_SWEEP.search(body)
    if match is None:
        return "soulfleet_last_sweep_timestamp_seconds is not exported: is this a beat?"
    try:
        last = float(match.group(1))
    except ValueError:
        return f"unreadable last sweep time {match.group(1)!r}"
    if last <= 0:
        return "no sweep has finished yet"
    age = time.time() - last
    if age > max_age:
        return f"newest sweep finished {age:.0f}s ago (limit {max_age:.0f}s)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soulfleet-healthcheck", description=__doc__)
    sub = parser.add_subparsers(dest="check", required=True)
    beat = sub.add_parser("beat", help="the newest sweep of this beat is recent")
    beat.add_argument("--max-age", type=float, default=60.0, help="seconds (default 60)")
    beat.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("SOULFLEET_METRICS_PORT") or 9808),
        help="metrics port (default SOULFLEET_METRICS_PORT, else 9808)",
    )
    http = sub.add_parser("http", help="a URL answers 2xx")
    http.add_argument("url")
    for each in (beat, http):
        each.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    args = parser.parse_args(argv)

    if args.check == "beat":
        url = f"http://127.0.0.1:{args.port}/metrics"
        problem = check_beat(url, max_age=args.max_age, timeout=args.timeout)
    else:
        problem = check_http(args.url, timeout=args.timeout)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    print("healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
