"""Errors of the health probes, in a leaf module: the NVML reader raises them and the
probes and the check framework catch them, without importing each other for it."""

from __future__ import annotations


class NoNVMLError(RuntimeError):
    """NVML is not available on this node (no driver, no library)."""


class NVMLHungError(RuntimeError):
    """An earlier NVML call on this run did not return within its check's budget."""
