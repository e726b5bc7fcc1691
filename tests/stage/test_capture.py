from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core import canon, digest
from crucible.core.errors import InputRefused
from crucible.stage import StateDir, load_result
from tests.packed import keyed
from tests.stage.stageplans import plan, settle, task


def _v(version: int, **kw: object) -> dict:  # type: ignore[type-arg]
    return plan(task("p", emits={"n": "integer", "s": "string"}, **kw), version=version)  # type: ignore[arg-type]


def test_pass_records_output_and_sizes(state: Path) -> None:
    p = _v(2)
    rec = settle(p, state, "p", {"n": 3, "s": "hi", "extra": [1]})
    assert rec["status"] == "passed" and rec["note"] == "" and rec["retryable"] is False
    assert rec["output"] == {"n": 3, "s": "hi", "extra": [1]}
    assert rec["emit_sizes"] == {"n": 1, "s": 4}
    assert rec["emit_cap"] == 65536 and rec["exit_code"] == 0 and rec["attempt"] == 1
    assert load_result(state, "p") == rec
    assert (state / "results" / "p.json").read_bytes() == canon.dumps(rec)


@pytest.mark.parametrize(
    ("output", "fragment"),
    [
        (None, "no result file"),
        (b"[1, 2]", "is a JSON array, not an object"),
        (b'{"n": 1, "n": 2, "s": ""}', "holds JSON crucible does not accept: duplicate object key"),
        (b"{not json", "not valid JSON"),
        ({"n": 1}, "declared field 's' is missing"),
        ({"n": "1", "s": "x"}, "declared field 'n' is a JSON string, not integer"),
        ({"n": 1.5, "s": "x"}, "declared field 'n' is a JSON number, not integer"),
        ({"n": True, "s": "x"}, "declared field 'n' is a JSON boolean, not integer"),
    ],
)
def test_task_faults_settle_failed_and_retryable(
    state: Path, output: object, fragment: str
) -> None:
    rec = settle(_v(1), state, "p", output)
    assert rec["status"] == "failed"
    assert fragment in rec["note"]
    assert rec["retryable"] is True
    assert load_result(state, "p") == rec


def test_integral_float_is_an_integer(state: Path) -> None:
    assert settle(_v(1), state, "p", b'{"n": 2.0, "s": ""}')["status"] == "passed"


def test_no_result_file_is_fine_when_nothing_is_declared(state: Path) -> None:
    p = plan(task("q"))
    assert settle(p, state, "q", None)["status"] == "passed"


def test_nonzero_exit_retains_parsed_output_without_type_checks(state: Path) -> None:
    rec = settle(_v(1), state, "p", {"n": "wrong"}, exit_code=4)
    assert rec["status"] == "failed" and rec["note"] == "exited with status 4"
    assert rec["retryable"] is True and rec["output"] == {"n": "wrong"}


def test_cap_over_is_a_measured_failure_naming_field_size_cap_and_emits_files(state: Path) -> None:
    p = plan(task("p", emits={"blob": "string", "ok": "integer"}), version=2)
    rec = settle(p, state, "p", {"blob": "x" * 100, "ok": 1, "undeclared": "y" * 500}, emit_cap=50)
    assert rec["status"] == "failed" and rec["retryable"] is False
    note = rec["note"]
    assert "'blob'" in note and "102 bytes" in note and "50 bytes" in note and "emits_files" in note
    assert rec["over_cap"] == [{"field": "blob", "size": 102, "cap": 50}]
    # the oversized declared field never reaches a record; the undeclared one is uncapped
    assert "blob" not in rec["output"] and rec["output"]["undeclared"] == "y" * 500


def test_cap_boundary_is_inclusive(state: Path) -> None:
    p = plan(task("p", emits={"blob": "string"}), version=2)
    assert settle(p, state, "p", {"blob": "x" * 48}, emit_cap=50)["status"] == "passed"
    assert settle(p, state, "p", {"blob": "x" * 49}, emit_cap=50)["status"] == "failed"


def test_cap_does_not_apply_below_edition_3(state: Path) -> None:
    p = plan(task("p", emits={"blob": "string"}), version=1)
    rec = settle(p, state, "p", {"blob": "x" * 100}, emit_cap=50)
    assert rec["status"] == "passed" and rec["emit_cap"] is None and rec["output"]["blob"]


