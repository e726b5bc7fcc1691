"""Byte-exact reports: `crucible-verify --json` on deterministic spec-built bundles.

Rewrite with CRUCIBLE_UPDATE_GOLDEN=1 (then review the diff).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from crucible.core import canon
from crucible.proof.reader.cli import command
from tests.proof.reader.bundlegen import org_people, rich, write_files
from tests.proof.reader.mutate import Bundle
from tests.proof.reader.test_mutations import MUTATIONS

GOLDEN = Path(__file__).resolve().parent / "golden"


def _mutated(name: str) -> Callable[[], dict[str, bytes]]:
    def build() -> dict[str, bytes]:
        result = MUTATIONS[name](Bundle(org_people().exported()))
        assert result is not None
        return result[0]

    return build


CASES: dict[str, Callable[[], dict[str, bytes]]] = {
    "org-people": lambda: org_people().exported(),
    "rich": lambda: rich().exported(),
    "false-refusal": _mutated("false_refusal"),
    "extra-file": _mutated("extra_file"),
    "non-canonical": _mutated("non_canonical_bytes"),
    "broken-chain-link": _mutated("broken_chain_link"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_bytes(tmp_path: Path, case: str) -> None:
    bundle = write_files(tmp_path / "b", CASES[case]())
    result = CliRunner().invoke(command, [str(bundle), "--json"], standalone_mode=False)
    assert result.exception is None
    assert result.stdout_bytes == canon.dumps(canon.loads(result.stdout_bytes)) + b"\n"
    golden = GOLDEN / f"{case}.json"
    if os.environ.get("CRUCIBLE_UPDATE_GOLDEN") == "1":
        golden.write_bytes(result.stdout_bytes)
    assert result.stdout_bytes == golden.read_bytes()
