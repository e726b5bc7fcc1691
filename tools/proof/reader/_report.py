"""The verify report (docs/schemas/report.json): a reading, or the first problem."""

from __future__ import annotations

from typing import Any

from crucible.core import canon
from crucible.core.structs import dataclass
from crucible.proof.reader._findings import Problem

__all__ = ["REPORT_VERSION", "Counts", "Reading", "Report"]

REPORT_VERSION = 1


@dataclass(frozen=True)
class Counts:
    """Active-branch counts (RFC 0024 §8); never the retained-history totals."""

    stages: int
    instances: int
    outputs: int
    selections: int


@dataclass(frozen=True)
class Reading:
    completion: str  # "complete" | "partial"
    counts: Counts
    epochs: int
    proof_digest: str


@dataclass(frozen=True)
class Report:
    reading: Reading | None = None
    problem: Problem | None = None

    @property
    def verdict(self) -> str:
        if self.problem is None:
            return "reading"
        return self.problem.kind

    @property
    def exit_code(self) -> int:
        return 0 if self.problem is None else 1

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reportVersion": REPORT_VERSION, "verdict": self.verdict}
        if self.reading is not None:
            r = self.reading
            out["reading"] = {
                "completion": r.completion,
                "counts": {
                    "stages": r.counts.stages,
                    "instances": r.counts.instances,
                    "outputs": r.counts.outputs,
                    "selections": r.counts.selections,
                },
                "epochs": r.epochs,
                "admissionProofDigest": r.proof_digest,
                "authentication": "not-established",
                "dispositions": "not-replayed",
            }
        if self.problem is not None:
            p = self.problem
            out["problem"] = {
                "code": p.code,
                "phase": p.phase,
                "epoch": p.epoch,
                "observation": p.observation,
                "path": p.path,
                "message": p.message,
            }
        return out

    def to_bytes(self) -> bytes:
        return canon.dumps(self.to_json()) + b"\n"

    def human(self) -> str:
        if self.problem is not None:
            return f"{self.verdict}: {self.problem}"
        r = self.reading
        assert r is not None
        c = r.counts
        return (
            f"reading: {r.completion}; {r.epochs} epochs; active stages {c.stages}, "
            f"instances {c.instances}, outputs {c.outputs}, selections {c.selections}; "
            "authentication not-established; dispositions not-replayed"
        )
