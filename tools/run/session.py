"""The session log ``STATE/session.jsonl``: one canonical JSON event per line.

Events are buffered within one turn of the dispatcher's loop and written with a
single ``write`` + ``fsync`` before the loop blocks or starts another process
(group commit): every event is on disk before anything that follows from it
happens, at one fsync per turn instead of one per line. A mirror stream
(``--events FILE|-``) receives the same bytes right after they are durable.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from crucible.core import ndjson
from crucible.core.errors import OperationalError

__all__ = ["EVENT_KINDS", "SessionLog", "now_text", "read_events"]

EVENT_KINDS = (
    "plan_admitted",
    "task_started",
    "task_finished",
    "run_finished",
    "shutdown",
)


def now_text(t: float | None = None) -> str:
    """RFC 3339 UTC time with milliseconds, e.g. ``2026-11-30T07:55:24.123Z``."""
    moment = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class SessionLog:
    """Append-only, fsync'd event log of one dispatcher session."""

    def __init__(self, path: Path, session: int, mirror: IO[bytes] | None = None) -> None:
        self.path = path
        self.session = session
        self.mirror = mirror
        self._pending: list[bytes] = []
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise OperationalError(
                f"cannot open session log: {exc.strerror}", where=str(path)
            ) from None

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Queue one event; it is durable after the next :meth:`commit`."""
        event: dict[str, Any] = {"event": kind, "session": self.session, "time": now_text()}
        event.update({k: v for k, v in fields.items() if v is not None})
        self._pending.append(ndjson.dumps_line(event))
        return event

    def commit(self) -> None:
        """Write and fsync every queued event, then copy them to the mirror."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            raise OperationalError(
                f"cannot write session log: {exc.strerror}", where=str(self.path)
            ) from None
        if self.mirror is not None:
            try:
                self.mirror.write(data)
                self.mirror.flush()
            except BrokenPipeError:
                # A closed --events reader must not stop the run; the log on disk
                # stays complete.
                self.mirror = None

    def close(self) -> None:
        self.commit()
        os.close(self._fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event of a session log. A torn last line (a crash mid-write, before
    its fsync) is ignored; any other bad line is reported as ``file:line``."""
    import io

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise OperationalError(
            f"cannot read session log: {exc.strerror}", where=str(path)
        ) from None
    complete = data[: data.rfind(b"\n") + 1]
    return [
        value for _, value in ndjson.iter_lines(io.BytesIO(complete), name=str(path), strict=False)
    ]
