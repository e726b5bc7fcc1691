"""Compile a pack manifest (TOML, optionally with a Starlark source) to a plan.

A short pipeline of steps: read → parse TOML → edition gate → structure
(``shape``) → Starlark, when ``[workflow] source`` names one → graph rules
(``rules``) → plan (``plan.build_plan``). Every step records diagnostics;
:func:`analyze_manifest` returns them all, :func:`compile_bytes` raises
:class:`ValidationFailed` when any is an error.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from crucible.compile._checker import Checker, type_name
from crucible.compile._diagnostics import Diagnostic, Location, Locator, ValidationFailed
from crucible.compile._editions import (
    DEFAULT_EDITION,
    SUPPORTED_EDITIONS,
    check_edition,
    known_top_keys,
    top_key_since,
)
from crucible.compile._fanout import check_fanout_graph
from crucible.compile._locate import StarLocator, TomlLocator
from crucible.compile._plan import CompiledPlan, build_plan, finish
from crucible.compile._rules import check_graph, check_names
from crucible.compile._shape import check_workflow
from crucible.core.errors import OperationalError, ParseError, UsageError
from crucible.core.fdio import NotRegularFile, read_regular
from crucible.core.fsio import read_named
from crucible.core.structs import dataclass, field

__all__ = [
    "Analysis",
    "analyze_document",
    "analyze_manifest",
    "analyze_star",
    "compile_bytes",
    "compile_path",
    "edition_warning",
    "read_input",
]

_TOML_POS_RE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


@dataclass
class Analysis:
    """Everything known about one input: the plan when sound, and every diagnostic."""

    compiled: CompiledPlan | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


def edition_warning(edition: int) -> str | None:
    if edition == 1:
        return (
            "edition 1 is the legacy edition; add `edition = 3` at the top of the manifest "
            "for declared inputs and host env"
        )
    return None


def read_input(path: Path) -> tuple[bytes, str, Path]:
    """(bytes, display name, base directory) of a path, ``-`` for stdin."""
    if str(path) == "-":
        return sys.stdin.buffer.read(), "<stdin>", Path.cwd()
    name = str(path)
    return read_named(path, name), name, path.parent


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 (byte {exc.start})", where=name) from None


def compile_path(path: Path) -> CompiledPlan:
    """Manifest file → checked plan; raises on bad input (see :func:`compile_bytes`)."""
    data, name, base = read_input(path)
    return compile_bytes(data, name, base)


def compile_bytes(data: bytes, name: str, base_dir: Path) -> CompiledPlan:
    analysis = analyze_manifest(data, name, base_dir)
    if analysis.errors:
        raise ValidationFailed(analysis.diagnostics)
    assert analysis.compiled is not None
    return analysis.compiled


def analyze_manifest(data: bytes, name: str, base_dir: Path) -> Analysis:
    """Check a manifest and compile it. Raises only for input that cannot be read or
    parsed (exit 2) and for an unsupported edition (exit 1); everything else is a
    diagnostic."""
    text = _decode(data, name)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = Location(name)
        if m := _TOML_POS_RE.search(message):
            where = Location(name, int(m.group(1)), int(m.group(2)))
            message = message[: m.start()]
        raise ParseError(f"TOML: {message}", location=where) from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively
        raise ParseError("TOML: arrays or inline tables nested too deeply", where=name) from None
    return analyze_document(doc, TomlLocator(name, text), name, base_dir)


def _check_top_keys(chk: Checker, doc: dict[str, Any], edition: int, known: Sequence[str]) -> None:
    """Each unknown top-level key is an error, naming the edition that brings it."""
    for key in doc:
        if key not in known:
            since = top_key_since(key)
            hint = (
                f"; {key!r} needs edition {since} (this pack is edition {edition})"
                if since is not None
                else ""
            )
            chk.error(
                "unknown-key",
                (key,),
                f"unknown top-level key {key!r} (known: {', '.join(known)}){hint}",
            )


def analyze_document(doc: dict[str, Any], locator: Locator, name: str, base_dir: Path) -> Analysis:
    """The steps after parsing, on the TOML document as a dict."""
    chk = Checker(locator)
    edition = doc.get("edition", DEFAULT_EDITION)
    if edition not in SUPPORTED_EDITIONS or type(edition) is not int:
        # locating costs a scan of the text: only on the error path
        check_edition(edition, where=locator.locate(("edition",)))
    known = known_top_keys(edition)
    _check_top_keys(chk, doc, edition, known)
    # [loop] (edition 4) is checked on the manifest's own locator, before a Starlark
    # source replaces the checker: its diagnostics point into the TOML text
    loop: dict[str, Any] | None = None
    if "loop" in doc and "loop" in known:
        # lazy: compile._loop is not loaded with this module; only analyze_document() needs it
        from crucible.compile._loop import check_loop_table

        loop = check_loop_table(chk, doc["loop"])
    raw = doc.get("workflow")
    if raw is None:
        chk.error("missing-key", (), "the manifest has no [workflow] table")
        return Analysis(None, chk.diagnostics)
    if not isinstance(raw, dict):
        chk.error("wrong-type", ("workflow",), f"workflow must be a table, not {type_name(raw)}")
        return Analysis(None, chk.diagnostics)

    resolved_from: str | None = None
    if "source" in raw:
        star = _load_source(chk, raw, name, base_dir, edition)
        if star is None:
            return Analysis(None, chk.diagnostics)
        raw, resolved_from, chk = star

    labels = {"label": "workflow()", "task_label": "task()"} if resolved_from else {}
    workflow, tasks, paths = check_workflow(
        chk,
        ("workflow",),
        raw,
        edition,
        allowed=("name", "description", "params", "task"),
        **labels,
    )
    check_names(chk, tasks, paths)
    if chk.failed:
        return Analysis(None, chk.diagnostics)
    check_graph(
        chk, tasks, paths, fill_input_types=True, params=workflow["params"], edition=edition
    )
    check_fanout_graph(chk, workflow, tasks, paths)
    if loop is not None and not chk.failed:
        # lazy: compile._loop is not loaded with this module; only analyze_document() needs it
        from crucible.compile._loop import check_loop_graph

        loop_chk = Checker(locator)
        body = doc["loop"]["body"]
        check_loop_graph(loop_chk, loop, tasks, body)
        chk.diagnostics.extend(loop_chk.diagnostics)
    if "limits" in workflow and not chk.failed:
        # an accounted pack (docs/spec/export.md): its stage-tree shape and record
        from crucible.compile._accounted import check_accounted

        check_accounted(chk, workflow, tasks, paths, has_loop=loop is not None)
    if chk.failed:
        return Analysis(None, chk.diagnostics)
    if resolved_from is not None:
        workflow["resolved_from"] = resolved_from
    warnings = [w for w in (edition_warning(edition),) if w]
    compiled = finish(build_plan(edition, workflow, tasks, loop), warnings)
    diagnostics = chk.diagnostics + [
        Diagnostic(
            "edition-1",
            w,
            locator.locate(("edition",)) if "edition" in doc else Location(name),
            "warning",
        )
        for w in warnings
    ]
    return Analysis(compiled, diagnostics)


def _load_source(
    chk: Checker, raw: dict[str, Any], name: str, base_dir: Path, edition: int
) -> tuple[dict[str, Any], str, Checker] | None:
    """Evaluate ``[workflow] source``; its workflow replaces the manifest's table."""
    # lazy: compile._star is not loaded with this module; only _load_source() needs it
    from crucible.compile._star import evaluate_source

    source = raw["source"]
    where = ("workflow", "source")
    for key in raw:
        if key != "source":
            chk.error(
                "source-exclusive",
                ("workflow", key),
                f"[workflow] has a source, so {key!r} belongs in the source's workflow() call",
            )
    if not isinstance(source, str):
        chk.error("wrong-type", where, f"source must be a relative path, not {type_name(source)}")
        return None
    if not source:  # (the code this always had; the message said "not string")
        chk.error("wrong-type", where, "source must be a non-empty relative path")
        return None
    if "\x00" in source:
        chk.error("bad-path", where, f"source {source!r} must be a relative path to a file")
        return None
    pure = PurePosixPath(source)
    if pure.is_absolute() or ".." in pure.parts or "\\" in source:
        chk.error("bad-path", where, f"source {source!r} must be a relative path inside the pack")
        return None
    if chk.failed:
        return None
    path = base_dir / pure
    if path.exists() and not path.resolve().is_relative_to(base_dir.resolve()):
        chk.error("bad-path", where, f"source {source!r} resolves outside the pack (a symlink?)")
        return None
    try:
        # never blocks: a FIFO (or a device) named as the source is refused
        text = read_regular(path)
    except FileNotFoundError:
        raise UsageError(
            f"source {source!r} does not exist", location=chk.locator.locate(where)
        ) from None
    except IsADirectoryError:
        raise UsageError(
            f"source {source!r} is a directory, not a file", location=chk.locator.locate(where)
        ) from None
    except NotRegularFile:
        raise UsageError(
            f"source {source!r} is not a regular file (a FIFO, socket or device)",
            location=chk.locator.locate(where),
        ) from None
    except OSError as exc:
        raise OperationalError(
            f"cannot read source {source!r}: {exc.strerror}",
            location=chk.locator.locate(where),
        ) from None
    display = str(path) if name != "<stdin>" else source
    result = evaluate_source(_decode(text, display), display, edition)
    if result.workflow is None:
        chk.diagnostics.extend(result.diagnostics)
        return None
    names = [str(t.get("name", "")) for t in result.workflow.get("task", [])]
    star_chk = Checker(StarLocator(display, _decode(text, display), names))
    star_chk.diagnostics.extend(chk.diagnostics)
    return result.workflow, source, star_chk


def analyze_star(path: Path, edition: int) -> Analysis:
    """Check a Starlark source alone (``crucible-validate pack.star``)."""
    # lazy: compile._star is not loaded with this module; only analyze_star() needs it
    from crucible.compile._star import evaluate_source

    data, name, _ = read_input(path)
    text = _decode(data, name)
    result = evaluate_source(text, name, edition)
    if result.workflow is None:
        return Analysis(None, result.diagnostics)
    names = [str(t.get("name", "")) for t in result.workflow.get("task", [])]
    chk = Checker(StarLocator(name, text, names))
    workflow, tasks, paths = check_workflow(
        chk,
        ("workflow",),
        result.workflow,
        edition,
        allowed=("name", "description", "params", "task"),
        label="workflow()",
        task_label="task()",
    )
    check_names(chk, tasks, paths)
    if not chk.failed:
        check_graph(
            chk, tasks, paths, fill_input_types=True, params=workflow["params"], edition=edition
        )
        check_fanout_graph(chk, workflow, tasks, paths)
    if chk.failed:
        return Analysis(None, chk.diagnostics)
    workflow["resolved_from"] = PurePosixPath(path.name).as_posix()
    return Analysis(finish(build_plan(edition, workflow, tasks)), chk.diagnostics)
