"""crucible-prove through click's CliRunner and as a real installed script."""

from __future__ import annotations

import subprocess
from pathlib import Path

from click.testing import CliRunner

from crucible.core import canon
from crucible.proof.writer.cli import command
from tests.cli.edgetests import as_nobody
from tests.proof.writer.prove_helpers import PROVE, org_people, prove_args, read_tree


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROVE), *argv], capture_output=True, text=True, check=False)


def test_cli_writes_bundle_and_prints_the_proof_digest(tmp_path: Path) -> None:
    s = org_people(tmp_path)
    result = CliRunner().invoke(command, prove_args(s, tmp_path / "b"), standalone_mode=False)
    assert result.exit_code == 0, result.output
    digest_line = result.stdout.strip()
    assert digest_line == (tmp_path / "b" / "admission-proof.digest").read_text().strip()


def test_cli_check_candidates_gives_the_same_bundle(tmp_path: Path) -> None:
    s = org_people(tmp_path)
    a = run([*prove_args(s, tmp_path / "fast")])
    b = run([*prove_args(s, tmp_path / "checked"), "--check-candidates"])
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert read_tree(tmp_path / "fast") == read_tree(tmp_path / "checked")
    assert "epochs" in a.stderr and a.stdout.startswith("sha256:")


def test_exit_codes_of_the_real_script(tmp_path: Path) -> None:
    ok = org_people(tmp_path / "ok")
    assert run(prove_args(ok, tmp_path / "out")).returncode == 0
    before = read_tree(tmp_path / "out")
    # 1: a forbidden operation, naming the rule and the line
    bad = org_people(tmp_path / "forbidden")
    bad.ops.insert(-1, {"op": "retry", "instance": "a", "actor": "x", "at": "2026-10-17T09:00:00Z"})
    r = run(prove_args(bad, tmp_path / "out"))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "operations.ndjson:8:" in r.stderr
    assert "ineligible" in r.stderr and "Traceback" not in r.stderr
    # 2: an unparsable line
    ops = tmp_path / "broken.ndjson"
    ops.write_bytes((tmp_path / "ok" / "operations.ndjson").read_bytes() + b"{oops\n")
    argv = prove_args(ok, tmp_path / "out")
    argv[3] = str(ops)
    r = run(argv)
    assert r.returncode == 2 and "broken.ndjson:9:" in r.stderr
    assert read_tree(tmp_path / "out") == before
    # 3: recording unavailable: the last complete prefix, labelled partial
    tight = org_people(tmp_path / "tight", limits={"maxBytes": 7000})
    r = run(prove_args(tight, tmp_path / "tight-out"))
    assert r.returncode == 3, r.stderr
    assert "recording unavailable" in r.stderr
    label = canon.loads((tmp_path / "tight-out" / "partial.json").read_bytes())
    assert label["reason"] == "recording-unavailable"
    # 2: usage
    assert run(["--workflow", "x"]).returncode == 2
    assert run(["--help"]).returncode == 0
    assert run(["--version"]).returncode == 0


