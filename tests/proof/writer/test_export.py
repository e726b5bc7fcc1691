"""``crucible-prove --state STATE --out BUNDLE`` (docs/spec/admission-proof.md §11): the recorded
vectors laid out as an accounted run's state dir export to the very bundles
``--workflow/--operations/--artifacts`` write, the reader reads them, and every bad
input is one located line with its exit code and nothing written."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon
from crucible.core.errors import CrucibleError, InputRefused, UsageError
from crucible.proof.reader import VerifyOptions, load_expectations, verify_bundle
from crucible.proof.writer import ExportOptions, export
from crucible.proof.writer._export import run_ended
from tests.proof.writer.prove_helpers import read_tree

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "tests" / "vectors" / "proof"
BIN = Path(sys.executable).parent
PROVE = BIN / "crucible-prove"
VERIFY = BIN / "crucible-verify"

#: every unmutated case: exported from a state dir it must give the recorded bundle
CASES = sorted(
    p.name
    for p in VECTORS.iterdir()
    if p.is_dir() and "base" not in canon.loads((p / "expected.json").read_bytes())
)


def state_of(name: str, root: Path) -> Path:
    """The vector ``name`` laid out as an accounted run's state dir."""
    src = VECTORS / name
    state = root / "state"
    state.mkdir(parents=True)
    (state / "plan.json").write_bytes(b"{}")
    shutil.copy(src / "workflow.json", state / "workflow.json")
    shutil.copy(src / "operations.ndjson", state / "operations.ndjson")
    shutil.copytree(src / "artifacts", state / "proof" / "artifacts")
    return state


def cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, timeout=120
    )


def one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr


def no_leftovers(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.")]


@pytest.mark.parametrize("name", CASES)
def test_state_dir_exports_the_recorded_bundle(name: str, tmp_path: Path) -> None:
    state = state_of(name, tmp_path)
    out = tmp_path / "bundle"
    expected = canon.loads((VECTORS / name / "expected.json").read_bytes())
    result = export(ExportOptions(state, out, durable=False))
    assert read_tree(out) == read_tree(VECTORS / name / "bundle")
    assert result.partial == expected["writer"]["partial"]
    assert (result.unrecordable is None) == (expected["writer"]["exit"] == 0)
    custody = VECTORS / name / "bundle.custody"
    if custody.is_dir():
        assert read_tree(tmp_path / "bundle.custody") == read_tree(custody)
    report = verify_bundle(out, VerifyOptions())
    assert report.problem is None and report.reading is not None
    assert report.reading.completion == expected["reader"]["completion"]


def _session(state: Path, *events: dict[str, object]) -> None:
    lines = [{"event": "plan_admitted", "session": 1}, *events]
    (state / "session.jsonl").write_bytes(b"".join(canon.dumps(e) + b"\n" for e in lines))


def _without_finish(state: Path) -> None:
    ops = state / "operations.ndjson"
    lines = ops.read_bytes().splitlines(keepends=True)
    assert b'"op":"finish"' in lines[-1]
    ops.write_bytes(b"".join(lines[:-1]))


SHUTDOWN = {"event": "shutdown", "session": 1, "reason": "completed", "exit_code": 0}


def test_ended_run_exports_complete_without_a_finish_line(tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    _without_finish(state)
    _session(state, {"event": "run_finished", "session": 1}, SHUTDOWN)
    log = (state / "operations.ndjson").read_bytes()
    # every candidate materialized in full and compared, the virtual finish's too
    result = export(ExportOptions(state, tmp_path / "bundle", check_candidates=True))
    assert result.partial is None
    # the same bundle the recorded log with its finish line gives
    assert read_tree(tmp_path / "bundle") == read_tree(VECTORS / "complete" / "bundle")
    assert (state / "operations.ndjson").read_bytes() == log  # the state is not changed


@pytest.mark.parametrize(
    "events",
    [
        [],  # never shut down: crashed (or still running without a lock)
        [{**SHUTDOWN, "reason": "signal", "signal": "SIGTERM", "exit_code": 143}],
        [{**SHUTDOWN, "reason": "error", "exit_code": 3}],
        [SHUTDOWN, {"event": "plan_admitted", "session": 2}],  # a resumed session
        [SHUTDOWN, "torn"],
    ],
    ids=["no-shutdown", "signal", "error", "resumed", "torn"],
)
def test_run_that_did_not_end_exports_partial(events: list[object], tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    _without_finish(state)
    if events and events[-1] == "torn":
        _session(state, SHUTDOWN)
        with open(state / "session.jsonl", "ab") as f:
            f.write(b'{"event":"task_star')
    else:
        _session(state, *events)  # type: ignore[arg-type]
    result = export(ExportOptions(state, tmp_path / "bundle", durable=False))
    assert result.partial == "no-finish"
    label = canon.loads((tmp_path / "bundle" / "partial.json").read_bytes())
    assert label == {"partialVersion": 1, "reason": "no-finish", "operationLine": None}


def test_cli_exports_and_verify_pins_the_workflow_digest(tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    out = tmp_path / "bundle"
    proc = cli(PROVE, "--state", state, "--out", out)
    assert proc.returncode == 0, proc.stderr
    proof = (out / "admission-proof.json").read_bytes()
    assert proc.stdout == "sha256:" + hashlib.sha256(proof).hexdigest() + "\n"
    assert "partial" not in one_line(proc.stderr)
    pinned = "sha256:" + hashlib.sha256((state / "workflow.json").read_bytes()).hexdigest()
    ok = cli(VERIFY, out, "--expect", pinned)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("reading: complete")
    other = "sha256:" + "0" * 64
    bad = cli(VERIFY, out, "--expect", other)
    assert bad.returncode == 1
    assert "digest-mismatch (phase 2" in one_line(bad.stderr)
    assert "workflowDigest" in bad.stderr


def test_expect_digest_is_the_workflow_pin() -> None:
    value = "sha256:" + "a" * 64
    assert load_expectations(Path(value)) == {"workflowDigest": value}


def test_interrupted_run_exports_a_partial_bundle_that_says_so(tmp_path: Path) -> None:
    state = state_of("interrupted-open-group", tmp_path)
    out = tmp_path / "bundle"
    proc = cli(PROVE, "--state", state, "--out", out)
    assert proc.returncode == 0, proc.stderr
    summary, kept = proc.stderr.splitlines()
    assert "(partial: open-epoch)" in summary
    assert kept == f"crucible-prove: received material kept in custody: {out}.custody"
    label = canon.loads((out / "partial.json").read_bytes())
    assert label["reason"] == "open-epoch"
    read = cli(VERIFY, out)
    assert read.returncode == 0 and read.stdout.startswith("reading: partial"), read.stdout


def _damage_no_plan(state: Path) -> None:
    (state / "plan.json").unlink()


def _damage_unaccounted(state: Path) -> None:
    (state / "operations.ndjson").unlink()
    (state / "workflow.json").unlink()
    shutil.rmtree(state / "proof")


def _damage_no_workflow(state: Path) -> None:
    (state / "workflow.json").unlink()


def _damage_no_artifacts(state: Path) -> None:
    shutil.rmtree(state / "proof" / "artifacts")


@pytest.mark.parametrize(
    ("damage", "code", "says"),
    [
        (_damage_no_plan, 1, "not a run's state directory (no plan.json)"),
        (_damage_unaccounted, 1, "an unaccounted run: no operations.ndjson"),
        (_damage_no_workflow, 1, "an accounted run without workflow.json"),
        (_damage_no_artifacts, 1, "an accounted run without its proof/artifacts/ directory"),
    ],
)
def test_state_dir_that_is_no_accounted_run_is_refused(
    damage: object, code: int, says: str, tmp_path: Path
) -> None:
    state = state_of("complete", tmp_path)
    assert callable(damage)
    damage(state)
    proc = cli(PROVE, "--state", state, "--out", tmp_path / "bundle")
    assert proc.returncode == code and proc.stdout == ""
    line = one_line(proc.stderr)
    assert line.startswith(f"crucible-prove: error: {state}: ") and says in line, line
    no_leftovers(tmp_path, "bundle")


def test_state_path_not_a_directory_is_usage(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for state, says in ((tmp_path / "file", "not a directory"), (tmp_path / "nope", "no such")):
        proc = cli(PROVE, "--state", state, "--out", tmp_path / "bundle")
        assert proc.returncode == 2 and says in one_line(proc.stderr), proc.stderr
    state = state_of("complete", tmp_path / "real")
    (tmp_path / "link").symlink_to(state)
    proc = cli(PROVE, "--state", tmp_path / "link", "--out", tmp_path / "bundle")
    assert proc.returncode == 2 and "symbolic link" in one_line(proc.stderr)
    no_leftovers(tmp_path, "bundle")


def test_out_existing_nonempty_directory_is_refused_untouched(tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    out = tmp_path / "bundle"
    assert cli(PROVE, "--state", state, "--out", out).returncode == 0
    before = read_tree(out)
    # even a previous bundle: an export never replaces a directory
    proc = cli(PROVE, "--state", state, "--out", out)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "exists and is not empty" in one_line(proc.stderr)
    assert read_tree(out) == before
    (tmp_path / "again.custody").mkdir()
    (tmp_path / "again.custody" / "mine").write_text("mine")
    proc = cli(PROVE, "--state", state, "--out", tmp_path / "again")
    assert (
        proc.returncode == 2
        and "again.custody: --out's custody folder: exists and is not empty" in proc.stderr
    )
    no_leftovers(tmp_path, "again")
    (tmp_path / "file").write_text("mine")
    proc = cli(PROVE, "--state", state, "--out", tmp_path / "file")
    assert proc.returncode == 2 and "not a directory" in one_line(proc.stderr)
    assert (tmp_path / "file").read_text() == "mine"


def test_out_inside_the_state_dir_is_refused(tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    for out in (state / "bundle", state / "proof" / "bundle"):
        proc = cli(PROVE, "--state", state, "--out", out)
        assert proc.returncode == 2, proc.stderr
        assert "inside the run's state directory" in one_line(proc.stderr)
        no_leftovers(out.parent, "bundle")


def test_out_empty_directory_is_filled(tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    (tmp_path / "empty").mkdir()
    export(ExportOptions(state, tmp_path / "empty", durable=False))
    assert read_tree(tmp_path / "empty") == read_tree(VECTORS / "complete" / "bundle")


@pytest.mark.parametrize("other", ["--workflow", "--operations", "--artifacts"])
def test_state_excludes_the_three_inputs(other: str, tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    proc = cli(PROVE, "--state", state, other, state / "x", "--out", tmp_path / "b")
    assert proc.returncode == 2
    assert f"--state and {other} exclude each other" in one_line(proc.stderr)
    proc = cli(PROVE, "--state", state)
    assert proc.returncode == 2 and "missing option --out" in one_line(proc.stderr)


def test_running_dispatcher_is_refused(tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = cli(PROVE, "--state", state, "--out", tmp_path / "bundle")
        assert proc.returncode == 1
        assert "a dispatcher is running on this state directory" in one_line(proc.stderr)
        no_leftovers(tmp_path, "bundle")
    finally:
        os.close(fd)
    # the lock released (the dispatcher ended): the export proceeds
    export(ExportOptions(state, tmp_path / "bundle", durable=False))


def test_bad_log_in_state_is_located_in_the_state_dir(tmp_path: Path) -> None:
    state = state_of("complete", tmp_path)
    ops = state / "operations.ndjson"
    lines = ops.read_bytes().splitlines(keepends=True)
    ops.write_bytes(b"".join(lines[:3]) + b'{"op":"nonsense"}\n')
    with pytest.raises(CrucibleError) as info:
        export(ExportOptions(state, tmp_path / "bundle", durable=False))
    assert str(info.value).startswith(f"{ops}:4: ")
    no_leftovers(tmp_path, "bundle")


def test_errors_are_the_documented_classes(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        export(ExportOptions(tmp_path / "nope", tmp_path / "b"))
    (tmp_path / "s").mkdir()
    with pytest.raises(InputRefused):
        export(ExportOptions(tmp_path / "s", tmp_path / "b"))


_EVENT = st.fixed_dictionaries(
    {
        "event": st.sampled_from(["plan_admitted", "task_finished", "run_finished", "shutdown"]),
        "session": st.integers(1, 3),
    },
    optional={"reason": st.sampled_from(["completed", "signal", "error"])},
)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(_EVENT, max_size=6), tail=st.binary(max_size=24), torn=st.booleans())
def test_a_run_ended_only_when_its_last_line_is_a_completed_shutdown(
    events: list[dict[str, object]],
    tail: bytes,
    torn: bool,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    state = tmp_path_factory.mktemp("ended")
    data = b"".join(canon.dumps(e) + b"\n" for e in events)
    if torn:
        data += tail.replace(b"\n", b"")  # a last line cut short (or garbage)
    (state / "session.jsonl").write_bytes(data)
    last = events[-1] if events else None
    expected = (
        last is not None
        and last["event"] == "shutdown"
        and last.get("reason") == "completed"
        and not (torn and tail.replace(b"\n", b""))
    )
    assert run_ended(state) is expected


def test_a_torn_last_line_is_left_out_of_the_export(tmp_path: Path) -> None:
    """A dispatcher killed mid-append leaves a last line without its newline: the
    export is the complete lines' (partial), with a note naming the torn line."""
    state = state_of("complete", tmp_path)
    _session(state, SHUTDOWN)  # even a log that claims an end: a torn tail is no end
    ops = state / "operations.ndjson"
    lines = ops.read_bytes().splitlines(keepends=True)
    ops.write_bytes(b"".join(lines[:-2]) + lines[-2][:17])
    out = tmp_path / "bundle"
    proc = cli(PROVE, "--state", state, "--out", out)
    assert proc.returncode == 0, proc.stderr
    note, summary = proc.stderr.splitlines()
    assert note == (
        f"crucible-prove: {state}/operations.ndjson:{len(lines) - 1}: a torn last line "
        "(its writer was killed mid-write) is not part of the export"
    )
    assert "(partial: open-epoch)" in summary  # b's observation was the torn line
    # the same bundle as the log cut cleanly before that line
    clean = state_of("complete", tmp_path / "clean")
    (clean / "operations.ndjson").write_bytes(b"".join(lines[:-2]))
    export(ExportOptions(clean, tmp_path / "clean.bundle", durable=False))
    assert read_tree(out) == read_tree(tmp_path / "clean.bundle")
    reads = verify_bundle(out, VerifyOptions())
    assert reads.reading is not None and reads.reading.completion == "partial"
    # the three-input form keeps refusing it (every line must parse)
    direct = cli(
        PROVE,
        "--workflow",
        state / "workflow.json",
        "--operations",
        ops,
        "--artifacts",
        state / "proof" / "artifacts",
        "--out",
        tmp_path / "direct",
    )
    assert direct.returncode == 2 and f"operations.ndjson:{len(lines) - 1}:" in direct.stderr


@pytest.mark.parametrize("kind", ["fifo", "directory", "outside-link"])
def test_a_flat_artifact_that_is_no_regular_file_inside_is_refused(
    kind: str, tmp_path: Path
) -> None:
    """The flat names of the state's artifacts take the lstat path of read_artifact:
    a FIFO is never opened (no hang), a directory or a link out is refused."""
    state = state_of("complete", tmp_path)
    case = state / "proof" / "artifacts" / "root-case.json"
    case.unlink()
    if kind == "fifo":
        os.mkfifo(case)
    elif kind == "directory":
        case.mkdir()
    else:
        (tmp_path / "outside.json").write_bytes(b'{"q":1}')
        case.symlink_to(tmp_path / "outside.json")
    proc = cli(PROVE, "--state", state, "--out", tmp_path / "bundle")
    assert proc.returncode == 1, proc.stderr
    says = "escapes the artifacts directory" if kind == "outside-link" else "not a regular file"
    assert says in one_line(proc.stderr)
    no_leftovers(tmp_path, "bundle")
