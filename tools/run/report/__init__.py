"""``crucible-dispatch report``: reading a state dir, as text, NDJSON and HTML."""
