"""A recording run's cache records are appended by the dispatcher, a batch at a
time, once the units' records are durable (docs/spec/cache.md, "Hit, miss, and
what is recorded"): workers store the files and encode the ledger line, and the
session log's writer thread appends the lines of each group-commit batch with
one write and one fsync (Ledger.append_encoded)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from crucible.core.errors import OperationalError
from crucible.run.session import _log as session
from crucible.run.session import events
from tests.run.cachetests import Traced, live_units, traced_dispatch


def _pack(tmp_path: Path, n: int) -> Path:
    body = "".join(
        f'[[workflow.task]]\nname = "t{i}"\nrun = \'printf "{{}}" > "$CRUCIBLE_OUTPUT"\'\n'
        for i in range(n)
    )
    body += '[[workflow.task]]\nname = "m"\nmap = ["a", "b", "c"]\nrun = "true"\n'
    pack = tmp_path / "pack.toml"
    pack.write_text('edition = 4\n\n[workflow]\nname = "rec"\n\n' + body)
    return pack


def _dispatch(tmp_path: Path, pack: Path, state: str, cache: Path) -> Traced:
    traced = traced_dispatch(
        tmp_path / f"trace-{state}.txt",
        pack, "--state", tmp_path / state, "-j", "2", "--cache", cache,
        timeout=300,
    )  # fmt: skip
    assert "warning" not in traced.done.stderr, traced.done.stderr
    return traced


def test_the_dispatcher_appends_the_workers_cache_records_in_batches(tmp_path: Path) -> None:
    pack = _pack(tmp_path, 40)
    cache = tmp_path / "cache"
    traced = _dispatch(tmp_path, pack, "rec", cache)
    ledger = [f for f in traced.fsyncs if f.path.endswith("/cache/steps.jsonl")]
    assert ledger and all(f.pid == traced.dispatcher for f in ledger)
    assert len(ledger) < 43  # 43 units: batched, not one fsync each
    assert live_units(cache) == sorted(
        [(f"t{i}", None) for i in range(40)] + [("m", k) for k in ("0", "1", "2")]
    )
    # and every one of them hits
    assert not [f for f in _dispatch(tmp_path, pack, "hit", cache).fsyncs if "/work/" in f.path]
    events = (tmp_path / "hit" / "session.jsonl").read_text()
    assert events.count('"cached":true') == 43


def test_after_durable_items_reach_the_callback_once_their_batch_is_on_disk(
    tmp_path: Path,
) -> None:
    path = tmp_path / "session.jsonl"
    log = session.SessionLog(path, 1)
    seen: list[tuple[list[Any], bytes]] = []
    closed: list[bool] = []
    log.on_batch_durable = lambda items: seen.append((items, path.read_bytes()))
    log.on_close = lambda: closed.append(not log._writer.is_alive())
    log.emit(events.task_finished(task="a", status="passed", note=None))
    log.after_durable("fact-a")
    log.commit()
    log.emit(events.task_finished(task="b", status="passed", note=None))
    log.after_durable("fact-b")
    log.after_durable("fact-c")
    log.close()
    items = [item for batch, _ in seen for item in batch]
    assert items == ["fact-a", "fact-b", "fact-c"]
    for batch, on_disk in seen:  # the lines of its batch were written first
        for item in batch:
            task = {"fact-a": "a", "fact-b": "b", "fact-c": "b"}[item]
            assert f'"task":"{task}"'.encode() in on_disk
    assert closed == [True]


def test_no_item_reaches_the_callback_when_its_batch_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(session, "_fsync", failing)
    log = session.SessionLog(tmp_path / "session.jsonl", 1)
    seen: list[Any] = []
    log.on_batch_durable = seen.append
    log.emit(events.task_finished(task="a", status="passed", note=None))
    log.after_durable("fact-a")
    with pytest.raises(OperationalError):
        log.close()
    assert seen == []


def test_a_failing_callback_is_a_warning_and_the_log_goes_on(tmp_path: Path) -> None:
    warned: list[str] = []
    log = session.SessionLog(tmp_path / "session.jsonl", 1, on_warning=warned.append)

    def broken(items: list[Any]) -> None:
        raise RuntimeError("boom")

    log.on_batch_durable = broken
    log.after_durable("x")
    log.commit()
    log.emit(events.shutdown(reason="completed", exit_code=0))
    log.close()
    assert b'"event":"shutdown"' in (tmp_path / "session.jsonl").read_bytes()
    assert warned and "boom" in warned[0]
