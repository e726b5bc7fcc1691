"""``--publish-dir`` never removes what crucible did not publish (issue 27 item
11): a destination holding a user's file, or a user's regular file where a
destination goes, is refused up front with the files untouched; an earlier
publication (its ``@publish.json`` lists it whole) is still replaced; and a
non-directory left under a scratch name never wedges later publishes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

PACK = """\
edition = 4
[workflow]
name = "pub"
[workflow.publish]
"out/sub" = "a:*.txt"
[[workflow.task]]
name = "a"
emits_files = ["*.txt"]
run = 'echo one > one.txt; echo two > two.txt'
"""


def _run(
    tmp_path: Path, pd: Path, *args: str, state: str = "state"
) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK)
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / state), "--publish-dir", str(pd), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_users_file_in_a_destination_is_refused_and_kept(tmp_path: Path) -> None:
    pd = tmp_path / "PD"
    (pd / "out" / "sub").mkdir(parents=True)
    thesis = pd / "out" / "sub" / "thesis.tex"
    thesis.write_text("years of work\n")
    done = _run(tmp_path, pd)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "thesis.tex" in done.stderr, done.stderr
    assert thesis.read_text() == "years of work\n"
    assert not (tmp_path / "state" / "plan.json").exists()  # refused before the claim


def test_a_users_regular_file_where_a_destination_goes_is_refused_and_kept(
    tmp_path: Path,
) -> None:
    pd = tmp_path / "PD"
    (pd / "out").mkdir(parents=True)
    mine = pd / "out" / "sub"
    mine.write_text("mine\n")
    done = _run(tmp_path, pd)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "not a directory" in done.stderr, done.stderr
    assert mine.read_text() == "mine\n"
    # once it is moved away, the same command publishes
    mine.rename(tmp_path / "moved")
    again = _run(tmp_path, pd)
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(pd / "out" / "sub")) == ["@publish.json", "one.txt", "two.txt"]


def test_a_file_in_the_way_of_a_destination_is_refused(tmp_path: Path) -> None:
    pd = tmp_path / "PD"
    pd.mkdir()
    (pd / "out").write_text("mine\n")
    done = _run(tmp_path, pd)
    assert done.returncode == 2 and "in the way" in done.stderr, done.stderr
    assert (pd / "out").read_text() == "mine\n"


def test_an_earlier_publication_is_replaced_but_an_added_file_is_not(tmp_path: Path) -> None:
    pd = tmp_path / "PD"
    first = _run(tmp_path, pd)
    assert first.returncode == 0, first.stderr
    dest = pd / "out" / "sub"
    manifest = json.loads((dest / "@publish.json").read_text())
    assert {f["path"] for f in manifest["files"]} == {"one.txt", "two.txt"}
    again = _run(tmp_path, pd, state="state2")  # replaces our own publication
    assert again.returncode == 0, again.stderr
    (dest / "notes.md").write_text("added by hand\n")
    third = _run(tmp_path, pd, state="state3")
    assert third.returncode == 2 and "notes.md" in third.stderr, third.stderr
    assert (dest / "notes.md").read_text() == "added by hand\n"


def test_a_file_under_a_scratch_name_does_not_wedge_later_publishes(tmp_path: Path) -> None:
    pd = tmp_path / "PD"
    first = _run(tmp_path, pd)
    assert first.returncode == 0, first.stderr
    scratch = tmp_path / "state" / ".publish"
    scratch.mkdir(exist_ok=True)
    (scratch / ".crucible-old-1-abcdefgh").write_text("left by a crash\n")
    again = _run(tmp_path, pd, "--resume")
    assert again.returncode == 0, again.stderr
    assert os.listdir(scratch) == []
