"""What the two commands do, without click: options in, bytes and an exit code out."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import BinaryIO, TextIO

from crucible.compile._diagnostics import Diagnostic, Location, ValidationFailed
from crucible.compile._manifest import Analysis, analyze_manifest, analyze_star, read_input
from crucible.compile._plan import load_plan_path
from crucible.core import ndjson, output
from crucible.core.errors import EXIT_OK, EXIT_REFUSED, CrucibleError, UsageError
from crucible.core.fdio import read_regular
from crucible.core.structs import dataclass

__all__ = ["CompileOptions", "ValidateOptions", "run_compile", "run_validate"]

COMPILE = "crucible-compile"


@dataclass(frozen=True)
class CompileOptions:
    path: Path
    output: str = "-"
    digest_only: bool = False
    graph: str | None = None


@dataclass(frozen=True)
class ValidateOptions:
    paths: tuple[Path, ...]
    as_json: bool = False
    edition: int | None = None


def _prog_line(prog: str, d: Diagnostic) -> str:
    where = d.location.where()
    return f"{prog}: {d.severity}: {where + ': ' if where else ''}{d.message} [{d.code}]\n"


def run_compile(opts: CompileOptions, out: BinaryIO, err: TextIO) -> int:
    data, name, base = read_input(opts.path)
    analysis = analyze_manifest(data, name, base)
    for d in analysis.diagnostics:
        err.write(_prog_line(COMPILE, d))
    if analysis.errors:
        return EXIT_REFUSED
    compiled = analysis.compiled
    assert compiled is not None
    if opts.graph is not None:
        # lazy: compile._graph is not loaded with this module; only run_compile() needs it
        from crucible.compile._graph import render

        payload = render(compiled.plan, opts.graph).encode("utf-8")
    elif opts.digest_only:
        payload = compiled.digest.encode("ascii") + b"\n"
    else:
        payload = compiled.data
    if opts.output == "-":
        if payload is compiled.data and out.isatty():
            payload += b"\n"  # only for people; piped bytes stay exactly canonical
        output.write_stream(out, payload)
    else:
        output.write_output(opts.output, payload, if_changed=True)
    return EXIT_OK


def _star_edition(path: Path, fallback: int | None) -> int:
    """The edition of the manifest beside ``path`` whose ``[workflow] source`` names it."""
    if str(path) != "-":
        target = path.resolve()
        for manifest in sorted(path.parent.glob("*.toml")):
            try:
                # never blocks: a FIFO named *.toml beside the source is skipped
                doc = tomllib.loads(read_regular(manifest).decode("utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
                continue
            workflow = doc.get("workflow")
            source = workflow.get("source") if isinstance(workflow, dict) else None
            if isinstance(source, str) and (manifest.parent / source).resolve() == target:
                edition = doc.get("edition", 1)
                if type(edition) is int:
                    return edition
    if fallback is None:
        raise UsageError(
            "no manifest beside this Starlark source names it as its source; pass --edition",
            where=str(path),
        )
    return fallback


def validate_one(path: Path, edition: int | None) -> tuple[Analysis, int]:
    """Diagnostics for one file and the exit code it alone would give."""
    try:
        if path.suffix == ".toml" or str(path) == "-":
            data, name, base = read_input(path)
            analysis = analyze_manifest(data, name, base)
        elif path.suffix == ".star":
            analysis = analyze_star(path, _star_edition(path, edition))
        else:
            try:
                analysis = Analysis(load_plan_path(path))
            except ValidationFailed as exc:
                analysis = Analysis(None, exc.diagnostics)
    except CrucibleError as exc:
        d = Diagnostic(exc.code, exc.message, exc.location if exc.location else Location(str(path)))
        return Analysis(None, [d]), (exc.exit_code if exc.exit_code != 0 else EXIT_REFUSED)
    return analysis, (EXIT_REFUSED if analysis.errors else EXIT_OK)


def run_validate(opts: ValidateOptions, out: BinaryIO, err: TextIO) -> int:
    worst = EXIT_OK
    for path in opts.paths:
        analysis, code = validate_one(path, opts.edition)
        lines: list[bytes] = []
        for d in analysis.diagnostics:
            if opts.as_json:
                record = d.record()
                record.setdefault("file", str(path))
                # per path, through the short-write loop (a full disk is exit 3)
                lines.append(ndjson.dumps_line(record))
            else:
                err.write(d.text() + "\n")
        if lines:
            output.write_stream(out, b"".join(lines))
        if not opts.as_json and analysis.compiled is not None and code == EXIT_OK:
            c = analysis.compiled
            err.write(f"{path}: ok (edition {c.edition}, plan version {c.version}, {c.digest})\n")
        worst = max(worst, code)
    return worst
