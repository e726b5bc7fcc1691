"""The task cache: keys, the store, hits, ``--reuse`` and a task's declared reads."""
