"""Recorded bundles under tests/vectors/proof/ regenerate byte-for-byte.

Update with ``CRUCIBLE_UPDATE_GOLDEN=1 pytest tests/proof/writer/test_vectors.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from tests.proof.writer.prove_helpers import check_chain, read_tree
from tests.proof.writer.vector_cases import CASES, MUTATIONS

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "tests" / "vectors" / "proof"
UPDATE = os.environ.get("CRUCIBLE_UPDATE_GOLDEN") == "1"
SCRIPT = Path(sys.executable).parent / "crucible-prove"


def reading(bundle: Path) -> dict[str, Any]:
    """The reading a conforming reader must report for an unmutated bundle."""
    ex = canon.loads((bundle / "execution.json").read_bytes())
    wf = canon.loads((bundle / "workflow.json").read_bytes())
    proof = canon.loads((bundle / "admission-proof.json").read_bytes())
    stages = {st["stage"]: st for st in ex["stages"]}
    producers = {s["input"]["fromStage"] for s in wf["stages"]} - {None}
    epochs = [e for b in proof["epochBlocks"] for e in b]
    last = epochs[-1]
    open_epoch = last["kind"] == "group" and len(last["results"]) < len(last["starts"])
    open_epoch = open_epoch or (last["kind"] == "retry" and not last["results"])
    partial = (
        (bundle / "partial.json").exists()
        or open_epoch
        or any(st["set"] == "blocked" for st in ex["stages"])
        or any(stages[p]["selection"] is None for p in producers)
        or any(i["state"] not in ("completed", "completed-zero") for i in ex["instances"])
    )
    records = sum(
        len(canon.loads((bundle / "sets" / f"{name}.json").read_bytes())["records"])
        for name in stages
    )
    return {
        "outcome": "reading",
        "completion": "partial" if partial else "complete",
        "counts": {
            "stages": sum(st["set"] == "closed" for st in ex["stages"]),
            "instances": len(ex["instances"]),
            "outputs": records,
            "selections": sum(st["selection"] is not None for st in ex["stages"]),
        },
    }


def produce(name: str, dest: Path) -> None:
    """Build one case's inputs, run the writer, write expected.json (and mutate)."""
    from crucible.proof.writer import ProveOptions, prove

    mutation = next((m for m in MUTATIONS if m[0] == name), None)
    base = CASES[mutation[1] if mutation else name]
    scenario = base.build(dest)
    wf, ops, art = scenario.write()
    result = prove(
        ProveOptions(wf, ops, art, dest / "bundle", check_candidates=True, durable=False)
    )
    bundle = dest / "bundle"
    check_chain(bundle)
    expected: dict[str, Any] = {
        "case": name,
        "description": mutation[2] if mutation else base.description,
        "writer": {
            "exit": 3 if result.unrecordable else 0,
            "partial": result.partial,
            "proofDigest": result.proof_digest,
            "bytes": result.bytes,
            "files": result.files,
            "unrecordableLine": (
                int(result.unrecordable.split(":")[1]) if result.unrecordable else None
            ),
        },
        "decisions": [
            {
                "line": d.line,
                "epoch": d.epoch,
                "observation": d.observation,
                "kind": d.kind,
                "outcome": d.outcome,
                "acceptance": list(d.acceptance) if d.acceptance else None,
                "refusal": list(d.refusal) if d.refusal else None,
            }
            for d in result.decisions
        ],
    }
    if mutation:
        expected["base"] = mutation[1]
        mutation[3](bundle)
        expected["reader"] = mutation[4]
    else:
        expected["reader"] = reading(bundle)
    (dest / "expected.json").write_bytes(canon.dumps(expected) + b"\n")
    # unordered scratch paths must not leak into the recording
    for junk in dest.glob(".bundle.*"):
        shutil.rmtree(junk)


ALL = [*CASES, *(m[0] for m in MUTATIONS)]


@pytest.mark.parametrize("name", ALL)
def test_vector_regenerates_byte_identically(name: str, tmp_path: Path) -> None:
    dest = tmp_path / name
    produce(name, dest)
    target = VECTORS / name
    if UPDATE:
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(dest, target)
    assert target.is_dir(), f"missing vector {name}; run with CRUCIBLE_UPDATE_GOLDEN=1"
    assert read_tree(dest) == read_tree(target)


def test_no_stale_vectors() -> None:
    present = {p.name for p in VECTORS.iterdir() if p.is_dir()}
    assert present == set(ALL)


@pytest.mark.parametrize("name", ["complete", "order-bytes-ba", "refusal-carrier-unrecordable"])
def test_committed_inputs_reproduce_the_bundle_with_the_real_command(
    name: str, tmp_path: Path
) -> None:
    src = VECTORS / name
    expected = canon.loads((src / "expected.json").read_bytes())
    r = subprocess.run(
        [
            str(SCRIPT),
            "--workflow",
            str(src / "workflow.json"),
            "--operations",
            str(src / "operations.ndjson"),
            "--artifacts",
            str(src / "artifacts"),
            "--out",
            str(tmp_path / "bundle"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == expected["writer"]["exit"], r.stderr
    assert read_tree(tmp_path / "bundle") == read_tree(src / "bundle")


def table_rows() -> list[str]:
    rows = []
    for name in sorted(ALL):
        e = canon.loads((VECTORS / name / "expected.json").read_bytes())
        r, w = e["reader"], e["writer"]
        if r["outcome"] == "reading":
            reader = f"reading, {r['completion']}"
        else:
            where = "".join(f", {k} {r[k]}" for k in ("epoch", "observation") if k in r)
            reader = f"{r['code']} (phase {r['phase']}{where})"
        writer = f"exit {w['exit']}" + (f", partial: {w['partial']}" if w["partial"] else "")
        rows.append(f"| `{name}` | {writer} | {reader} | {e['description']} |")
    return rows


def test_readme_lists_every_case_with_its_expectation() -> None:
    path = VECTORS / "README.md"
    text = path.read_text()
    header = "| case | writer | reader must report | what it records |\n|---|---|---|---|\n"
    start = text.index(header) + len(header)
    end = text.index("\n\n", start)
    rows = "\n".join(table_rows())
    if UPDATE:
        text = text[:start] + rows + text[end:]
        path.write_text(text)
        end = start + len(rows)
    assert text[start:end] == rows
