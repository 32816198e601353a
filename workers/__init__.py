"""soulfleet: file-defined persona agents run as a fleet on Celery + Redis.

This package imports nothing heavy. ``workers.persona`` is the pure core (no Celery, no Redis);
the Celery app lives in ``workers.celery`` (which ``celery -A workers`` finds by convention);
the host API is ``workers.fleet.Fleet``.
"""
