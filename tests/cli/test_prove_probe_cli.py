"""``crucible-prove probe`` as a real installed script: the text report and ``--json``
(docs/spec/admission-proof.md §8), each byte-exact against a golden file.

Rewrite the golden files with CRUCIBLE_UPDATE_GOLDEN=1 (then review the diff).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from crucible.core import canon
from tests.schemas.walker import first_error

SCRIPT = Path(sys.executable).parent / "crucible-prove"
GOLDEN = Path(__file__).parent / "golden"


def probe(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(SCRIPT), "probe", *argv], capture_output=True, timeout=120, check=False
    )


def golden(name: str, data: bytes) -> bytes:
    if os.environ.get("CRUCIBLE_UPDATE_GOLDEN") == "1":
        (GOLDEN / name).write_bytes(data)
    return (GOLDEN / name).read_bytes()


def test_the_text_report_is_byte_exact() -> None:
    done = probe()
    assert done.returncode == 0 and done.stderr == b""
    assert done.stdout == golden("probe.txt", done.stdout)


def test_json_is_one_canonical_object_matching_its_schema(tmp_path: Path) -> None:
    done = probe("--json")
    assert done.returncode == 0 and done.stderr == b""
    # kept for the end-of-session schema walk (tests/schemas/walker.py STDOUT_SUFFIX)
    (tmp_path / "prove-probe.stdout.json").write_bytes(done.stdout)
    assert done.stdout.endswith(b"\n") and done.stdout.count(b"\n") == 1
    value = json.loads(done.stdout)
    assert canon.dumps(value) + b"\n" == done.stdout
    assert first_error("prove-probe.json", value) is None
    assert done.stdout == golden("probe.json", done.stdout)


def test_json_holds_every_fact_of_the_text() -> None:
    """Each number and outcome the text prints is a member of the JSON object."""
    value = json.loads((GOLDEN / "probe.json").read_bytes())
    one, two = value["oneOutput"], value["twoStageIds"]
    text = (GOLDEN / "probe.txt").read_text()
    a, r = one["acceptance"], one["below"]["refusal"]
    assert (
        f"acceptance candidate: {a['bytes']} bytes in {a['files']} files "
        f"(proof + digest sidecar: {one['proofBytes']} bytes)" in text
    )
    assert f"maxBytes {one['maxBytes']}: {one['atLimit']} (equality fits)" in text
    assert (
        f"maxBytes {one['below']['maxBytes']}: {one['below']['outcome']}; refusal carrier "
        f"{r['bytes']} bytes in {r['files']} files fits" in text
    )
    assert f"({one['stages']} stage, {one['records']} record)" in text
    assert f"({two['selectedParents']} selected parents, {two['childIds']} child ids)" in text
    for side in ("short", "long"):
        s = two[side]
        assert (
            f"{s['idLength']}-character ids: acceptance candidate "
            f"{s['acceptance']['bytes']} bytes in {s['acceptance']['files']} files" in text
        )
    r2 = two["long"]["refusal"]
    assert (
        f"maxBytes {two['maxBytes']}: short ids {two['short']['outcome']}; long ids "
        f"{two['long']['outcome']}, refusal carrier {r2['bytes']} bytes in {r2['files']} "
        "files fits" in text
    )
    assert one["below"]["fits"] and two["long"]["fits"]


def test_probe_help_names_json() -> None:
    done = probe("--help")
    assert done.returncode == 0 and b"--json" in done.stdout
    assert probe("--jsn").returncode == 2
