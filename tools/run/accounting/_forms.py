"""The small forms of an accounted run (docs/spec/export.md §4, §6): the actor, the
``at`` clock, record ids, the state paths, and the attempt files' bytes. Nothing here
imports the proof writer, so the command edge can check ``--actor`` cheaply."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from crucible.core.errors import UsageError

__all__ = [
    "ID_RE",
    "StatePaths",
    "check_actor",
    "child_id",
    "default_actor",
    "execution_id",
    "now_at",
]

#: a workflow record id (workflow.md §1)
ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


def check_actor(actor: str) -> str:
    """``--actor``: 1-256 characters without a control character (exit 2 otherwise)."""
    if not 1 <= len(actor) <= 256:
        raise UsageError("--actor must be 1-256 characters", where="--actor")
    for i, c in enumerate(actor):
        if ord(c) < 0x20 or ord(c) == 0x7F:
            raise UsageError(
                f"--actor holds a control character (U+{ord(c):04X} at character {i + 1})",
                where="--actor",
            )
    return actor


def default_actor(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The login name: $LOGNAME, $USER, the passwd name, else ``crucible``."""
    env = os.environ if environ is None else environ
    for var in ("LOGNAME", "USER"):
        name = env.get(var, "")
        if name and 1 <= len(name) <= 256 and all(0x20 <= ord(c) != 0x7F for c in name):
            return name
    try:
        import pwd  # only when the environment names nobody

        return check_actor(pwd.getpwuid(os.getuid()).pw_name)
    except (ImportError, KeyError, UsageError):
        return "crucible"


def now_at(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The UTC second, or ``SOURCE_DATE_EPOCH`` when it is set (reproducible builds)."""
    env = os.environ if environ is None else environ
    raw = env.get("SOURCE_DATE_EPOCH", "")
    seconds = int(raw) if raw.isascii() and raw.isdigit() else int(time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def execution_id(workflow_digest: str, root_case_digest: str) -> str:
    return "x-" + digest.of_json([workflow_digest, root_case_digest])[7:23]


def child_id(task: str, key: str) -> str | None:
    """``<task>.<key>``, or None when that is no record id."""
    cid = f"{task}.{key}"
    return cid if ID_RE.match(cid) else None


class StatePaths:
    """Where an accounted run keeps its accounting (export.md §6)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.workflow = state / "workflow.json"
        self.operations = state / "operations.ndjson"
        self.proof = state / "proof"
        self.artifacts = self.proof / "artifacts"
        self.usage = self.proof / "usage.json"

    ROOT_CASE = "root-case.json"

    @staticmethod
    def blob(data: bytes) -> str:
        """Attempt material is content-addressed, flat: ``sha256-<hex>.json``
        (equal files are kept once; the bundle still holds one copy per attempt)."""
        return "sha256-" + digest.of_bytes(data)[7:] + ".json"


def run_file(at: str, exit_code: int | None) -> bytes:
    return canon.dumps({"exportVersion": 3, "finishedAt": at, "exitCode": exit_code})


def preparation_file(task: str) -> bytes:
    return canon.dumps({"preparationVersion": 1, "task": task})


def evaluation_error_file(exit_code: int | None, reason: str) -> bytes:
    return canon.dumps({"exitCode": exit_code, "reason": reason})


def audit_file(output: Any) -> bytes:
    return canon.dumps(output)
