"""What ``crucible-prove`` does, without click: options in, a bundle, a digest line and
an exit code out (docs/spec/admission-proof.md §8)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, TextIO

from crucible.core.errors import EXIT_OK, EXIT_OPERATIONAL, UsageError
from crucible.core.structs import dataclass

__all__ = ["PROG", "ProbeOptions", "ProveOptions", "run_probe", "run_prove"]

PROG = "crucible-prove"


@dataclass(frozen=True)
class ProveOptions:
    workflow: Path | None
    operations: Path | None
    artifacts: Path | None
    out: Path | None
    check_candidates: bool = False
    #: an accounted run's state dir: workflow, log, artifacts (admission-proof.md §11)
    state: Path | None = None


def _inputs(opts: ProveOptions) -> tuple[Path, Path, Path, Path]:
    """The four paths, each present and of the right kind (usage errors, exit 2)."""
    given = (
        ("--workflow", opts.workflow),
        ("--operations", opts.operations),
        ("--artifacts", opts.artifacts),
        ("--out", opts.out),
    )
    for name, value in given:
        if value is None:
            raise UsageError(f"missing option {name} (see {PROG} --help)")
    workflow, operations, artifacts, out = (value for _, value in given)
    assert workflow and operations and artifacts and out
    if str(workflow) == str(operations) == "-":
        raise UsageError("--workflow and --operations cannot both read stdin (-)")
    for name, path in (("--workflow", workflow), ("--operations", operations)):
        # not is_file(): a pipe such as <(gzip -dc ops.ndjson.gz) is a fine input
        if str(path) != "-" and (not path.exists() or path.is_dir()):
            problem = "is a directory, not a file" if path.is_dir() else "no such file"
            raise UsageError(f"{name} {path}: {problem}")
    if not artifacts.is_dir():
        problem = "not a directory" if artifacts.exists() else "no such directory"
        raise UsageError(f"--artifacts {artifacts}: {problem}")
    return workflow, operations, artifacts, out


def _export_out(opts: ProveOptions) -> Path:
    """``--state`` stands for the three inputs and needs ``--out`` (usage errors)."""
    for name, value in (
        ("--workflow", opts.workflow),
        ("--operations", opts.operations),
        ("--artifacts", opts.artifacts),
    ):
        if value is not None:
            raise UsageError(f"--state and {name} exclude each other (--state names all three)")
    if opts.out is None:
        raise UsageError(f"missing option --out (see {PROG} --help)")
    return opts.out


def run_prove(opts: ProveOptions, out: BinaryIO, err: TextIO) -> int:
    """Write the bundle; the proof digest on ``out``, a summary line on ``err``.
    Exit 3 (and the last complete prefix, labelled partial) when recording became
    unavailable; refused input raises (exit 1 or 2, the previous bundle untouched)."""
    # lazy: proof.writer is not loaded with this module; only run_prove() needs it
    from crucible.proof.writer import ExportOptions, ProveOptions, export, prove

    if opts.state is not None:
        result = export(ExportOptions(opts.state, _export_out(opts), opts.check_candidates))
    else:
        workflow, operations, artifacts, bundle = _inputs(opts)
        result = prove(ProveOptions(workflow, operations, artifacts, bundle, opts.check_candidates))
    out.write(result.proof_digest.encode("ascii") + b"\n")
    out.flush()
    if result.torn_line is not None:
        err.write(
            f"{PROG}: {opts.state}/operations.ndjson:{result.torn_line}: a torn last line "
            "(its writer was killed mid-write) is not part of the export\n"
        )
    label = f" (partial: {result.partial})" if result.partial else ""
    err.write(
        f"{PROG}: {result.out}: {result.epochs} epochs, {result.bytes} bytes in "
        f"{result.files} files{label}\n"
    )
    if result.custody is not None:
        err.write(f"{PROG}: received material kept in custody: {result.custody}\n")
    if result.unrecordable:
        err.write(
            f"{PROG}: error: {result.unrecordable} (recording unavailable; "
            "the last complete prefix was written, labelled partial)\n"
        )
        return EXIT_OPERATIONAL
    return EXIT_OK


@dataclass(frozen=True)
class ProbeOptions:
    #: one canonical JSON object (docs/schemas/prove-probe.json) instead of the text
    json: bool = False


def run_probe(opts: ProbeOptions, out: BinaryIO, err: TextIO) -> int:
    """The synthetic accounting experiment: measured candidates and boundaries."""
    # lazy: proof.writer._probe is not loaded with this module; only run_probe() needs it
    from crucible.proof.writer._probe import run_probe as probe

    out.write(probe(as_json=opts.json))
    out.flush()
    return EXIT_OK
