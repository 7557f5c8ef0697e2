"""Benchmarks: `python -m benchmarks.<name>` prints one JSON line per measurement (see BENCHMARKS.md)."""
