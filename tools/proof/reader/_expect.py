"""``--expect FILE``: values held independently of the bundle (docs/spec/verify.md,
"Expectations"). A file that is not such an object is a usage error (exit 2), never a
finding: a wrong expectation must not blame the bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from crucible.core.errors import UsageError
from crucible.proof import layout
from crucible.proof.reader._display import escaped

__all__ = ["EXPECTATION_KEYS", "BadExpectations", "load_expectations"]

_DIGESTS = ("admissionProofDigest", "workflowDigest", "rootCaseDigest", "frozenDigest")
#: members an --expect file may hold
EXPECTATION_KEYS = (*_DIGESTS, "execution", "epochs")
#: an expectation file is a handful of digests (our choice: far above any valid one)
MAX_EXPECT_BYTES = 65536


class BadExpectations(UsageError):
    """The --expect file cannot be read or is not an expectations object (exit 2)."""

    code = "bad-expectations"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _problem(key: str, value: Any) -> str | None:
    if key in _DIGESTS:
        if type(value) is not str or not digest.is_digest(value):
            return f"{key} must be a digest sha256:<64 lowercase hex>, not {_shown(value)}"
    elif key == "execution":
        if type(value) is not str or not layout.ID_RE.match(value):
            return f"execution must be an execution id, not {_shown(value)}"
    elif type(value) is not int or value < 0:  # epochs; bool is not an int here
        return f"epochs must be a non-negative integer, not {_shown(value)}"
    return None


def load_expectations(path: Path) -> dict[str, Any]:
    """Read and check an --expect file; :class:`BadExpectations` when it is not one.
    An argument that is itself a digest ``sha256:<64 lowercase hex>`` pins the
    ``workflowDigest`` and is never read as a file (verify.md, our choice)."""
    if digest.is_digest(str(path)):
        return {"workflowDigest": str(path)}
    where = escaped(path)
    try:
        with open(path, "rb") as f:  # a pipe (<(...)) is a fine source: no regular-file test
            data = f.read(MAX_EXPECT_BYTES + 1)
    except OSError as exc:
        raise BadExpectations(f"cannot read: {exc.strerror}", where=where) from None
    if len(data) > MAX_EXPECT_BYTES:
        raise BadExpectations(f"over {MAX_EXPECT_BYTES} bytes", where=where)
    try:
        value = canon.loads(data)
    except canon.CanonError as exc:
        raise BadExpectations(exc.message, where=where) from None
    if type(value) is not dict or not value or set(value) - set(EXPECTATION_KEYS):
        raise BadExpectations(
            f"not an object with some of the members {', '.join(EXPECTATION_KEYS)}", where=where
        )
    for key in EXPECTATION_KEYS:
        if key in value and (problem := _problem(key, value[key])) is not None:
            raise BadExpectations(problem, where=where)
    return value