def test_emits_files_literal_glob_and_directory(state: Path) -> None:
    p = plan(task("p", emits_files=["report.txt", "out/*.csv", "tree", "logs/**/*.log"]))
    files = {
        "report.txt": b"r",
        "out/a.csv": b"a",
        "out/b.txt": b"no",
        "tree/x/y.bin": b"yy",
        "logs/1.log": b"1",
        "logs/d/e/2.log": b"22",
        "unrelated": b"u",
    }
    rec = settle(p, state, "p", None, files=files)
    assert rec["status"] == "passed", rec["note"]
    got = {f["path"]: f["size"] for f in rec["files"]}
    assert got == {
        "report.txt": 1,
        "out/a.csv": 1,
        "tree/x/y.bin": 2,
        "logs/1.log": 1,
        "logs/d/e/2.log": 2,
    }
    root = state / "files" / "p"
    assert (root / "tree" / "x" / "y.bin").read_bytes() == b"yy"
    assert not (root / "unrelated").exists() and not (root / "out" / "b.txt").exists()
    assert sorted(os.listdir(state / "files")) == ["p"]  # no temp left behind


def test_missing_literal_fails_a_passing_attempt(state: Path) -> None:
    rec = settle(plan(task("p", emits_files=["r.txt"])), state, "p", None)
    assert rec["status"] == "failed" and "'r.txt' was not written" in rec["note"]
    assert rec["retryable"] is True and rec["files_captured"] is False


