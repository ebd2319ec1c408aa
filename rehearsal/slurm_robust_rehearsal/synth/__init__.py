"""Synthetic inputs with exact ground truth: run logs (``runs``), fleet-scale analysis
inputs (``fleet``) and stack captures (``stacks``), for tests and benchmarks."""
