"""Shared primitives: canonical JSON, digests, NDJSON, atomic writes, errors.

``crucible.core`` imports nothing from the tools; every tool imports it.
"""
