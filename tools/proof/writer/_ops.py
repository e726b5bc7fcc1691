"""The operation log (docs/spec/admission-proof.md §7): one typed operation per line.

Only the *form* of each line is checked here; whether the rules allow it is the
engine's business. Errors name ``OPS:LINE``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from crucible.core import ndjson
from crucible.core.errors import InputRefused, Location, OperationalError
from crucible.core.structs import dataclass
from crucible.proof import layout

__all__ = [
    "FILE_ROLES",
    "OBSERVATION_STATES",
    "Assertion",
    "Cancel",
    "Finish",
    "Group",
    "Observe",
    "Op",
    "Recover",
    "Retry",
    "Root",
    "Select",
    "Stop",
    "iter_operations",
    "parse_operation",
]

#: operation ``files`` role -> observation pin member
FILE_ROLES: dict[str, str] = {
    "run": "runDigest",
    "preparation": "preparationDigest",
    "audit": "auditDigest",
    "evaluationError": "evaluationErrorDigest",
    "auditSignatures": "auditSignaturesDigest",
}
OBSERVATION_STATES = ("evaluated", "failed", "interrupted", "cancelled", "suppressed")
FAILURES = ("acquisition-failed", "preparation-failed", "admission-refused", "evaluation-error")


@dataclass(frozen=True)
class _Logged:
    """What every operation carries: its line in the log (errors name ``OPS:LINE``)."""

    line: int


@dataclass(frozen=True)
class Assertion:
    """Who took a decision and when: a selection's ``review``, a cancel's or a
    retry's ``actor`` and ``at``."""

    actor: str
    at: str

    def as_json(self) -> dict[str, str]:
        return {"actor": self.actor, "at": self.at}


@dataclass(frozen=True)
class Root(_Logged):
    """``root``: the execution's first instance and its case file."""

    execution: str
    root_instance: str
    case: str


@dataclass(frozen=True)
class Select(_Logged):
    """``select`` or ``fork`` (``fork`` set): outputs of a stage taken as children."""

    fork: bool
    stage: str
    review: Assertion
    selected: tuple[tuple[str, int], ...]
    child_ids: tuple[str, ...] | None


@dataclass(frozen=True)
class Cancel:
    """One member of a group's ``cancelled`` (not an operation of its own)."""

    instance: str
    by: Assertion


@dataclass(frozen=True)
class Group(_Logged):
    """``group``: a reservation's instances started, cancelled or deferred."""

    reservation: int
    starts: tuple[str, ...]
    cancelled: tuple[Cancel, ...]
    deferred: tuple[str, ...] | None


@dataclass(frozen=True)
class Retry(_Logged):
    """``retry``: a new attempt of one instance."""

    instance: str
    by: Assertion


@dataclass(frozen=True)
class Observe(_Logged):
    """``observe``: one attempt's outcome and the artifacts that pin it."""

    instance: str
    attempt: int
    state: str
    failure: str | None
    #: pin member -> artifact path relative to the artifacts directory
    files: dict[str, str]


@dataclass(frozen=True)
class Recover(_Logged):
    """``recover``: the open epoch's remaining begun slots closed ``interrupted``."""


@dataclass(frozen=True)
class Stop(_Logged):
    """``cancel``: the open epoch's remaining begun slots closed ``cancelled``."""


@dataclass(frozen=True)
class Finish(_Logged):
    """``finish``: the finalization files, bundle path -> artifact path."""

    files: dict[str, str]


Op = Root | Select | Group | Retry | Observe | Recover | Stop | Finish


