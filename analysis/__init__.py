"""Incident analysis and post-mortem reports (pandas)."""
