"""Tests for the fleet runtime: lanes, leases, the turn gate and the beats stream."""
