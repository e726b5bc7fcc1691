"""The workflow document (docs/spec/workflow.md §2): strict parsing into typed form."""

from __future__ import annotations

import sys
from functools import cached_property
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.digest import of_bytes
from crucible.core.errors import InputRefused, OperationalError, UnsupportedVersion
from crucible.core.structs import dataclass
from crucible.proof import layout

__all__ = ["Limits", "Stage", "Workflow", "load_workflow", "parse_workflow"]

MAX_STAGES = 64


@dataclass(frozen=True)
class Limits:
    """The workflow's ``limits`` (workflow.md §2), each a positive integer."""

    max_bytes: int
    max_files: int
    max_instances: int
    max_attempts: int
    max_records: int
    max_case_bytes: int
    max_payload_bytes: int


@dataclass(frozen=True)
class Stage:
    """One member of ``stages``; ``index`` is its place in the document."""

    name: str
    index: int
    from_stage: str | None
    fields: tuple[str, ...] | None
    admit_max_bytes: int | None
    pointer: str
    cardinality: str
    #: canonical bytes of the stage object (the frozen file)
    frozen: bytes


@dataclass(frozen=True)
class Workflow:
    """A parsed workflow: the canonical document, then what it says (``stages`` in
    document order, which is topological)."""

    #: canonical bytes of the whole document (workflow.json)
    data: bytes
    name: str
    limits: Limits
    stages: tuple[Stage, ...]

    @cached_property
    def digest(self) -> str:
        """The workflow's digest: always that of ``data``."""
        return of_bytes(self.data)

    @property
    def root(self) -> Stage:
        return self.stages[0]

    def stage(self, name: str) -> Stage | None:
        for s in self.stages:
            if s.name == name:
                return s
        return None

    def consumers(self, name: str) -> list[Stage]:
        """Direct consumers of ``name`` in workflow order."""
        return [s for s in self.stages if s.from_stage == name]

    def strict_descendants(self, name: str) -> list[Stage]:
        """Strict descendants through input.fromStage, in workflow order."""
        found = {name}
        out: list[Stage] = []
        for s in self.stages:  # workflow order is topological
            if s.from_stage is not None and s.from_stage in found:
                found.add(s.name)
                out.append(s)
        return out


def _refuse(message: str, where: str) -> InputRefused:
    return InputRefused(message, where=where)


def _closed(obj: Any, members: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _refuse("must be a JSON object", where)
    missing = [m for m in members if m not in obj]
    extra = sorted(set(obj) - set(members))
    if missing:
        raise _refuse(f"missing member {missing[0]!r}", where)
    if extra:
        raise _refuse(f"unknown member {extra[0]!r}", where)
    return obj


def _positive_int(value: Any, where: str) -> int:
    if type(value) is not int or value < 1:
        raise _refuse("must be a positive integer", where)
    return value


def _no_controls(text: Any, where: str, limit: int) -> str:
    if not isinstance(text, str) or not 1 <= len(text) <= limit:
        raise _refuse(f"must be a string of 1-{limit} characters", where)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise _refuse("must not hold control characters", where)
    return text


def _pointer_ok(pointer: str) -> bool:
    if pointer == "":
        return True
    if not pointer.startswith("/"):
        return False
    # "~" must be followed by 0 or 1 (RFC 6901)
    i = 0
    while (i := pointer.find("~", i)) != -1:
        if pointer[i + 1 : i + 2] not in ("0", "1"):
            return False
        i += 1
    return True


def parse_workflow(data: bytes, name: str = "workflow") -> Workflow:
    """Parse and check a workflow document; raise with ``name:$.path`` on a fault."""
    doc = canon.loads(data)
    if not isinstance(doc, dict):
        raise _refuse("a workflow must be a JSON object", name)
    if doc.get("workflowVersion") != 2 or type(doc.get("workflowVersion")) is not int:
        raise UnsupportedVersion(
            f"workflowVersion {doc.get('workflowVersion')!r} is unread (version-unread); "
            "this writer reads workflowVersion 2",
            where=f"{name}:$.workflowVersion",
        )
    _closed(doc, ("workflowVersion", "name", "limits", "stages"), name)
    wf_name = _no_controls(doc["name"], f"{name}:$.name", 128)
    lim = _closed(doc["limits"], layout.LIMIT_NAMES, f"{name}:$.limits")
    values = [_positive_int(lim[n], f"{name}:$.limits.{n}") for n in layout.LIMIT_NAMES]
    limits = Limits(*values)
    raw_stages = doc["stages"]
    if not isinstance(raw_stages, list) or not 1 <= len(raw_stages) <= MAX_STAGES:
        raise _refuse(f"stages must be an array of 1-{MAX_STAGES} stages", f"{name}:$.stages")
    stages: list[Stage] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_stages):
        where = f"{name}:$.stages[{i}]"
        st = _closed(raw, ("name", "input", "output"), where)
        sname = st["name"]
        if not isinstance(sname, str) or not layout.STAGE_RE.match(sname):
            raise _refuse(f"stage name {sname!r} is not valid", f"{where}.name")
        if sname in seen:
            raise _refuse(f"duplicate stage name {sname!r}", f"{where}.name")
        inp = _closed(st["input"], ("fromStage", "fields", "admitMaxBytes"), f"{where}.input")
        out = _closed(st["output"], ("pointer", "cardinality"), f"{where}.output")
        from_stage = inp["fromStage"]
        if i == 0:
            if from_stage is not None:
                raise _refuse("the first (root) stage must have fromStage null", f"{where}.input")
        elif not isinstance(from_stage, str) or from_stage not in seen:
            raise _refuse("input.fromStage must name an earlier stage", f"{where}.input.fromStage")
        fields = inp["fields"]
        if fields is not None and (
            i == 0
            or not isinstance(fields, list)
            or not fields
            or not all(isinstance(f, str) for f in fields)
            or len(set(fields)) != len(fields)
        ):
            raise _refuse(
                "input.fields must be null or a non-empty array of distinct names "
                "(null for the root stage)",
                f"{where}.input.fields",
            )
        admit = inp["admitMaxBytes"]
        if admit is not None:
            if i == 0:
                raise _refuse("the root stage's admitMaxBytes must be null", f"{where}.input")
            _positive_int(admit, f"{where}.input.admitMaxBytes")
        pointer = out["pointer"]
        if not isinstance(pointer, str) or not _pointer_ok(pointer):
            raise _refuse("output.pointer must be an RFC 6901 pointer", f"{where}.output.pointer")
        if out["cardinality"] not in ("one", "many"):
            raise _refuse('output.cardinality must be "one" or "many"', f"{where}.output")
        seen.add(sname)
        stages.append(
            Stage(
                name=sname,
                index=i,
                from_stage=from_stage,
                fields=None if fields is None else tuple(fields),
                admit_max_bytes=admit,
                pointer=pointer,
                cardinality=out["cardinality"],
                frozen=canon.dumps(st),
            )
        )
    canonical = canon.dumps(doc)
    return Workflow(data=canonical, name=wf_name, limits=limits, stages=tuple(stages))


def load_workflow(path: Path) -> Workflow:
    """Read and check a workflow document; ``-`` reads standard input."""
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        data = sys.stdin.buffer.read() if name == "<stdin>" else path.read_bytes()
    except OSError as exc:
        raise OperationalError(f"cannot read workflow: {exc.strerror}", where=name) from None
    try:
        return parse_workflow(data, name)
    except canon.CanonError as exc:
        raise canon.CanonError(exc.message, where=name) from None
