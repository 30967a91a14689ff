"""Benchmarks are collected only by `make bench` (files named bench_*.py)."""
