"""The scored loop inside a dispatcher session (docs/spec/loop.md)."""
