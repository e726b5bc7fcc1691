"""Semantics: memo -> ledger -> execute, settled facts only, replay visibility,
never failing the caller (quarantine, failed appends)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from crucible.ledger import Ledger, Outcome, Reply
from crucible.ledger._record import encode_line, make_record

from ._unprivileged import Finished, run_unprivileged, shared_tempdir
from .conftest import Warnings


class Body:
    """A step body that counts its executions."""

    def __init__(self, result: object) -> None:
        self.result = result
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        return self.result


def test_miss_executes_records_and_replays_with_cached(ledger_dir: Path) -> None:
    body = Body({"digest": "sha256:ab"})
    with Ledger(ledger_dir) as ledger:
        first = ledger.step("broker", "build:1", body)
        assert body.calls == 1
        assert first == Reply("broker", "build:1", "ok", {"digest": "sha256:ab"})
        # an ordinary reply is unchanged: no "cached" key at all
        assert first.to_json() == {
            "scope": "broker",
            "step": "build:1",
            "status": "ok",
            "value": {"digest": "sha256:ab"},
        }
        again = ledger.step("broker", "build:1", body)  # memo
        assert body.calls == 1 and again.cached and again.value == first.value
    with Ledger(ledger_dir) as ledger:  # a restart: the ledger replays
        replay = ledger.step("broker", "build:1", body)
        assert body.calls == 1
        assert replay.cached and replay.to_json()["cached"] is True
        assert replay.value == {"digest": "sha256:ab"}


def test_ledger_hit_rehydrates_the_memo(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.step("s", "a", Body(1))
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "a") is not None
        # once in the memo, the file is no longer consulted
        (ledger_dir / "steps.jsonl").unlink()
        os.close(ledger._read_fd)  # type: ignore[arg-type]
        ledger._read_fd = None
        hit = ledger.lookup("s", "a")
        assert hit is not None and hit.value == 1 and hit.cached


def test_scope_is_part_of_identity(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.step("one", "x", Body(1))
        body = Body(2)
        assert ledger.step("two", "x", body).value == 2 and body.calls == 1


def test_deterministic_failure_is_recorded_and_replayed(ledger_dir: Path) -> None:
    body = Body(Outcome.failed({"error": "compile error at a.c:3"}))
    with Ledger(ledger_dir) as ledger:
        reply = ledger.step("s", "build", body)
        assert reply.status == "failed" and not reply.cached
    with Ledger(ledger_dir) as ledger:
        replay = ledger.step("s", "build", body)
        assert replay.status == "failed" and replay.cached and body.calls == 1


def test_transient_failures_and_exceptions_are_never_recorded(ledger_dir: Path) -> None:
    flaky = Body(Outcome.transient({"error": "timed out"}))

    def explode() -> object:
        raise TimeoutError("transport")

    with Ledger(ledger_dir) as ledger:
        assert ledger.step("s", "measure", flaky).value == {"error": "timed out"}
        assert ledger.step("s", "measure", flaky).value == {"error": "timed out"}
        assert flaky.calls == 2  # not even memoized
        with pytest.raises(TimeoutError):
            ledger.step("s", "other", explode)
    with Ledger(ledger_dir) as ledger:
        assert len(ledger) == 0
    assert not (ledger_dir / "steps.jsonl").exists()


def test_latest_record_of_an_identity_wins(ledger_dir: Path) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.record("s", "x", Outcome.ok(1))
        ledger.record("s", "x", Outcome.ok(2))
    with Ledger(ledger_dir) as ledger:
        assert ledger.report.summary.duplicates == 1
        hit = ledger.lookup("s", "x")
        assert hit is not None and hit.value == 2


def test_value_outside_canonical_domain_is_returned_unrecorded(
    ledger_dir: Path, warnings: Warnings
) -> None:
    with Ledger(ledger_dir, warn=warnings) as ledger:
        reply = ledger.step("s", "big", Body({"n": 2**60}))
        assert reply.value == {"n": 2**60}
    assert any("cannot be recorded" in w for w in warnings)
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "big") is None


def test_missing_directory_is_created_by_the_library(tmp_path: Path) -> None:
    with Ledger(tmp_path / "a" / "b") as ledger:
        ledger.step("s", "x", Body(1))
    assert (tmp_path / "a" / "b" / "steps.jsonl").is_file()


def test_damaged_record_at_lookup_degrades_to_execute(ledger_dir: Path, warnings: Warnings) -> None:
    with Ledger(ledger_dir) as ledger:
        ledger.step("s", "x", Body(1))
    with Ledger(ledger_dir, warn=warnings) as ledger:
        # corrupt the bytes after the index was built
        path = ledger_dir / "steps.jsonl"
        data = bytearray(path.read_bytes())
        data[40] ^= 0x01
        with open(path, "r+b") as f:
            f.write(bytes(data))
        body = Body(5)
        assert ledger.step("s", "x", body).value == 5 and body.calls == 1
    assert any("damaged" in w for w in warnings)


# -- quarantine ------------------------------------------------------------------


def _quarantined(directory: Path) -> list[Path]:
    return sorted(directory.glob("steps.jsonl.quarantine-*"))


def test_garbage_file_is_quarantined_kept_and_a_fresh_ledger_begun(
    ledger_dir: Path, warnings: Warnings
) -> None:
    garbage = b'{"not": "a ledger"}\n\x00\xff binary junk\n'
    (ledger_dir / "steps.jsonl").write_bytes(garbage)
    with Ledger(ledger_dir, warn=warnings) as ledger:
        assert ledger.report.quarantined is not None
        body = Body(1)
        assert ledger.step("s", "x", body).value == 1 and body.calls == 1
    [aside] = _quarantined(ledger_dir)
    assert aside.read_bytes() == garbage
    assert any("quarantined" in w and aside.name in w for w in warnings)
    with Ledger(ledger_dir) as ledger:
        assert ledger.lookup("s", "x") is not None


def test_a_directory_in_place_of_the_file_is_quarantined(
    ledger_dir: Path, warnings: Warnings
) -> None:
    (ledger_dir / "steps.jsonl").mkdir()
    (ledger_dir / "steps.jsonl" / "keep").write_text("kept")
    with Ledger(ledger_dir, warn=warnings) as ledger:
        assert ledger.step("s", "x", Body(1)).value == 1
    [aside] = _quarantined(ledger_dir)
    assert (aside / "keep").read_text() == "kept"
    assert (ledger_dir / "steps.jsonl").is_file()
    assert "not a regular file" in warnings[0]


def test_a_fifo_in_place_of_the_file_is_quarantined_without_hanging(
    ledger_dir: Path, warnings: Warnings
) -> None:
    os.mkfifo(ledger_dir / "steps.jsonl")
    with Ledger(ledger_dir, warn=warnings) as ledger:
        assert ledger.report.quarantined is not None
        assert ledger.step("s", "x", Body(1)).value == 1
    assert stat.S_ISFIFO(os.stat(_quarantined(ledger_dir)[0]).st_mode)


def test_readonly_open_never_quarantines(ledger_dir: Path, warnings: Warnings) -> None:
    (ledger_dir / "steps.jsonl").write_bytes(b"junk\n")
    with Ledger(ledger_dir, readonly=True, warn=warnings) as ledger:
        assert ledger.report.quarantined is None and len(ledger) == 0
    assert (ledger_dir / "steps.jsonl").read_bytes() == b"junk\n"
    assert not _quarantined(ledger_dir)


def test_torn_tail_alone_is_not_quarantined(ledger_dir: Path, warnings: Warnings) -> None:
    (ledger_dir / "steps.jsonl").write_bytes(encode_line(make_record("s", "x", "ok", 1))[:30])
    with Ledger(ledger_dir, warn=warnings) as ledger:
        assert ledger.report.quarantined is None and ledger.report.summary.torn_tail
    assert "torn tail" in warnings[0]


# -- as another user: unreadable file, read-only directory ----------------------


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    d = shared_tempdir()
    try:
        yield d
    finally:
        for p in [d, *d.rglob("*")]:
            if not p.is_symlink():
                p.chmod(0o755 if p.is_dir() else 0o644)
        subprocess.run(["rm", "-rf", str(d)], check=True)


def _step_in_child(directory: Path, step: str) -> Finished:
    def body() -> int:
        with Ledger(directory) as ledger:  # default warn: the child's stderr
            reply = ledger.step("s", step, lambda: {"real": step})
            print(json.dumps(reply.to_json()), ledger.report.quarantined is not None)
        return 0

    return run_unprivileged(body)


def test_read_only_directory_append_fails_value_still_returned(shared_tmp: Path) -> None:
    d = shared_tmp / "ro"
    d.mkdir()
    with Ledger(d) as ledger:
        ledger.record("s", "old", Outcome.ok("recorded before"))
    before = (d / "steps.jsonl").read_bytes()
    (d / "steps.jsonl").chmod(0o444)
    d.chmod(0o555)
    done = _step_in_child(d, "new")
    assert done.code == 0, done.stderr
    assert done.stdout.strip() == (
        '{"scope": "s", "step": "new", "status": "ok", "value": {"real": "new"}} False'
    )
    assert "cannot append" in done.stderr and "new not recorded" in done.stderr
    # the old record still replays, and nothing in the ledger changed
    old = _step_in_child(d, "old")
    assert '"cached": true' in old.stdout and "recorded before" in old.stdout
    assert (d / "steps.jsonl").read_bytes() == before


def test_unreadable_file_is_quarantined_and_fresh_ledger_begun(shared_tmp: Path) -> None:
    d = shared_tmp / "rw"
    d.mkdir()
    d.chmod(0o777)
    with Ledger(d) as ledger:
        ledger.record("s", "x", Outcome.ok("secret"))
    os.chmod(d / "steps.lock", 0o666)
    (d / "steps.jsonl").chmod(0o000)
    done = _step_in_child(d, "x")
    assert done.code == 0, done.stderr
    # the record could not be read, so the work ran for real; the file was set aside
    assert '"value": {"real": "x"}} True' in done.stdout
    assert "Permission denied" in done.stderr and "quarantined as" in done.stderr
    [aside] = _quarantined(d)
    assert b"secret" in aside.read_bytes()
    with Ledger(d) as ledger:
        hit = ledger.lookup("s", "x")
        assert hit is not None and hit.value == {"real": "x"}


def test_on_replay_runs_once_per_ledger_hit_to_restore_caller_state(ledger_dir: Path) -> None:
    provenance: set[str] = set()

    def build() -> dict[str, str]:
        provenance.add("sha256:aa")  # what a real build registers
        return {"digest": "sha256:aa"}

    def restore(reply: Reply) -> None:
        provenance.add(reply.value["digest"])

    with Ledger(ledger_dir) as ledger:
        ledger.step("broker", "build", build, on_replay=restore)
    provenance.clear()  # a restart: in-memory state is gone
    seen: list[Reply] = []

    def seen_and_restored(reply: Reply) -> None:
        seen.append(reply)
        restore(reply)

    with Ledger(ledger_dir) as ledger:
        ledger.step("broker", "build", build, on_replay=seen_and_restored)
        ledger.step("broker", "build", build, on_replay=seen_and_restored)
    assert provenance == {"sha256:aa"} and len(seen) == 1  # the memo hit did not re-run it


@pytest.mark.parametrize(("scope", "step"), [("", "x"), ("s", ""), (None, "x"), ("s", 1)])
def test_empty_or_non_string_identity_is_a_programming_error(
    ledger_dir: Path, scope: object, step: object
) -> None:
    with Ledger(ledger_dir) as ledger, pytest.raises(ValueError, match="non-empty strings"):
        ledger.step(scope, step, Body(1))  # type: ignore[arg-type]
    assert not (ledger_dir / "steps.jsonl").exists()
