"""Benchmarks, simulator and load tests (run on purpose, printing figures)."""
