"""crucible: small composable commands for DAG workflows."""

__version__ = "0.1.0"
