"""Building workflows, operation logs and received artifacts for writer tests and vectors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from crucible.core import canon

AT = "2026-10-17T09:00:00Z"
REVIEW = {"actor": "reviewer", "at": AT}

BIG_LIMITS = {
    "maxBytes": 10_000_000,
    "maxFiles": 100_000,
    "maxInstances": 1000,
    "maxAttempts": 8,
    "maxRecords": 10_000,
    "maxCaseBytes": 65_536,
    "maxPayloadBytes": 65_536,
}


def stage(
    name: str,
    from_stage: str | None,
    pointer: str,
    cardinality: str = "many",
    fields: list[str] | None = None,
    admit: int | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "input": {"fromStage": from_stage, "fields": fields, "admitMaxBytes": admit},
        "output": {"pointer": pointer, "cardinality": cardinality},
    }


DEFAULT_STAGES = [
    stage("org", None, "/orgs", "many"),
    stage("people", "org", "/people", "many", fields=["name"]),
]


class Scenario:
    """A workflow + operation log + artifacts directory under ``root``."""

    def __init__(
        self,
        root: Path,
        limits: dict[str, int] | None = None,
        stages: list[dict[str, Any]] | None = None,
        name: str = "org-people",
    ) -> None:
        self.root = root
        self.artifacts = root / "artifacts"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.workflow_doc = {
            "workflowVersion": 2,
            "name": name,
            "limits": {**BIG_LIMITS, **(limits or {})},
            "stages": stages or DEFAULT_STAGES,
        }
        self.ops: list[dict[str, Any]] = []
        self._n = 0

    # -- artifacts ---------------------------------------------------------------
    def file(self, name: str, data: bytes | dict[str, Any]) -> str:
        raw = canon.dumps(data) if isinstance(data, dict) else data
        path = self.artifacts / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        return name

    # -- operations --------------------------------------------------------------
    def op(self, **kw: Any) -> None:
        self.ops.append(kw)

    def root_op(self, case: dict[str, Any] | None = None, root: str = "r") -> None:
        rel = self.file("root-case.json", case or {"topic": "organisations"})
        self.op(op="root", execution="exec-1", rootInstance=root, case=rel)

    def select(
        self,
        stage: str,
        selected: list[tuple[str, int]],
        child_ids: list[str] | None,
        fork: bool = False,
    ) -> None:
        self.op(
            op="fork" if fork else "select",
            stage=stage,
            review=REVIEW,
            selected=[{"instance": i, "output": k} for i, k in selected],
            childIds=child_ids,
        )

    def group(
        self, reservation: int, starts: list[str], cancelled: list[str] | None = None
    ) -> None:
        self.op(
            op="group",
            reservation=reservation,
            starts=starts,
            cancelled=[{"instance": c, "actor": "operator", "at": AT} for c in cancelled or []],
        )

    def evaluated(
        self,
        instance: str,
        attempt: int,
        audit: dict[str, Any],
        *,
        signature: bytes | None = None,
        tag: str = "",
    ) -> None:
        base = f"{instance}/{attempt}{tag}"
        files = {
            "run": self.file(
                f"{base}/run.json",
                {"exportVersion": 3, "finishedAt": AT, "id": f"{instance}-{attempt}"},
            ),
            "preparation": self.file(f"{base}/preparation.json", {"prepared": instance}),
            "audit": self.file(f"{base}/audit.json", audit),
        }
        if signature is not None:
            files["auditSignatures"] = self.file(f"{base}/audit.sig", signature)
        self.op(
            op="observe",
            instance=instance,
            attempt=attempt,
            state="evaluated",
            failure=None,
            files=files,
        )

    def failed(
        self,
        instance: str,
        attempt: int,
        failure: str = "acquisition-failed",
        with_run: bool = False,
    ) -> None:
        files = {}
        if with_run:
            files["run"] = self.file(
                f"{instance}/{attempt}/run.json", {"exportVersion": 2, "finishedAt": AT}
            )
        self.op(
            op="observe",
            instance=instance,
            attempt=attempt,
            state="failed",
            failure=failure,
            files=files,
        )

    def observe(
        self,
        instance: str,
        attempt: int,
        state: str,
        failure: str | None = None,
        files: dict[str, str] | None = None,
    ) -> None:
        self.op(
            op="observe",
            instance=instance,
            attempt=attempt,
            state=state,
            failure=failure,
            files=files or {},
        )

    def retry(self, instance: str) -> None:
        self.op(op="retry", instance=instance, actor="reviewer", at=AT)

    def finish(self, files: dict[str, str] | None = None) -> None:
        self.op(op="finish", files=files or {})

    # -- output ------------------------------------------------------------------
    def write(self) -> tuple[Path, Path, Path]:
        wf = self.root / "workflow.json"
        wf.write_bytes(canon.dumps(self.workflow_doc))
        ops = self.root / "operations.ndjson"
        ops.write_bytes(b"".join(canon.dumps(o) + b"\n" for o in self.ops))
        return wf, ops, self.artifacts

    def prove(self, out: Path | None = None, check: bool = True) -> Any:
        from crucible.proof.writer import ProveOptions, prove

        wf, ops, artifacts = self.write()
        return prove(
            ProveOptions(
                wf,
                ops,
                artifacts,
                out or self.root / "bundle",
                check_candidates=check,
                durable=False,
            )
        )


def orgs(*names: str) -> dict[str, Any]:
    return {"orgs": [{"name": n, "site": f"https://{n.lower()}.example"} for n in names]}


def people(*names: str) -> dict[str, Any]:
    return {"people": [{"name": n} for n in names]}


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file below ``root`` as relative path -> bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def proof_epochs(bundle: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    proof = canon.loads((bundle / "admission-proof.json").read_bytes())
    return proof, [e for block in proof["epochBlocks"] for e in block]


def rebuild_prefix(proof: dict[str, Any], epochs: list[dict[str, Any]]) -> bytes:
    """P(k) for the given complete epochs, packed by the full-block rule."""
    blocks = [epochs[i : i + 4096] for i in range(0, len(epochs), 4096)]
    return canon.dumps({**proof, "epochBlocks": blocks})


def check_chain(bundle: Path) -> None:
    """Independent check of the chain: canonical bytes, links, numbering, sidecar."""
    from crucible.core import digest

    raw = (bundle / "admission-proof.json").read_bytes()
    proof, epochs = proof_epochs(bundle)
    assert canon.dumps(proof) == raw
    assert (bundle / "admission-proof.digest").read_bytes() == digest.of_bytes(raw).encode() + b"\n"
    execution = canon.loads((bundle / "execution.json").read_bytes())
    assert execution["admissionProofDigest"] == digest.of_bytes(raw)
    for k, epoch in enumerate(epochs, start=1):
        assert epoch["number"] == k
        expected = digest.of_bytes(rebuild_prefix(proof, epochs[: k - 1]))
        assert epoch["previousProofDigest"] == expected, k


#: the installed ``crucible-prove`` script, for the subprocess tests
PROVE = Path(sys.executable).parent / "crucible-prove"


def evaluated_root(s: Scenario, *orgs_named: str) -> None:
    """root(1), group(2) starts r, r evaluated: the orgs ``orgs_named``."""
    s.root_op()
    s.group(1, ["r"])
    s.evaluated("r", 1, orgs(*orgs_named))


def two_children(s: Scenario, ids: tuple[str, str] = ("a", "b")) -> None:
    """root(1) group(2) r evaluated; select(3) both orgs -> children; group(4) starts both."""
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], list(ids))
    s.group(3, list(ids))


def org_people(root: Path, limits: dict[str, int] | None = None) -> Scenario:
    """A complete recording: ``two_children``, both evaluated (Ann, Bob), finished."""
    s = Scenario(root, limits=limits)
    two_children(s)
    s.evaluated("a", 1, people("Ann"))
    s.evaluated("b", 1, people("Bob"))
    s.finish()
    return s


def prove_args(s: Scenario, out: Path) -> list[str]:
    """``crucible-prove``'s arguments for the scenario (written now) into ``out``."""
    wf, ops, art = s.write()
    return [
        "--workflow",
        str(wf),
        "--operations",
        str(ops),
        "--artifacts",
        str(art),
        "--out",
        str(out),
    ]
