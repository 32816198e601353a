"""Cron for beat: the ONE parser lives in the persona core (:mod:`workers.persona.cron`).

persona.toml's parser, ``run --local``, the registry sync and the sweep must agree on which
expressions are valid and when they fire; two parsers disagreed (a cron beat rejected passed
``run --local``). The core owns it because beat imports the core, never the other way round.
"""

from __future__ import annotations

from workers.persona.cron import CronError, CronExpr, next_fire, parse_cron, zone

__all__ = ["CronError", "CronExpr", "next_fire", "parse_cron", "zone"]
