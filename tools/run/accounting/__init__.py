"""Accounting while running (docs/spec/export.md): an accounted plan's run drives the
proof writer's engine decision by decision and leaves the operation log, its
artifacts and the workflow record in the state directory.

:mod:`._forms` holds the light pieces the command edge needs (``--actor``);
:mod:`._book` the :class:`~._book.Accounting` the dispatcher composes (it loads the
proof writer, so only accounted plans import it).
"""
