"""An agent's standard streams (docs/spec/run.md, "Agents"; issue 18 item 7).

A real command-line agent (``claude -p``, ``llm``) reads its prompt on stdin
and answers on stdout. So an agent task's stdin is its rendered prompt file,
opened read-only (commands keep ``/dev/null``), and its stdout is a pipe of
its own: every byte still goes to the unit's log, and the first
``RESPONSE_MAX`` bytes are kept. An agent that exits 0 without writing
``CRUCIBLE_OUTPUT`` gets ``{"response": <its stdout>}`` as its result, which
capture then checks like any result file (a declared ``response`` is typed
and capped as every declared field).

Why the prompt file and not a pipe we write: a regular file cannot fill up,
so a prompt larger than a pipe buffer cannot deadlock a worker that is also
draining the agent's output, an agent that never reads stdin cannot make our
write fail (no EPIPE to handle), and an agent may seek or stat it. The
dispatcher holds no descriptor for it: ``posix_spawn`` opens it in the child.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from crucible.core import atomic, canon
from crucible.core.plan import Task

__all__ = ["RESPONSE_FIELD", "RESPONSE_MAX", "AgentStdout", "stdin_source"]

#: the result field an agent's stdout becomes
RESPONSE_FIELD = "response"
#: bytes of stdout kept for ``response`` (our choice): far above the default
#: emit cap (65,536 bytes, which a declared ``response`` must also fit under
#: in IR v2), far below the 64 MiB bound on a result file, and what a worker
#: may hold in memory per running agent. More fails the attempt (measured).
RESPONSE_MAX = 8 * 1024 * 1024


def stdin_source(task: Task, prompt_file: str | None) -> str:
    """The path a task's stdin is opened from: an agent's prompt file (absolute,
    as the child opens it after changing into its workspace), else /dev/null."""
    if task.kind == "agent" and prompt_file is not None:
        return os.path.abspath(prompt_file)
    return os.devnull


class AgentStdout:
    """The read end of an agent's stdout pipe: drained into the log like the
    stderr pipe, with the first RESPONSE_MAX bytes kept for ``response``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._kept = bytearray()
        #: more than RESPONSE_MAX bytes arrived (the rest still reached the log)
        self.over = False

    def drain(self, write: Callable[[bytes], None]) -> bool:
        """Copy what the pipe holds to ``write`` (the log); False at EOF."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return True
            if not data:
                return False
            write(data)
            room = RESPONSE_MAX - len(self._kept)
            if len(data) > room:
                self.over = True
            if room > 0:
                self._kept += data[:room]

    def close(self) -> None:
        os.close(self.fd)

    def substitute(self, output: Path) -> str | None:
        """After a clean exit: when the agent wrote no result file, write
        ``{"response": <stdout>}`` there. Returns why the attempt fails instead
        (stdout over the bound), else None. Bytes that are not UTF-8 become
        U+FFFD (a JSON string holds text)."""
        if os.path.lexists(output):
            return None  # the agent wrote its result: it is what it said
        if self.over:
            return (
                f"the agent wrote no CRUCIBLE_OUTPUT and its stdout is over "
                f"{RESPONSE_MAX} bytes, the bound on a captured {RESPONSE_FIELD!r}; "
                "write the result to CRUCIBLE_OUTPUT or large data to a file declared "
                "in emits_files instead"
            )
        text = self._kept.decode("utf-8", "replace")
        # Atomic like any result file; not durable, as capture reads it at once
        # and a crash reruns the attempt.
        atomic.write_bytes(
            output, canon.dumps({RESPONSE_FIELD: text}), tmp_prefix="@tmp-", durable=False
        )
        return None
