"""Benchmarks of chatsite (not tests): `python -m bench.run --quick|--full` (docs/benchmarks.md)."""
