"""What environment a task process receives (docs/spec/run.md, "Environment").

Edition 1 keeps the dispatcher's whole environment. Editions 2 and 3 pass only
the host variables the task declares in ``env``, plus a small fixed base set
(``BASE_VARS``) that programs need to start at all. Host ``CRUCIBLE_*``
variables are never passed through in any edition: the ones a task sees are
the ones this run sets, so a nested run cannot leak its own inputs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = ["BASE_VARS", "task_environment", "workspace_marker"]

#: Passed through from the host in editions 2 and 3 when set (our choice):
#: PATH so argv[0] and the programs a script calls resolve as they do for the
#: user; locale and time zone so text and times are read as the user expects;
#: TMPDIR so temporary files land where the host wants them. HOME, USER and
#: everything else must be declared.
BASE_VARS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


def task_environment(
    edition: int, declared: Sequence[str], host: Mapping[str, str]
) -> dict[str, str]:
    """The host part of a task's environment (crucible variables are added later):
    at edition 1 the whole host's, from edition 2 :data:`BASE_VARS` and the
    variables the task declares in ``env`` (``declared``)."""
    if edition <= 1:
        return {k: v for k, v in host.items() if not k.startswith("CRUCIBLE_")}
    env = {k: host[k] for k in BASE_VARS if k in host}
    for name in declared:
        if name in host and not name.startswith("CRUCIBLE_"):
            env[name] = host[name]
    return env


def workspace_marker(state: str | os.PathLike[str]) -> bytes:
    """The start of the ``CRUCIBLE_WORKSPACE`` entry in the environment of
    every task of a run on ``state`` (spelled as that run spelled it): how a
    process is known to be a task of this state dir (the reaper, and
    ``--resume``'s leftovers: docs/spec/run.md, "Orphans")."""
    return b"CRUCIBLE_WORKSPACE=" + os.fsencode(state) + b"/work/"
