"""Every recorded bundle under tests/vectors/proof/ reads with its expected report.

The vectors come from the prove engineer's writer; only their bundle/ and
expected.json are read here (never the writer's code or tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.proof.reader import verify_bundle
from crucible.proof.reader._replay import Replay

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "proof"
CASES = (
    sorted(p.name for p in VECTORS.iterdir() if (p / "expected.json").is_file())
    if VECTORS.is_dir()
    else []
)


#: cases where this reader, applying docs/spec, disagrees with the recorded expectation.
#: Each is reported to the lead; the test pins the reader's own verdict instead.
DISAGREEMENTS: dict[str, tuple[str, int]] = {}


def expected(case: str) -> dict[str, Any]:
    value: dict[str, Any] = canon.loads((VECTORS / case / "expected.json").read_bytes())
    return value


def test_vectors_are_present() -> None:
    assert len(CASES) >= 20, "the prove engineer's recorded bundles are missing"


@pytest.mark.parametrize("case", CASES)
def test_vector_report(case: str) -> None:
    want = expected(case)["reader"]
    if case in DISAGREEMENTS:
        code, phase = DISAGREEMENTS[case]
        want = {"outcome": "rejected", "code": code, "phase": phase}
    report = verify_bundle(VECTORS / case / "bundle")
    if want["outcome"] == "reading":
        assert report.problem is None, str(report.problem)
        assert report.reading is not None
        assert report.reading.completion == want["completion"]
        c = report.reading.counts
        got: dict[str, Any] = {
            "stages": c.stages,
            "instances": c.instances,
            "outputs": c.outputs,
            "selections": c.selections,
        }
        assert got == want["counts"]
        assert report.reading.proof_digest == expected(case)["writer"][
            "proofDigest"
        ] or "base" in expected(case)
    else:
        p = report.problem
        assert p is not None, "the bundle reads, a rejection is expected"
        got = {"code": p.code, "phase": p.phase}
        want_cmp = {"code": want["code"], "phase": want["phase"]}
        for key in ("epoch", "observation"):
            if key in want:
                got[key] = getattr(p, key)
                want_cmp[key] = want[key]
        assert got == want_cmp, str(p)


_OUTCOME = {"admitted", "refused", "begun", "accepted", "cut-off", "recorded"}


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if expected(c)["reader"]["outcome"] == "reading" and c not in DISAGREEMENTS],
)
def test_vector_measurements(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's own candidate measurements equal the writer's, decision by decision."""
    traces: list[list[dict[str, Any]]] = []
    real_init = Replay.__init__

    def init(self: Replay, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        traces.append(self.trace)

    monkeypatch.setattr(Replay, "__init__", init)
    report = verify_bundle(VECTORS / case / "bundle")
    assert report.problem is None
    mine = traces[0]
    theirs = expected(case)["decisions"]
    # the writer lists decisions it made; the reader replays what the proof holds
    theirs = [d for d in theirs if d["outcome"] in _OUTCOME]
    keyed = {(d["epoch"], d["observation"], d["kind"]): d for d in mine}
    for d in theirs:
        key = (d["epoch"], d["observation"], d["kind"])
        assert key in keyed, f"the writer measured {key}; the reader replayed no such decision"
        m = keyed[key]
        assert m["outcome"] == d["outcome"], (key, m, d)
        assert m["acceptance"] == d["acceptance"], (key, m, d)
        assert m["refusal"] == d["refusal"], (key, m, d)
