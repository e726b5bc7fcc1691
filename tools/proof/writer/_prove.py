"""The ``prove`` pipeline: load the workflow → check ``--out`` → apply each operation
(:mod:`._engine`) into a staging directory → add the control and finalization files →
keep custody → swap the staging directory in atomically (:mod:`._bundle`).
See docs/spec/admission-proof.md §8–§9.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path

from crucible.core import canon
from crucible.core.errors import InputRefused, Location, OperationalError
from crucible.core.structs import dataclass, field
from crucible.proof import layout
from crucible.proof.writer._bundle import (
    FileSink,
    Spool,
    cannot_write,
    check_target,
    staging_dir,
    swap_into,
    sync_tree,
    write_custody,
    write_staged,
)
from crucible.proof.writer._engine import Decision, Engine, EngineSettings, Unrecordable
from crucible.proof.writer._model import Workflow, load_workflow
from crucible.proof.writer._ops import Finish, iter_operations

__all__ = ["ProveOptions", "ProveResult", "prove"]


@dataclass(frozen=True)
class ProveOptions:
    workflow: Path
    operations: Path
    artifacts: Path
    out: Path
    #: materialize every candidate in full and compare with the incremental
    #: measurement (quadratic; for tests and audits)
    check_candidates: bool = False
    #: proof byte ceiling; only the benchmark lowers or raises it
    proof_ceiling: int = layout.MAX_PROOF_BYTES
    #: called with every materialized candidate (path -> bytes) in cross-check mode
    candidate_hook: Callable[[dict[str, bytes]], None] | None = None
    #: fsync every file before the swap (tests of logic may turn it off for speed)
    durable: bool = True
    #: keep every measured Decision in the result (reports, probe, tests)
    keep_decisions: bool = True
    #: the log is of a run that ended: a log without ``finish`` and without an open
    #: epoch is closed by ``finish {files: {}}`` as if its next line (export,
    #: admission-proof.md §11); the log itself is not changed
    ended: bool = False
    #: a last operation line without its newline (a writer killed mid-append) is left
    #: out rather than refused (export, admission-proof.md §11)
    complete_lines_only: bool = False


@dataclass(frozen=True)
class ProveResult:
    out: Path
    proof_digest: str
    epochs: int
    bytes: int
    files: int
    #: None for a complete export, else the partial.json reason
    partial: str | None
    #: "OPS:LINE: message" when recording became unavailable (exit 3)
    unrecordable: str | None
    custody: Path | None
    decisions: list[Decision] = field(default_factory=list)
    #: the number of a torn last operation line left out (complete_lines_only)
    torn_line: int | None = None


@dataclass(frozen=True)
class _Applied:
    """The log applied to the staging directory, the proof spooled and closed."""

    engine: Engine
    unrecordable: Unrecordable | None
    partial: str | None
    proof_size: int
    proof_digest: str
    torn_line: int | None = None


def prove(options: ProveOptions) -> ProveResult:
    """Apply the operation log and write the bundle; raise for refused input
    (previous bundle untouched); return ``unrecordable`` set for exit 3."""
    wf = load_workflow(options.workflow)
    out = options.out
    check_target(out)
    staging = staging_dir(out)
    try:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
        staging.mkdir()
    except OSError as exc:
        raise cannot_write(out, f"its staging directory {staging.name}", exc) from None
    try:
        return _prove_into(wf, options, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _ops_name(options: ProveOptions) -> str:
    return "<stdin>" if str(options.operations) == "-" else str(options.operations)


def _prove_into(wf: Workflow, options: ProveOptions, staging: Path) -> ProveResult:
    applied = _apply_log(wf, options, staging)
    files = _closing_files(wf, applied)
    total_bytes, total_files = _final_size(wf, applied, files, _ops_name(options))
    for rel, data in files.items():
        write_staged(staging, options.out, rel, data)
    custody = _keep_custody(options, applied.engine)
    if options.durable:
        sync_tree(staging)
    swap_into(staging, options.out)
    unrecordable = applied.unrecordable
    return ProveResult(
        out=options.out,
        proof_digest=applied.proof_digest,
        epochs=applied.engine.proof_chain.epochs,
        bytes=total_bytes,
        files=total_files,
        partial=applied.partial,
        unrecordable=(
            f"{_ops_name(options)}:{unrecordable.line}: {unrecordable.message}"
            if unrecordable
            else None
        ),
        custody=custody,
        decisions=applied.engine.decisions,
        torn_line=applied.torn_line,
    )


def _apply_log(wf: Workflow, options: ProveOptions, staging: Path) -> _Applied:
    """Every operation in order, until the end or the first unrecordable one."""
    ops_name = _ops_name(options)
    spool = Spool(staging, options.out)
    try:
        engine = Engine(
            wf,
            options.artifacts,
            FileSink(staging, options.out, keep=options.check_candidates),
            spool,
            EngineSettings(
                check=options.check_candidates,
                proof_ceiling=options.proof_ceiling,
                ops_name=ops_name,
                candidate_hook=options.candidate_hook,
                keep_decisions=options.keep_decisions,
            ),
        )
        unrecordable: Unrecordable | None = None
        last_line = 0
        torn: list[int] | None = [] if options.complete_lines_only else None
        try:
            for op in iter_operations(options.operations, torn=torn):
                last_line = op.line
                engine.apply(op)
            if options.ended and not torn and engine.state is not None:
                _close_ended(engine, last_line)
        except Unrecordable as exc:
            unrecordable = exc
        if engine.state is None or engine.proof is None:
            _no_root(unrecordable, last_line, ops_name)
        engine.pending_custody()
        partial = _partial_reason(engine, unrecordable)
        spool.write(engine.proof_chain.finishing_bytes())
        proof_size = engine.proof_chain.size()
    except BaseException:
        spool.discard()
        raise
    spool.close()
    torn_line = torn[0] if torn else None
    return _Applied(
        engine, unrecordable, partial, proof_size, engine.proof_chain.digest(), torn_line
    )


def _close_ended(engine: Engine, last_line: int) -> None:
    """An ended run's log reads as if it held ``finish`` with no files."""
    if engine.finished is None and not engine.proof_chain.is_open:
        engine.apply(Finish(line=last_line + 1, files={}))