class _Form:
    def __init__(self, where: Location) -> None:
        self.where = where

    def fail(self, message: str) -> InputRefused:
        return InputRefused(message, where=self.where)

    def closed(self, obj: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        if not isinstance(obj, dict):
            raise self.fail("must be a JSON object")
        for m in required:
            if m not in obj:
                raise self.fail(f"missing member {m!r}")
        for m in obj:
            if m not in required and m not in optional:
                raise self.fail(f"unknown member {m!r}")

    def ident(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or not layout.ID_RE.match(value):
            raise self.fail(
                f"{what} {value!r} is not a valid id (1-128 of [A-Za-z0-9._-], "
                "starting with a letter or digit)"
            )
        return value

    def stage(self, value: Any) -> str:
        if not isinstance(value, str) or not layout.STAGE_RE.match(value):
            raise self.fail(f"stage {value!r} is not a valid stage name")
        return value

    def actor(self, value: Any) -> str:
        if (
            not isinstance(value, str)
            or not 1 <= len(value) <= 256
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
        ):
            raise self.fail("actor must be 1-256 characters without control characters")
        return value

    def timestamp(self, value: Any) -> str:
        if not is_timestamp(value):
            raise self.fail(f"{value!r} is not a UTC-second timestamp (YYYY-MM-DDTHH:MM:SSZ)")
        assert isinstance(value, str)
        return value

    def assertion(self, obj: dict[str, Any]) -> Assertion:
        """``actor`` and ``at`` of an object whose members were checked."""
        return Assertion(self.actor(obj["actor"]), self.timestamp(obj["at"]))

    def count(self, value: Any, what: str, minimum: int = 0) -> int:
        if type(value) is not int or value < minimum:
            raise self.fail(f"{what} must be an integer >= {minimum}")
        return value

    def relpath(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or not value or "\x00" in value:
            raise self.fail(f"{what} must be a relative path")
        parts = value.split("/")
        if value.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in value:
            raise self.fail(f"{what} {value!r} must be a relative path without '.', '..' or '//'")
        return value


def is_timestamp(value: Any) -> bool:
    if not isinstance(value, str) or not layout.TIMESTAMP_RE.match(value):
        return False
    try:
        _dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


def _ids(f: _Form, value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise f.fail(f"{what} must be an array of ids")
    return tuple(f.ident(v, what) for v in value)


def _root(f: _Form, obj: dict[str, Any], line: int) -> Root:
    f.closed(obj, ("op", "execution", "rootInstance", "case"))
    return Root(
        line,
        f.ident(obj["execution"], "execution"),
        f.ident(obj["rootInstance"], "rootInstance"),
        f.relpath(obj["case"], "case"),
    )


def _select(f: _Form, obj: dict[str, Any], line: int) -> Select:
    """``select`` and ``fork`` share one form."""
    f.closed(obj, ("op", "stage", "review", "selected", "childIds"))
    review = obj["review"]
    f.closed(review, ("actor", "at"))
    selected_raw = obj["selected"]
    if not isinstance(selected_raw, list):
        raise f.fail("selected must be an array of {instance, output}")
    selected: list[tuple[str, int]] = []
    for item in selected_raw:
        f.closed(item, ("instance", "output"))
        selected.append(
            (f.ident(item["instance"], "selected instance"), f.count(item["output"], "output"))
        )
    child_raw = obj["childIds"]
    child_ids = None if child_raw is None else _ids(f, child_raw, "childIds")
    return Select(
        line,
        obj["op"] == "fork",
        f.stage(obj["stage"]),
        f.assertion(review),
        tuple(selected),
        child_ids,
    )


def _group(f: _Form, obj: dict[str, Any], line: int) -> Group:
    f.closed(obj, ("op", "reservation", "starts", "cancelled"), ("deferred",))
    cancelled_raw = obj["cancelled"]
    if not isinstance(cancelled_raw, list):
        raise f.fail("cancelled must be an array of {instance, actor, at}")
    cancelled = []
    for item in cancelled_raw:
        f.closed(item, ("instance", "actor", "at"))
        cancelled.append(Cancel(f.ident(item["instance"], "cancelled instance"), f.assertion(item)))
    deferred = _ids(f, obj["deferred"], "deferred") if "deferred" in obj else None
    return Group(
        line,
        f.count(obj["reservation"], "reservation", 1),
        _ids(f, obj["starts"], "starts"),
        tuple(cancelled),
        deferred,
    )


def _retry(f: _Form, obj: dict[str, Any], line: int) -> Retry:
    f.closed(obj, ("op", "instance", "actor", "at"))
    return Retry(line, f.ident(obj["instance"], "instance"), f.assertion(obj))


def _observe(f: _Form, obj: dict[str, Any], line: int) -> Observe:
    f.closed(obj, ("op", "instance", "attempt", "state", "failure", "files"))
    state = obj["state"]
    if state not in OBSERVATION_STATES:
        raise f.fail(f"state must be one of {', '.join(OBSERVATION_STATES)}")
    failure = obj["failure"]
    if state == "failed":
        if failure not in FAILURES:
            raise f.fail(f"a failed observation needs failure: one of {', '.join(FAILURES)}")
    elif failure is not None:
        raise f.fail(f"failure must be null for state {state}")
    files_raw = obj["files"]
    f.closed(files_raw, (), tuple(FILE_ROLES))
    files = {FILE_ROLES[k]: f.relpath(v, f"files.{k}") for k, v in files_raw.items()}
    return Observe(
        line,
        f.ident(obj["instance"], "instance"),
        f.count(obj["attempt"], "attempt", 1),
        state,
        failure,
        files,
    )


def _recover(f: _Form, obj: dict[str, Any], line: int) -> Recover:
    f.closed(obj, ("op",))
    return Recover(line)


def _cancel(f: _Form, obj: dict[str, Any], line: int) -> Stop:
    f.closed(obj, ("op",))
    return Stop(line)


def _finish(f: _Form, obj: dict[str, Any], line: int) -> Finish:
    f.closed(obj, ("op", "files"))
    files_raw = obj["files"]
    f.closed(files_raw, (), tuple(files_raw) if isinstance(files_raw, dict) else ())
    files = {}
    for target, source in files_raw.items():
        if not layout.is_finalization_path(target) or target == layout.PARTIAL:
            raise f.fail(
                f"finalization file {target!r} must be README.md, trust.json, "
                "expected-report.json or aux/<path>"
            )
        f.relpath(target, "finalization path")
        _check_bundle_path(f, target)
        files[target] = f.relpath(source, f"files[{target!r}]")
    for target in files:
        # a file and a directory cannot share a name in the bundle
        if any(other.startswith(target + "/") for other in files):
            raise f.fail(f"finalization path {target!r} is also a directory of another one")
    return Finish(line, files)


#: one parser per operation kind (admission-proof.md §7), in the spec's order
_PARSERS: dict[str, Callable[[_Form, dict[str, Any], int], Op]] = {
    "root": _root,
    "select": _select,
    "fork": _select,
    "group": _group,
    "retry": _retry,
    "observe": _observe,
    "recover": _recover,
    "cancel": _cancel,
    "finish": _finish,
}


def parse_operation(obj: dict[str, Any], line: int, where: Location) -> Op:
    """Check one operation object's form and return its typed value."""
    f = _Form(where)
    kind = obj.get("op")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise f.fail(f"unknown op {kind!r} ({', '.join(_PARSERS)})")
    return parser(f, obj, line)


#: longest finalization path in bytes (our choice: far below PATH_MAX with the bundle's
#: own location in front of it)
MAX_BUNDLE_PATH_BYTES = 1024


def _check_bundle_path(f: _Form, target: str) -> None:
    """A finalization path must be writable and readable as bundle names: the reader
    refuses a component over 255 UTF-8 bytes or holding a control character."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        raise f.fail(f"finalization path {target!r} holds a control character")
    if any(len(part.encode("utf-8")) > 255 for part in target.split("/")):
        raise f.fail(f"finalization path {target[:64]!r}... has a component over 255 bytes")
    if len(target.encode("utf-8")) > MAX_BUNDLE_PATH_BYTES:
        raise f.fail(f"finalization path {target[:64]!r}... is over {MAX_BUNDLE_PATH_BYTES} bytes")


def iter_operations(path: Path, *, torn: list[int] | None = None) -> Iterator[Op]:
    """Typed operations of an NDJSON log, lazily, each error naming ``path:line``.
    ``-`` reads standard input. With ``torn`` (a list), a last line that lacks its
    newline — its writer was killed mid-append — is not read: its number is appended
    to ``torn`` instead (the export of a crashed run, admission-proof.md §11)."""
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        if torn is None or name == "<stdin>":
            for line, obj in ndjson.read_path(path):
                yield parse_operation(obj, line, Location(name, line))
            return
        with open(path, "rb") as f:
            for line, obj in ndjson.iter_lines(_complete_lines(f, torn), name=name):
                yield parse_operation(obj, line, Location(name, line))
    except OSError as exc:
        raise OperationalError(f"cannot read operations: {exc.strerror}", where=name) from None


def _complete_lines(f: IO[bytes], torn: list[int]) -> Iterator[bytes]:
    """The lines of ``f`` that end with a newline; the number of a last one that
    does not goes to ``torn``."""
    for number, raw in enumerate(f, start=1):
        if not raw.endswith(b"\n"):
            torn.append(number)
            return
        yield raw