def test_probe_reports_measured_boundaries() -> None:
    r = run(["probe"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "accepted (equality fits)" in out
    assert "refused; refusal carrier" in out
    assert "short ids admitted; long ids refused" in out


def test_probe_properties(tmp_path: Path) -> None:
    from crucible.proof.writer._probe import one_output, two_stage_ids

    one = one_output(tmp_path)
    assert one.at_limit == "accepted" and one.acceptance[0] == one.detail["maxBytes"]
    assert one.below == "refused" and one.refusal is not None
    assert one.refusal[0] <= one.detail["maxBytes"] - 1
    assert one.refusal[1] < one.acceptance[1]  # no payload/envelope in the carrier
    two = two_stage_ids(tmp_path)
    long = two.detail["longAcceptance"]
    assert two.at_limit == "admitted" and two.below == "refused"
    # 63 extra characters per id, 2 ids, 3 places each (proof, execution, case)
    assert long[0] - two.acceptance[0] == 63 * 2 * 3
    assert two.refusal is not None and two.refusal[0] <= two.detail["maxBytes"]


def test_operations_from_stdin(tmp_path: Path) -> None:
    s = org_people(tmp_path)
    argv = prove_args(s, tmp_path / "b")
    ops = Path(argv[3])
    argv[3] = "-"
    r = subprocess.run(
        [str(PROVE), *argv], input=ops.read_bytes(), capture_output=True, check=False
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b" / "admission-proof.json").is_file()
    bad = ops.read_bytes() + b'{"op": "nope"}\n'
    r = subprocess.run([str(PROVE), *argv], input=bad, capture_output=True, check=False)
    assert r.returncode == 1 and b"<stdin>:9:" in r.stderr


def test_workflow_from_stdin(tmp_path: Path) -> None:
    # `--workflow -` passed the option check, then failed as "cannot read workflow:
    # No such file or directory" (exit 3): `-` must mean stdin wherever a path is taken.
    s = org_people(tmp_path)
    argv = prove_args(s, tmp_path / "b")
    wf = Path(argv[1])
    assert run(argv).returncode == 0
    expected = read_tree(tmp_path / "b")
    argv[1] = "-"
    r = subprocess.run([str(PROVE), *argv], input=wf.read_bytes(), capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    assert read_tree(tmp_path / "b") == expected
    r = subprocess.run([str(PROVE), *argv], input=b"{", capture_output=True, check=False)
    assert r.returncode == 2 and r.stderr.startswith(b"crucible-prove: error: <stdin>:")
    assert r.stderr.count(b"\n") == 1


def test_both_inputs_from_stdin_and_wrong_kinds_are_usage_errors(tmp_path: Path) -> None:
    s = org_people(tmp_path)
    argv = prove_args(s, tmp_path / "b")
    both = list(argv)
    both[1] = both[3] = "-"
    r = run(both)
    assert r.returncode == 2 and "cannot both read stdin" in r.stderr
    as_dir = list(argv)
    as_dir[1] = str(tmp_path)
    r = run(as_dir)
    assert (
        r.returncode == 2
        and r.stderr
        == f"crucible-prove: error: --workflow {tmp_path}: is a directory, not a file\n"
    )
    not_dir = list(argv)
    not_dir[5] = argv[1]
    r = run(not_dir)
    assert r.returncode == 2 and r.stderr.endswith(": not a directory\n")
    assert not (tmp_path / "b").exists()


def test_unreadable_workflow_is_one_error_line(tmp_path: Path) -> None:
    # click's readable check used to answer first with its three-line usage block
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="prove-test-"))
    try:
        shared.chmod(0o755)
        argv = prove_args(org_people(shared / "s"), shared / "b")
        for p in (shared / "s", Path(argv[5])):
            p.chmod(0o755)
        Path(argv[1]).chmod(0)
        code, text = as_nobody(command, "crucible-prove", argv)
        assert code == 3, text
        assert (
            text == f"crucible-prove: error: {argv[1]}: cannot read workflow: Permission denied\n"
        )
    finally:
        shutil.rmtree(shared)


def test_inputs_through_pipes(tmp_path: Path) -> None:
    # `--operations <(zcat ops.ndjson.gz)` was refused as "not a file"
    import os

    s = org_people(tmp_path)
    argv = prove_args(s, tmp_path / "b")
    assert run(argv).returncode == 0
    expected = read_tree(tmp_path / "b")
    fifos = []
    for i in (1, 3):
        fifo = tmp_path / f"pipe{i}"
        os.mkfifo(fifo)
        fifos.append((fifo, Path(argv[i]).read_bytes()))
        argv[i] = str(fifo)
    import threading

    def feed() -> None:
        for fifo, data in fifos:
            fifo.write_bytes(data)  # blocks until the reader opens the pipe

    feeder = threading.Thread(target=feed, daemon=True)
    proc = subprocess.Popen([str(PROVE), *argv], stderr=subprocess.PIPE)
    feeder.start()
    _, err = proc.communicate(timeout=60)
    for fifo, _data in fifos:  # release a feeder the command never read from
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    feeder.join(10)
    assert proc.returncode == 0, err
    assert read_tree(tmp_path / "b") == expected