def test_symlink_outside_workspace_is_refused(state: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    p = plan(task("p", emits_files=["out"]))
    ws = state / "work" / "p"
    (ws / "out").mkdir(parents=True)
    (ws / "out" / "leak").symlink_to(secret)
    rec = StateDir(p, state).capture("p", ws, output_file=ws / "none", exit_code=0)
    assert rec["status"] == "failed" and rec["retryable"] is False
    assert "outside the workspace" in rec["note"]
    assert not (state / "files" / "p").exists()


def test_symlinked_parent_directory_outside_is_refused(state: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("x")
    ws = state / "work" / "p"
    ws.mkdir(parents=True)
    (ws / "out").symlink_to(outside)
    for pattern in ("out/x.txt", "out/*.txt"):
        p = plan(task("p", emits_files=[pattern]))
        rec = StateDir(p, state).capture("p", ws, output_file=ws / "none", exit_code=0)
        assert rec["status"] == "failed" and "outside the workspace" in rec["note"], pattern


def test_symlink_inside_workspace_is_copied_as_a_file(state: Path) -> None:
    ws = state / "work" / "p"
    (ws / "out").mkdir(parents=True)
    (ws / "real.txt").write_text("content")
    (ws / "out" / "link").symlink_to("../real.txt")
    rec = StateDir(plan(task("p", emits_files=["out"])), state).capture(
        "p", ws, output_file=ws / "n", exit_code=0
    )
    assert rec["status"] == "passed"
    captured = state / "files" / "p" / "out" / "link"
    assert not captured.is_symlink() and captured.read_text() == "content"


def test_symlink_loop_is_refused(state: Path) -> None:
    ws = state / "work" / "p"
    (ws / "out").mkdir(parents=True)
    (ws / "out" / "loop").symlink_to("..")
    rec = StateDir(plan(task("p", emits_files=["out"])), state).capture(
        "p", ws, output_file=ws / "n", exit_code=0
    )
    assert rec["status"] == "failed" and "loop" in rec["note"]


@pytest.mark.parametrize("pattern", ["../x", "a/../../x", "/etc/passwd", "", ".", "a\\b"])
def test_climbing_or_absolute_patterns_are_plan_errors(state: Path, ws: Path, pattern: str) -> None:
    p = plan(task("p", emits_files=[pattern]))
    with pytest.raises(InputRefused):
        StateDir(p, state).capture("p", ws, output_file=ws / "n", exit_code=0)
    assert not (state / "results").exists()


def test_files_over_the_bound_fail_measured(state: Path) -> None:
    p = plan(task("p", emits_files=["big"]))
    ws = state / "work" / "p"
    ws.mkdir(parents=True)
    (ws / "big").write_bytes(b"x" * 100)
    rec = StateDir(p, state).capture("p", ws, output_file=ws / "n", exit_code=0, files_max=99)
    assert rec["status"] == "failed" and rec["retryable"] is False and "99 bytes" in rec["note"]


def test_a_retry_replaces_the_earlier_attempts_files(state: Path) -> None:
    p = plan(task("p", emits_files=["out/*"]))
    settle(p, state, "p", None, files={"out/a": b"1"})
    ws = state / "work" / "p"
    (ws / "out" / "a").unlink()
    (ws / "out" / "b").write_bytes(b"2")
    rec = StateDir(p, state).capture("p", ws, output_file=ws / "n", exit_code=0, attempt=2)
    assert rec["attempt"] == 2
    assert sorted(os.listdir(state / "files" / "p" / "out")) == ["b"]


def test_instance_files_go_under_the_escaped_key(state: Path) -> None:
    p = plan(
        task("src", emits={"xs": "object"}),
        task("m", needs=["src"], map="src.xs", emits_files=["o"]),
    )
    settle(p, state, "src", {"xs": {"a/../../x": 1}})
    rec = settle(p, state, "m", None, key="a/../../x", files={"o": b"o"})
    assert rec["key"] == "a/../../x"
    assert (state / "files" / "m" / "a%2F%2E%2E%2F%2E%2E%2Fx" / "o").read_bytes() == b"o"
    assert "a/../../x" in keyed(state, "m")
    assert not (state / "results" / "m").exists()  # packed: results/m.jsonl


def test_plan_state_mismatches_raise_before_writing(state: Path, ws: Path) -> None:
    p = plan(task("p"), task("m", needs=["p"], map="p.xs"))
    for kwargs in ({"task": "nope"}, {"task": "p", "key": "k"}, {"task": "m"}):
        with pytest.raises(InputRefused):
            StateDir(p, state).capture(workspace=ws, output_file=ws / "x", exit_code=0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InputRefused, match="workspace"):
        StateDir(p, state).capture("p", ws / "missing", output_file=ws / "x", exit_code=0)
    assert not (state / "results").exists()


def test_extra_is_kept_and_must_be_an_object(state: Path, ws: Path) -> None:
    p = plan(task("p"))
    rec = StateDir(p, state).capture("p", ws, output_file=ws / "n", exit_code=0, extra={"ms": 5})
    assert rec["extra"] == {"ms": 5}
    with pytest.raises(InputRefused):
        StateDir(p, state).capture("p", ws, output_file=ws / "n", exit_code=0, extra=[1])  # type: ignore[arg-type]


def test_a_root_glob_does_not_capture_staged_inputs(state: Path) -> None:
    p = plan(task("p", emits_files=["**"]))
    rec = settle(p, state, "p", None, files={"inputs/x/staged": b"s", "mine/a": b"a", "b": b"b"})
    paths = {f["path"] for f in rec["files"]}
    assert "inputs/x/staged" not in paths and {"mine/a", "b"} <= paths
    p2 = plan(task("p", emits_files=["inputs/x/staged"]))
    assert settle(p2, state, "p", None)["files"] == [
        {"path": "inputs/x/staged", "size": 1, "digest": digest.of_bytes(b"s")}
    ]


def test_capture_refuses_a_key_the_map_does_not_have(state: Path, ws: Path) -> None:
    p = plan(task("src", emits={"xs": "array"}), task("m", needs=["src"], map="src.xs"))
    settle(p, state, "src", {"xs": ["a"]})
    with pytest.raises(InputRefused, match="no instance '1'"):
        StateDir(p, state).capture("m", ws, output_file=ws / "n", exit_code=0, key="1")
    assert not (state / "results" / "m.jsonl").exists()


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_followed(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crucible.stage import _files

    secret = tmp_path / "secret"
    secret.write_text("SECRET")
    ws = state / "work" / "p"
    ws.mkdir(parents=True)
    (ws / "out").write_text("fine")
    real_copy_file = _files._Copier._copy_file

    def swap_then_copy(
        self: _files._Copier, rel: str, real: str, target: Path
    ) -> dict[str, object]:
        os.unlink(real)  # the race: after the realpath check, before the open
        os.symlink(secret, real)
        return real_copy_file(self, rel, real, target)

    monkeypatch.setattr(_files._Copier, "_copy_file", swap_then_copy)
    rec = StateDir(plan(task("p", emits_files=["out"])), state).capture(
        "p", ws, output_file=ws / "n", exit_code=0
    )
    assert rec["status"] == "failed" and rec["retryable"] is False and "'out'" in rec["note"]
    assert not (state / "files" / "p").exists()


def test_an_opened_file_outside_the_workspace_is_refused(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crucible.stage import _files

    monkeypatch.setattr(_files, "_opened_path", lambda fd: "/etc/passwd")
    rec = settle(plan(task("p", emits_files=["f"])), state, "p", None, files={"f": b"x"})
    assert rec["status"] == "failed" and "changed while it was captured" in rec["note"]
