"""The local wing: what ``soulfleet up`` runs on one machine.

The supervisor of child processes, the embedded redis-server, the data directory and the demo
personas. Nothing here is used by a deployed worker or beat.
"""
