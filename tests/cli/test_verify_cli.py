"""crucible-verify through click's CliRunner and as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from crucible.core import canon, digest
from crucible.proof.reader.cli import command
from tests.proof.reader.bundlegen import org_people, write_files

EXE = Path(sys.executable).parent / "crucible-verify"
SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "report.json"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_files(tmp_path / "b", org_people().exported())


def _schema_check(report: dict[str, object]) -> None:
    schema = json.loads(SCHEMA.read_text())
    assert set(report) <= set(schema["properties"])
    assert report["reportVersion"] == 1
    if report["verdict"] == "reading":
        reading = report["reading"]
        assert isinstance(reading, dict)
        assert set(reading) == set(schema["properties"]["reading"]["required"])
    else:
        problem = report["problem"]
        assert isinstance(problem, dict)
        assert set(problem) == set(schema["properties"]["problem"]["required"])
        assert problem["code"] in schema["properties"]["problem"]["properties"]["code"]["enum"]


def test_reading_json(bundle: Path) -> None:
    r = CliRunner().invoke(command, [str(bundle), "--json"], standalone_mode=False)
    assert r.exception is None and r.return_value == 0
    report = canon.loads(r.stdout_bytes)
    assert r.stdout_bytes == canon.dumps(report) + b"\n"
    _schema_check(report)
    assert report["verdict"] == "reading"
    assert report["reading"]["counts"] == {
        "stages": 2,
        "instances": 3,
        "outputs": 4,
        "selections": 1,
    }


def test_human_reading(bundle: Path) -> None:
    r = CliRunner().invoke(command, [str(bundle)], standalone_mode=False)
    assert r.return_value == 0
    assert "reading: complete" in r.stdout


def test_finding_exit_1_and_report(bundle: Path) -> None:
    (bundle / "admission-proof.digest").write_bytes(b"sha256:" + b"0" * 64 + b"\n")
    proc = subprocess.run([str(EXE), str(bundle), "--json"], capture_output=True, check=False)
    assert proc.returncode == 1
    report = canon.loads(proc.stdout)
    _schema_check(report)
    assert report["verdict"] == "finding"
    assert report["problem"]["code"] == "digest-mismatch" and report["problem"]["phase"] == 2
    assert proc.stderr.count(b"\n") == 1 and b"digest-mismatch" in proc.stderr


def test_refusal_exit_1(bundle: Path) -> None:
    (bundle / "execution.json").write_bytes(b"{")
    proc = subprocess.run([str(EXE), str(bundle), "--json"], capture_output=True, check=False)
    assert proc.returncode == 1
    assert canon.loads(proc.stdout)["verdict"] == "refusal"


def test_operational_exit_3_writes_no_report(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(EXE), str(tmp_path / "nope"), "--json"], capture_output=True, check=False
    )
    assert proc.returncode == 3
    assert proc.stdout == b""
    assert proc.stderr.startswith(b"crucible-verify: error: ") and b"Traceback" not in proc.stderr


def test_usage_exit_2(tmp_path: Path, bundle: Path) -> None:
    proc = subprocess.run([str(EXE)], capture_output=True, check=False)
    assert proc.returncode == 2
    bad = tmp_path / "expect.json"
    bad.write_text('{"nonsense": 1}')
    proc = subprocess.run(
        [str(EXE), str(bundle), "--expect", str(bad)], capture_output=True, check=False
    )
    assert proc.returncode == 2 and proc.stdout == b""


def test_expect_agreement_and_disagreement(tmp_path: Path, bundle: Path) -> None:
    pd = digest.of_bytes((bundle / "admission-proof.json").read_bytes())
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"admissionProofDigest": pd, "epochs": 4}))
    assert (
        subprocess.run(
            [str(EXE), str(bundle), "--expect", str(good)], capture_output=True, check=False
        ).returncode
        == 0
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"epochs": 5}))
    proc = subprocess.run(
        [str(EXE), str(bundle), "--expect", str(bad), "--json"], capture_output=True, check=False
    )
    assert proc.returncode == 1
    assert canon.loads(proc.stdout)["problem"]["code"] == "digest-mismatch"


def test_help_and_version() -> None:
    proc = subprocess.run([str(EXE), "--help"], capture_output=True, check=False)
    assert proc.returncode == 0 and b"BUNDLE" in proc.stdout
    proc = subprocess.run([str(EXE), "--version"], capture_output=True, check=False)
    assert proc.returncode == 0 and b"crucible-verify" in proc.stdout


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; from crucible.proof.reader.cli import command; "
        "from click.testing import CliRunner; CliRunner().invoke(command, ['--help']); "
        "print(','.join(m for m in ('networkx','hypothesis','rich','starlark') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