def _no_root(unrecordable: Unrecordable | None, last_line: int, ops_name: str) -> None:
    """Nothing to export: the log never reached a recorded root."""
    if unrecordable is not None:
        raise OperationalError(
            f"recording unavailable: {unrecordable.message}; no bundle written",
            location=Location(ops_name, unrecordable.line),
        )
    raise InputRefused(
        "the operation log has no root operation", location=Location(ops_name, last_line or 1)
    )


def _partial_reason(engine: Engine, unrecordable: Unrecordable | None) -> str | None:
    """The partial.json reason (admission-proof.md §9), None for a complete export."""
    if unrecordable is not None:
        return "recording-unavailable"
    if engine.proof_chain.is_open:
        return "open-epoch"
    if engine.finished is None:
        return "no-finish"
    return None


def _closing_files(wf: Workflow, applied: _Applied) -> dict[str, bytes]:
    """The control files of the last complete prefix, then the finalization files
    (only when every line was recorded) and the partial label."""
    state = applied.engine.branch_state
    files = {
        layout.EXECUTION: state.execution_bytes(applied.proof_digest),
        layout.ADMISSION_PROOF_DIGEST: applied.proof_digest.encode("ascii") + b"\n",
    }
    for s in wf.stages:
        files[layout.set_path(s.name)] = state.set_bytes(s.name)
    if applied.unrecordable is None:
        files.update(applied.engine.finalization)
    if applied.partial is not None:
        unrecordable = applied.unrecordable
        files[layout.PARTIAL] = canon.dumps(
            {
                "partialVersion": 1,
                "reason": applied.partial,
                "operationLine": unrecordable.line if unrecordable else None,
            }
        )
    return files


def _final_size(
    wf: Workflow, applied: _Applied, files: dict[str, bytes], ops_name: str
) -> tuple[int, int]:
    """(bytes, files) of the export; a finished log over the limits is refused."""
    engine = applied.engine
    total_bytes, total_files = engine.branch_state.measure(applied.proof_size)
    # the control files are in the measure already; the partial label is never charged
    # (admission-proof.md §9)
    charged = [
        data
        for rel, data in files.items()
        if layout.is_finalization_path(rel) and rel != layout.PARTIAL
    ]
    total_bytes += sum(len(b) for b in charged)
    total_files += len(charged)
    if (
        engine.finished is not None
        and applied.unrecordable is None
        and (total_bytes > wf.limits.max_bytes or total_files > wf.limits.max_files)
    ):
        raise InputRefused(
            f"finalization overflow (input-over-bound): the final export would be "
            f"{total_bytes} bytes in {total_files} files, over maxBytes {wf.limits.max_bytes} / "
            f"maxFiles {wf.limits.max_files}",
            location=Location(ops_name, engine.finished.line),
        )
    return total_bytes, total_files


def _keep_custody(options: ProveOptions, engine: Engine) -> Path | None:
    """Copy received-but-unrecorded material to BUNDLE.custody/ (admission-proof.md §9)."""
    if not engine.custody:
        return None
    items: list[dict[str, object]] = []
    sources: dict[str, Path] = {}
    for item in engine.custody:
        files = {}
        for role, rel in sorted(item.files.items()):
            source = _custody_source(options.artifacts, rel)
            if source is None:
                continue  # never received (or outside the artifacts): nothing to keep
            name = f"{item.line}/{role}-{Path(rel).name}"
            files[role] = name
            sources[name] = source
        items.append(
            {
                "line": item.line,
                "instance": item.instance,
                "attempt": item.attempt,
                "reason": item.reason,
                "files": files,
            }
        )
    return write_custody(options.out, items, sources)


def _custody_source(artifacts: Path, rel: str) -> Path | None:
    base = artifacts.resolve()
    target = (artifacts / rel).resolve()
    if base not in target.parents or not target.is_file():
        return None
    return target
