"""Benchmarks: commands that print figures (not collected as tests)."""
