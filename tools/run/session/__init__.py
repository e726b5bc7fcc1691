"""Admitting a run, its state directory and session log, and finishing its results."""
