"""Run results (``STATE/outputs.json``, ``--outputs``) and published files
(``--publish-dir``) through real ``crucible-dispatch`` subprocesses (issue 17)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from tests.run.dispatchtests import DISPATCH, start_dispatch

REPO = Path(__file__).resolve().parents[2]

PACK = """
edition = 4
[workflow]
name = "results"
[workflow.outputs]
total = "sum.total"
broken = "bad.total"
skipped = "after.total"
last = "report.lines"
[workflow.publish]
"reports/" = "sum:*.md"
"failed" = "bad:*.md"
"failed-settled" = { from = "bad:*.md", settled = true }
"each/" = "per:out.txt"
[[workflow.task]]
name = "sum"
emits = { total = "integer" }
emits_files = ["*.md", "sub/*.md"]
run = 'echo "# sum" > a.md; mkdir sub; echo b > sub/b.md; echo "{\\"total\\": 42}" > "$CRUCIBLE_OUTPUT"'
[[workflow.task]]
name = "bad"
emits = { total = "integer" }
emits_files = ["*.md"]
run = 'echo "# bad" > r.md; exit 3'
[[workflow.task]]
name = "after"
needs = ["bad"]
emits = { total = "integer" }
run = "true"
[[workflow.task]]
name = "per"
map = ["x", "y"]
emits_files = ["out.txt"]
run = 'cat "$CRUCIBLE_INPUTS_DIR/item" > out.txt'
[[workflow.task]]
name = "report"
epilogue = true
emits = { lines = "integer" }
run = 'echo "{\\"lines\\": 7}" > "$CRUCIBLE_OUTPUT"'
"""


def dispatch(tmp_path: Path, *args: str, pack: str = PACK) -> subprocess.CompletedProcess[bytes]:
    path = tmp_path / "pack.toml"
    path.write_text(textwrap.dedent(pack).lstrip())
    return subprocess.run(
        [DISPATCH, str(path), "--state", str(tmp_path / "state"), *args],
        capture_output=True,
        timeout=120,
    )


def test_outputs_json_has_present_and_absent_results(tmp_path: Path) -> None:
    proc = dispatch(tmp_path)
    assert proc.returncode == 1, proc.stderr  # bad failed
    data = (tmp_path / "state" / "outputs.json").read_bytes()
    doc = json.loads(data)
    assert data == canon.dumps(doc)  # canonical JSON
    assert doc["total"] == 42 and doc["last"] == 7  # an epilogue's field is a run result
    assert doc["@format"] == "crucible.outputs/1" and doc["@run"] == "failed"
    absent = doc["@absent"]
    assert {k: v["reason"] for k, v in absent.items()} == {
        "broken": "failed",
        "skipped": "skipped",
    }
    assert absent["broken"]["note"] == "'bad': exited with status 3"
    assert absent["skipped"]["note"] == "'after': skipped: needs 'bad', which failed"
    assert "broken" not in doc and "skipped" not in doc
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs/schemas/outputs.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_outputs_dash_pipes_into_a_json_reader(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(PACK).lstrip())
    dispatch_proc = subprocess.Popen(
        [DISPATCH, str(pack), "--state", str(tmp_path / "state"), "--outputs", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    reader = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.load(sys.stdin)['total'])"],
        stdin=dispatch_proc.stdout,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dispatch_proc.stdout is not None
    dispatch_proc.stdout.close()
    assert dispatch_proc.wait(timeout=60) == 1
    assert reader.returncode == 0, reader.stderr
    assert reader.stdout == "42\n"


def test_outputs_dash_and_events_dash_are_a_usage_error(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, "--outputs", "-", "--events", "-")
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1
    assert not (tmp_path / "state").exists()


def test_a_pack_without_outputs_writes_no_outputs_json(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        pack='edition = 4\n[workflow]\nname = "p"\n[[workflow.task]]\nname = "a"\nrun = "true"\n',
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "state" / "outputs.json").exists()


def manifest(dest: Path) -> dict[str, Any]:
    return json.loads((dest / "@publish.json").read_bytes())  # type: ignore[no-any-return]


def test_publish_passed_and_failed_producers(tmp_path: Path) -> None:
    out = tmp_path / "published"
    proc = dispatch(tmp_path, "--publish-dir", str(out))
    assert proc.returncode == 1, proc.stderr
    reports = manifest(out / "reports")
    assert [f["path"] for f in reports["files"]] == ["a.md"]  # sub/b.md is not *.md at the top
    assert (out / "reports" / "a.md").read_text() == "# sum\n"
    entry = reports["files"][0]
    assert entry["status"] == "passed" and entry["task"] == "sum" and entry["size"] == 6
    assert entry["digest"] == "sha256:" + __import__("hashlib").sha256(b"# sum\n").hexdigest()
    # a failed producer: nothing, unless the author says settled = true
    assert manifest(out / "failed")["files"] == [] and sorted(os.listdir(out / "failed")) == [
        "@publish.json"
    ]
    settled = manifest(out / "failed-settled")
    assert [(f["path"], f["status"]) for f in settled["files"]] == [("r.md", "failed")]
    # a mapped producer: one directory per instance key
    each = manifest(out / "each")
    assert [(f["path"], f["key"]) for f in each["files"]] == [
        ("0/out.txt", "0"),
        ("1/out.txt", "1"),
    ]
    # the state dir's scratch space is empty, and nothing else is in the publish dir
    assert sorted(os.listdir(out)) == ["each", "failed", "failed-settled", "reports"]
    assert os.listdir(tmp_path / "state" / ".publish") == []
    # published files are not the run's own captured files: editing one changes nothing
    (out / "reports" / "a.md").chmod(0o644)
    (out / "reports" / "a.md").write_text("changed")
    assert (tmp_path / "state" / "files" / "sum" / "a.md").read_text() == "# sum\n"


def test_publish_dir_without_publish_table_warns(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        "--publish-dir",
        str(tmp_path / "out"),
        pack='edition = 4\n[workflow]\nname = "p"\n[[workflow.task]]\nname = "a"\nrun = "true"\n',
    )
    assert proc.returncode == 0
    assert b"no [workflow.publish]" in proc.stderr


def test_publish_refuses_a_symlink_in_the_way(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "reports").symlink_to(elsewhere)
    proc = dispatch(tmp_path, "--publish-dir", str(out))
    assert proc.returncode == 3
    assert proc.stderr.decode().count("\n") == 1 and b"symlink" in proc.stderr
    assert os.listdir(elsewhere) == []


BIG = """
edition = 4
[workflow]
name = "big"
[workflow.publish]
"many" = "gen:d/*"
[[workflow.task]]
name = "gen"
emits_files = ["d/*"]
run = 'mkdir d; i=0; while [ $i -lt 3000 ]; do echo $i > d/f$i; i=$((i+1)); done'
"""


@pytest.mark.slow
def test_a_crash_during_publish_leaves_no_half_directory(tmp_path: Path) -> None:
    """SIGKILL the dispatcher while it publishes 3,000 files: the destination is then
    absent or whole (every file its manifest lists, nothing else), and the next
    publish (a resume) completes and leaves no scratch behind."""
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(BIG).lstrip())
    state, out = tmp_path / "state", tmp_path / "out"
    proc = start_dispatch(pack, state, "--publish-dir", str(out))
    scratch = state / ".publish"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if scratch.is_dir() and os.listdir(scratch):
            time.sleep(0.05)  # well inside the 3,000 files
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL  # it was still publishing
    dest = out / "many"
    if dest.exists():  # the kill came after the rename: whole
        listed = {f["path"] for f in manifest(dest)["files"]}
        assert len(listed) == 3000
        assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == (
            listed | {"@publish.json"}
        )
    assert [e for e in os.listdir(out) if e != "many"] == [] if out.exists() else True
    again = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "--resume", "--publish-dir", str(out)],
        capture_output=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert len(manifest(dest)["files"]) == 3000
    assert os.listdir(scratch) == [] and os.listdir(out) == ["many"]


def test_outputs_file_and_fifo(tmp_path: Path) -> None:
    import threading

    proc = dispatch(tmp_path, "--outputs", str(tmp_path / "copy.json"))
    assert proc.returncode == 1
    assert (tmp_path / "copy.json").read_bytes() == (
        tmp_path / "state" / "outputs.json"
    ).read_bytes()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    path = tmp_path / "pack.toml"
    proc2 = subprocess.run(
        [DISPATCH, str(path), "--state", str(tmp_path / "s2"), "--outputs", str(fifo)],
        capture_output=True,
        timeout=120,
    )
    reader.join(30)
    assert proc2.returncode == 1, proc2.stderr
    assert json.loads(got[0])["total"] == 42 and fifo.is_fifo()
