"""Received attempt material: reading it safely and checking its forms and the
pin/phase table (docs/spec/workflow.md §9)."""

from __future__ import annotations

import os
import stat as _stat
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.errors import InputRefused, Location
from crucible.proof import layout
from crucible.proof.writer._ops import is_timestamp

__all__ = [
    "MAX_NESTING",
    "TooLarge",
    "check_pins",
    "depth_ok",
    "read_artifact",
    "resolve_pointer",
    "strict_json",
]

MAX_NESTING = 64

# (state, failure) -> pin -> "req" | "opt" | "no"
_REQ, _OPT, _NO = "req", "opt", "no"
_TABLE: dict[tuple[str, str | None], dict[str, str]] = {
    ("evaluated", None): dict(
        runDigest=_REQ,
        preparationDigest=_REQ,
        auditDigest=_REQ,
        evaluationErrorDigest=_NO,
        auditSignaturesDigest=_OPT,
    ),
    ("failed", "acquisition-failed"): dict(runDigest=_OPT),
    ("failed", "preparation-failed"): dict(runDigest=_REQ),
    ("failed", "admission-refused"): dict(runDigest=_REQ, preparationDigest=_OPT),
    ("failed", "evaluation-error"): dict(
        runDigest=_REQ, preparationDigest=_REQ, evaluationErrorDigest=_REQ
    ),
    ("interrupted", None): dict(runDigest=_OPT, preparationDigest=_OPT),
    ("cancelled", None): dict(runDigest=_OPT, preparationDigest=_OPT),
    ("suppressed", None): {},
}


class TooLarge(Exception):
    """A received file over its local bound: it cannot be recorded (exit 3)."""


def read_artifact(root: Path, rel: str, where: Location, base: Path | None = None) -> bytes:
    """Bytes of ``root/rel``; the path must stay inside ``root`` and be a regular file.
    ``base``: ``root`` resolved already (a caller reading many files resolves it once:
    a realpath walks every component)."""
    if base is not None and "/" not in rel and rel not in ("", ".", ".."):
        # one component below an already resolved directory: inside it unless it is a
        # link, so an lstat replaces the realpath walk (most of a received file's cost)
        try:
            st = os.lstat(base / rel)
        except FileNotFoundError:
            raise InputRefused(f"artifact {rel!r} not found in {root}", where=where) from None
        except OSError as exc:
            raise InputRefused(f"artifact {rel!r}: {exc.strerror}", where=where) from None
        if not _stat.S_ISLNK(st.st_mode):
            return _regular_bytes(base / rel, rel, st, where)
    base = base if base is not None else root.resolve()
    target = (root / rel).resolve()
    if target != base and base not in target.parents:
        raise InputRefused(f"artifact {rel!r} escapes the artifacts directory", where=where)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        raise InputRefused(f"artifact {rel!r} not found in {root}", where=where) from None
    except OSError as exc:
        raise InputRefused(f"artifact {rel!r}: {exc.strerror}", where=where) from None
    return _regular_bytes(target, rel, st, where)


def _regular_bytes(target: Path, rel: str, st: os.stat_result, where: Location) -> bytes:
    """The bytes of a received file whose ``st`` says it is regular and within bound."""
    if not _stat.S_ISREG(st.st_mode):
        raise InputRefused(f"artifact {rel!r} is not a regular file", where=where)
    if st.st_size > layout.MAX_RECEIVED_FILE_BYTES:
        raise TooLarge(f"artifact {rel!r} is {st.st_size} bytes, over the 8 MiB local bound")
    try:
        return target.read_bytes()
    except OSError as exc:
        raise InputRefused(f"artifact {rel!r}: {exc.strerror}", where=where) from None


def depth_ok(value: Any, limit: int = MAX_NESTING) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > limit:
                return False
            items = v.values() if isinstance(v, dict) else v
            stack.extend((x, d + 1) for x in items if isinstance(x, dict | list))
    return True


