"""Bundle mutation helpers: load a bundle as {path: bytes}, edit it, re-pin the chain.

"Repinned" mutations recompute every digest a naive forger could recompute (the
chain links, the proof sidecar, the execution's proof pin, attempt pins), so only
the structural rules can catch them: digest agreement alone is insufficient.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from tests.proof.reader.bundlegen import FILES  # pin member -> attempt file name

PROOF = "admission-proof.json"
EXEC = "execution.json"


def load_dir(root: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def write_dir(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def attempt_file(o: dict[str, Any], name: str) -> str:
    """The bundle path of the file ``name`` of observation ``o``'s attempt."""
    return f"instances/{o['instance']}/attempts/{o['number']}/{name}"


class Bundle:
    """A mutable view: parsed proof epochs and execution over the raw files."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = dict(files)
        self.proof: dict[str, Any] = canon.loads(files[PROOF])
        self.epochs: list[dict[str, Any]] = [e for b in self.proof["epochBlocks"] for e in b]
        self.execution: dict[str, Any] = canon.loads(files[EXEC])

    def json(self, path: str) -> Any:
        return canon.loads(self.files[path])

    def put(self, path: str, value: Any) -> None:
        self.files[path] = canon.dumps(value)

    def observations(self) -> Iterator[tuple[dict[str, Any], int, dict[str, Any]]]:
        for e in self.epochs:
            for j, o in enumerate(e.get("results", []), 1):
                yield e, j, o

    def first_obs(
        self, state: str = "evaluated", **where: Any
    ) -> tuple[dict[str, Any], int, dict[str, Any]] | None:
        for e, j, o in self.observations():
            if o["state"] == state and all(o.get(k) == v for k, v in where.items()):
                return e, j, o
        return None

    def first_evaluated(self) -> dict[str, Any] | None:
        """The first evaluated observation, or None when the bundle has none."""
        found = self.first_obs()
        return None if found is None else found[2]

    def repin_file(self, o: dict[str, Any], pin: str, data: bytes | None) -> None:
        """Replace an observation's pinned file (None removes it) and re-pin everywhere."""
        path = attempt_file(o, FILES[pin])
        if data is None:
            self.files.pop(path, None)
            new = None
        else:
            self.files[path] = data
            new = digest.of_bytes(data)
        o[pin] = new
        for inst in self.execution["instances"]:
            if inst["id"] == o["instance"]:
                for a in inst["attempts"]:
                    if a["number"] == o["number"]:
                        a[pin] = new

    def finish(self, *, repin_chain: bool = True) -> dict[str, bytes]:
        """Serialize; with ``repin_chain`` renumber epochs and recompute every link."""
        if repin_chain:
            for k, e in enumerate(self.epochs, 1):
                e["number"] = k
                e["previousProofDigest"] = digest.of_bytes(self._proof_bytes(self.epochs[: k - 1]))
        data = self._proof_bytes(self.epochs)
        self.files[PROOF] = data
        pd = digest.of_bytes(data)
        self.files["admission-proof.digest"] = (pd + "\n").encode()
        self.execution["admissionProofDigest"] = pd
        self.files[EXEC] = canon.dumps(self.execution)
        return self.files

    def _proof_bytes(self, epochs: list[dict[str, Any]]) -> bytes:
        blocks = [epochs[i : i + 4096] for i in range(0, len(epochs), 4096)]
        return canon.dumps({**self.proof, "epochBlocks": blocks})
