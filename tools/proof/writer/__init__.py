"""``crucible.proof.writer``: apply an operation log and write a proof-bearing bundle.

Pipeline: load the workflow → apply each operation (:mod:`.engine`) → export the
last complete prefix into a staging directory → swap it in atomically
(:mod:`.bundle`). See docs/spec/admission-proof.md.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crucible.core import canon
from crucible.core.errors import InputRefused
from crucible.proof import layout
from crucible.proof.writer._bundle import (
    check_target,
    staging_dir,
    swap_into,
    sync_tree,
    write_custody,
)
from crucible.proof.writer._engine import Decision, Engine, FileSink, Forbidden, Unrecordable
from crucible.proof.writer._model import Workflow, load_workflow, parse_workflow
from crucible.proof.writer._ops import iter_operations

__all__ = [
    "Decision",
    "Forbidden",
    "ProveOptions",
    "ProveResult",
    "Workflow",
    "parse_workflow",
    "prove",
]


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


def prove(options: ProveOptions) -> ProveResult:
    """Apply the operation log and write the bundle; raise for refused input
    (previous bundle untouched); return ``unrecordable`` set for exit 3."""
    wf = load_workflow(options.workflow)
    out = options.out
    check_target(out)
    staging = staging_dir(out)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        return _prove_into(wf, options, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prove_into(wf: Workflow, options: ProveOptions, staging: Path) -> ProveResult:
    ops_name = "<stdin>" if str(options.operations) == "-" else str(options.operations)
    with open(staging / layout.ADMISSION_PROOF, "w+b") as spool:
        engine = Engine(
            wf,
            options.artifacts,
            FileSink(staging, keep=options.check_candidates),
            spool,
            check=options.check_candidates,
            proof_ceiling=options.proof_ceiling,
            ops_name=ops_name,
            candidate_hook=options.candidate_hook,
            keep_decisions=options.keep_decisions,
        )
        unrecordable: Unrecordable | None = None
        last_line = 0
        try:
            for op in iter_operations(options.operations):
                last_line = op.line
                engine.apply(op)
        except Unrecordable as exc:
            unrecordable = exc
        if engine.state is None or engine.proof is None:
            if unrecordable is not None:
                from crucible.core.errors import OperationalError

                raise OperationalError(
                    f"recording unavailable: {unrecordable.message}; no bundle written",
                    where=f"{ops_name}:{unrecordable.line}",
                )
            raise InputRefused(
                "the operation log has no root operation", where=f"{ops_name}:{last_line or 1}"
            )
        engine.pending_custody()
        st, pc = engine.state, engine.proof
        if unrecordable is not None:
            partial: str | None = "recording-unavailable"
        elif pc.is_open:
            partial = "open-epoch"
        elif engine.finished is None:
            partial = "no-finish"
        else:
            partial = None
        spool.write(pc.finishing_bytes())
        proof_size = pc.size()
    proof_digest = pc.digest()
    controls = {
        layout.EXECUTION: st.execution_bytes(proof_digest),
        layout.ADMISSION_PROOF_DIGEST: proof_digest.encode("ascii") + b"\n",
    }
    for s in wf.stages:
        controls[layout.set_path(s.name)] = st.set_bytes(s.name)
    extra = dict(engine.finalization) if unrecordable is None else {}
    if partial is not None:
        extra[layout.PARTIAL] = canon.dumps(
            {
                "partialVersion": 1,
                "reason": partial,
                "operationLine": unrecordable.line if unrecordable else None,
            }
        )
    # the partial label is never charged (admission-proof.md §9)
    charged = {k: v for k, v in extra.items() if k != layout.PARTIAL}
    total_bytes, total_files = st.measure(proof_size)
    total_bytes += sum(len(b) for b in charged.values())
    total_files += len(charged)
    if (
        engine.finished is not None
        and unrecordable is None
        and (total_bytes > wf.limits.max_bytes or total_files > wf.limits.max_files)
    ):
        raise InputRefused(
            f"finalization overflow (input-over-bound): the final export would be "
            f"{total_bytes} bytes in {total_files} files, over maxBytes {wf.limits.max_bytes} / "
            f"maxFiles {wf.limits.max_files}",
            where=f"{ops_name}:{engine.finished.line}",
        )
    for rel, data in {**controls, **extra}.items():
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    custody_path = None
    if engine.custody:
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
        custody_path = write_custody(options.out, items, sources)
    if options.durable:
        sync_tree(staging)
    swap_into(staging, options.out)
    return ProveResult(
        out=options.out,
        proof_digest=proof_digest,
        epochs=pc.epochs,
        bytes=total_bytes,
        files=total_files,
        partial=partial,
        unrecordable=(
            f"{ops_name}:{unrecordable.line}: {unrecordable.message}" if unrecordable else None
        ),
        custody=custody_path,
        decisions=engine.decisions,
    )


def _custody_source(artifacts: Path, rel: str) -> Path | None:
    base = artifacts.resolve()
    target = (artifacts / rel).resolve()
    if base not in target.parents or not target.is_file():
        return None
    return target
