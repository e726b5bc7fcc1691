"""A hit of a plain unit lays its record as a hard link to the store's copy of
the restored bytes (docs/spec/cache.md, "Store layout"): no new inode, nothing
written. The bytes are the ones the write path would write; a store copy that
is missing or altered, or a link that cannot be made, falls back to writing the
record (never a miss); ``cache gc`` keeps the copies live records name."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon, digest
from crucible.run import RunOptions
from crucible.run.cache._store import RESTORED, TaskCache, restored_record
from crucible.run.session._runner import run_plan
from tests.run.cachetests import Runner, live_values

PACK = """edition = 4

[workflow]
name = "link"

[[workflow.task]]
name = "a"
env = ["COUNT"]
emits = { n = "integer" }
run = 'echo a >> "$COUNT"; echo "{\\"n\\": 7}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "m"
needs = ["a"]
env = ["COUNT"]
map = ["x", "y"]
run = 'echo m >> "$COUNT"'
"""


def _store(cache: Path, d: str) -> Path:
    hexd = d.split(":", 1)[1]
    return cache / "files" / "sha256" / hexd[:2] / hexd[2:]


def _plain_value(cache: Path, task: str) -> dict[str, Any]:
    (value,) = [
        v for v in live_values(cache) if v["record"]["task"] == task and "key" not in v["record"]
    ]
    return value


def test_a_plain_hit_is_a_hard_link_to_the_stores_copy_of_its_bytes(tmp_path: Path) -> None:
    r = Runner(tmp_path, PACK)
    assert r.run()[0] == ["a", "m", "m"]
    assert r.run()[0] == []
    value = _plain_value(r.cache, "a")
    stored = _store(r.cache, value[RESTORED])
    record = r.state(2) / "results" / "a.json"
    assert os.stat(record).st_ino == os.stat(stored).st_ino
    # the bytes the write path writes: the record as captured, attempt 1, cached, key
    restored = json.loads(record.read_bytes())
    assert restored["cached"] is True and restored["attempt"] == 1
    assert record.read_bytes() == canon.dumps(
        {**value["record"], "attempt": 1, "cached": True, "cache_key": restored["cache_key"]}
    )
    assert digest.of_file(record) == value[RESTORED]
    # keyed units (m's instances) are lines of m.jsonl, and name no store copy
    assert not [v for v in live_values(r.cache) if "key" in v["record"] and RESTORED in v]


def test_an_altered_store_copy_is_not_linked_the_record_is_written(tmp_path: Path) -> None:
    r = Runner(tmp_path, PACK)
    r.run()
    value = _plain_value(r.cache, "a")
    stored = _store(r.cache, value[RESTORED])
    os.chmod(stored, 0o644)
    stored.write_bytes(stored.read_bytes().replace(b'"n":7', b'"n":8'))
    ran, proc = r.run()
    assert ran == []  # still a hit: the record comes from the ledger
    record = r.state(2) / "results" / "a.json"
    assert os.stat(record).st_ino != os.stat(stored).st_ino
    assert json.loads(record.read_bytes())["output"] == {"n": 7}
    assert digest.of_file(record) == value[RESTORED]
    assert b"warning" not in proc.stderr
    # a later recording of the same bytes puts them back
    tc = TaskCache(r.cache, warn=lambda _w: None)
    assert tc._put_restored(record.read_bytes()) == value[RESTORED]
    assert digest.of_file(stored) == value[RESTORED]


def test_a_missing_store_copy_falls_back_to_writing(tmp_path: Path) -> None:
    r = Runner(tmp_path, PACK)
    r.run()
    value = _plain_value(r.cache, "a")
    _store(r.cache, value[RESTORED]).unlink()
    ran, _ = r.run()
    assert ran == []
    assert digest.of_file(r.state(2) / "results" / "a.json") == value[RESTORED]


def test_links_that_fail_fall_back_to_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = Runner(tmp_path, PACK)
    r.run()

    def no_link(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", no_link)
    r.count.write_text("")
    state = tmp_path / "inproc"
    options = RunOptions(plan=r.pack, state=state, cache=r.cache, backoff=0.01)
    outcome = run_plan(options, environ=r.env())
    assert outcome.status == "passed"
    assert r.count.read_text() == ""  # nothing ran
    value = _plain_value(r.cache, "a")
    record = state / "results" / "a.json"
    assert digest.of_file(record) == value[RESTORED]
    assert os.stat(record).st_nlink == 1


def test_a_stale_record_is_replaced_by_the_link(tmp_path: Path) -> None:
    r = Runner(tmp_path, PACK)
    r.run()
    value = _plain_value(r.cache, "a")
    tc = TaskCache(r.cache, warn=lambda _w: None)
    from crucible.run.cache._store import Hit

    hit = Hit(value["record"], [], value[RESTORED])
    target = tmp_path / "results" / "a.json"
    target.parent.mkdir()
    target.write_bytes(b"stale")

    class _Key:
        task, key, digest = "a", None, "sha256:" + "0" * 64

    assert tc.link_record(_Key(), hit, target)  # type: ignore[arg-type]
    assert digest.of_file(target) == value[RESTORED]
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]  # no temporary left
    tc.close()


def test_gc_keeps_the_store_copies_live_records_name(tmp_path: Path) -> None:
    r = Runner(tmp_path, PACK)
    r.run()
    value = _plain_value(r.cache, "a")
    tc = TaskCache(r.cache, warn=lambda _w: None)
    try:
        report = tc.gc(grace=0)
    finally:
        tc.close()
    assert report["removed"] == 0
    assert _store(r.cache, value[RESTORED]).exists()


def test_restored_record_is_the_record_a_hit_writes() -> None:
    class _Key:
        digest = "sha256:" + "1" * 64

    got = restored_record({"task": "t", "attempt": 3, "status": "passed"}, _Key())  # type: ignore[arg-type]
    assert got == {
        "task": "t",
        "attempt": 1,
        "status": "passed",
        "cached": True,
        "cache_key": _Key.digest,
    }


@pytest.mark.parametrize("size", [0, 1, 300, 1 << 16, (1 << 16) + 1, 3 << 20])
def test_file_digest_is_of_file(tmp_path: Path, size: int) -> None:
    from crucible.run.cache._storefs import file_digest

    p = tmp_path / "f"
    p.write_bytes(os.urandom(size))
    assert file_digest(p) == digest.of_file(p)


def test_file_digest_of_a_file_it_may_not_open_noatime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crucible.run.cache import _storefs as _cache

    p = tmp_path / "f"
    p.write_bytes(b"{}")
    real = os.open

    def no_noatime(path: Any, flags: int, *a: Any) -> int:
        if flags & _cache._NOATIME:
            raise PermissionError(errno.EPERM, "not the owner")
        return real(path, flags, *a)

    monkeypatch.setattr(os, "open", no_noatime)
    assert _cache.file_digest(p) == digest.of_bytes(b"{}")


def test_a_symlink_at_the_restored_copys_temp_name_is_never_written_through(
    tmp_path: Path,
) -> None:
    import threading

    data = b'{"format":"x"}'
    tc = TaskCache(tmp_path / "cache", warn=lambda _w: None)
    target = tc._store_path(digest.of_bytes(data))
    target.parent.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.write_bytes(b"untouched")
    tmp = target.with_name(f"@tmp-r{os.getpid()}-{threading.get_ident()}-{target.name}")
    os.symlink(outside, tmp)
    with pytest.raises(OSError):
        tc._put_restored(data)
    assert outside.read_bytes() == b"untouched"
    assert not target.exists()