def strict_json(data: bytes, what: str, where: Location, note: str = "") -> Any:
    """``data`` as strict JSON (crucible.core.canon), or one refusal naming ``what``."""
    try:
        return canon.loads(data)
    except canon.CanonError as exc:
        raise InputRefused(f"{what} is not strict JSON{note}: {exc.message}", where=where) from None


def _json_object(data: bytes, what: str, where: Location) -> dict[str, Any]:
    value = strict_json(data, what, where, " (input-malformed)")
    if not isinstance(value, dict):
        raise InputRefused(f"{what} must be a JSON object (input-malformed)", where=where)
    if not depth_ok(value):
        raise InputRefused(f"{what} nests deeper than {MAX_NESTING} (input-malformed)", where=where)
    return value


def check_pins(
    state: str, failure: str | None, files: dict[str, bytes], where: Location
) -> dict[str, Any]:
    """Check the pin/phase table and each file's form; return the parsed audit (or {})."""
    row = _TABLE[(state, failure)]
    label = f"{state}" + (f"/{failure}" if failure else "")
    for pin in layout.ATTEMPT_FILES:
        rule = row.get(pin, _NO)
        present = pin in files
        if rule == _REQ and not present:
            raise InputRefused(
                f"a {label} observation requires {pin} (pin/phase table)", where=where
            )
        if rule == _NO and present:
            raise InputRefused(
                f"a {label} observation cannot pin {pin} (pin/phase table)", where=where
            )
    if "preparationDigest" in files and "runDigest" not in files:
        raise InputRefused("a preparation pin requires a run pin (pin/phase table)", where=where)
    parsed: dict[str, Any] = {}
    if "runDigest" in files:
        run = _json_object(files["runDigest"], "run.json", where)
        version = run.get("exportVersion")
        if type(version) is not int or version not in (2, 3):
            raise InputRefused(
                f"run export version {version!r} is unread (version-unread); "
                "this profile reads exportVersion 2 and 3",
                where=where,
            )
        finished = run.get("finishedAt")
        if finished is not None and not is_timestamp(finished):
            raise InputRefused(
                "run.json finishedAt must be a UTC-second timestamp or null (input-malformed)",
                where=where,
            )
        needs_instant = failure == "preparation-failed" or (
            failure == "admission-refused" and "preparationDigest" not in files
        )
        if needs_instant and finished is None:
            raise InputRefused(
                f"a {label} observation without a preparation needs run.json finishedAt "
                "(input-malformed)",
                where=where,
            )
    if "preparationDigest" in files:
        _json_object(files["preparationDigest"], "preparation.json", where)
    if "evaluationErrorDigest" in files:
        _json_object(files["evaluationErrorDigest"], "evaluation-error.json", where)
    if "auditDigest" in files:
        data = files["auditDigest"]
        parsed = _json_object(data, "audit.json", where)
        if canon.dumps(parsed) != data:
            raise InputRefused(
                "audit.json must be canonical JSON bytes (input-malformed)", where=where
            )
    if "auditSignaturesDigest" in files:
        n = len(files["auditSignaturesDigest"])
        if not 1 <= n <= layout.MAX_SIGNATURE_BYTES:
            raise InputRefused(
                f"audit.sig is {n} bytes; a signature sidecar holds 1-"
                f"{layout.MAX_SIGNATURE_BYTES} bytes (input-over-bound)",
                where=where,
            )
    return parsed


_MISSING = object()


def resolve_pointer(doc: Any, pointer: str) -> Any:
    """RFC 6901; returns the module's ``_MISSING`` sentinel when absent."""
    if pointer == "":
        return doc
    value = doc
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            if token not in value:
                return _MISSING
            value = value[token]
        elif isinstance(value, list):
            if not token.isdigit() or (token != "0" and token.startswith("0")):
                return _MISSING
            index = int(token)
            if index >= len(value):
                return _MISSING
            value = value[index]
        else:
            return _MISSING
    return value


def output_records(audit: dict[str, Any], pointer: str, cardinality: str) -> list[Any] | None:
    """The output proposal of a valid audit, or None for a bad output shape."""
    value = resolve_pointer(audit, pointer)
    if cardinality == "one":
        return [value] if isinstance(value, dict) else None
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return list(value)
    return None
