"""docs/schemas/cache-value.json: the task cache's ledger value
``{record, files, restored_record?}`` (docs/spec/cache.md, "Store layout").

Every value the suite's cache tests write is checked at the end of the session
(tests/schemas/walker.py validates each ``dispatch``/``unit:`` ledger line's
value against it); here a real recording run's values are checked directly, and
the schema refuses a sample of what the cache's hit path refuses — each sample
also tried on the tool, in a copy of the cache outside the walked temp dir —
plus what the engine never writes (the schema is as strict as the writer)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.schemas import walker
from tests.schemas.walker import first_error

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")

PACK = """
edition = 4
[workflow]
name = "cached"
[[workflow.task]]
name = "p"
run = '''mkdir -p out/deep; echo a > out/a.txt; echo h > out/.h.txt; echo d > out/deep/..d.txt; echo '{}' > "$CRUCIBLE_OUTPUT"'''
emits_files = ["out/**"]
[[workflow.task]]
name = "m"
map = ["x", "y"]
run = '''echo "$CRUCIBLE_ITEM" > i.txt; echo '{}' > "$CRUCIBLE_OUTPUT"'''
emits_files = ["i.txt"]
[[workflow.task]]
name = "q"
needs = ["p"]
run = '''echo '{}' > "$CRUCIBLE_OUTPUT"'''
"""


def _values(cache: Path) -> list[Any]:
    out = []
    for line in (cache / "steps.jsonl").read_bytes().splitlines():
        if (value := walker.cache_value(json.loads(line))) is not None:
            out.append(value)
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory a recording run and a fully cached rerun wrote."""
    root = tmp_path_factory.mktemp("cachevalue")
    (root / "pack.toml").write_text(textwrap.dedent(PACK).lstrip())
    cache = root / "cache"
    for n in (1, 2):
        done = subprocess.run(
            [DISPATCH, str(root / "pack.toml"), "--state", str(root / f"s{n}"),
             "--cache", str(cache)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return cache


def test_every_value_a_recording_run_writes_matches(recorded: Path) -> None:
    values = _values(recorded)
    tasks = sorted((v["record"]["task"], v["record"].get("key")) for v in values)
    assert tasks == [("m", "0"), ("m", "1"), ("p", None), ("q", None)]
    for value in values:
        assert first_error("cache-value.json", value) is None, value
    plain = next(v for v in values if v["record"]["task"] == "p")
    assert "restored_record" in plain
    assert sorted(f["path"] for f in plain["files"]) == [
        "out/.h.txt", "out/a.txt", "out/deep/..d.txt",
    ]  # fmt: skip
    assert all("restored_record" not in v for v in values if v["record"].get("key"))
    checked, problems = walker.check_tree([recorded])
    assert checked >= 1 and problems == []


def _sound(recorded: Path) -> dict[str, Any]:
    value = next(v for v in _values(recorded) if v["record"]["task"] == "p")
    assert isinstance(value, dict)
    return value


@pytest.fixture
def scratch(recorded: Path) -> Iterator[Path]:
    """A copy of the cache outside pytest's temp dir: the refused samples it is
    given are never met by the end-of-session walk."""
    with tempfile.TemporaryDirectory(prefix="cache-value-") as d:
        copy_of = Path(d) / "cache"
        shutil.copytree(recorded, copy_of, symlinks=True)
        yield copy_of


def _tool_refuses(cache: Path, value: Any) -> bool:
    """The hit path (find, the bytes it would read, verify) on ``value``
    recorded under a fresh key: True when it is a miss or an error, never a hit."""
    from crucible.ledger import Ledger, Outcome
    from crucible.run.cache._store import CacheKey, TaskCache

    ck = CacheKey("p", None, {"sample": "sha256:" + "0" * 64})
    with Ledger(cache) as ledger:
        ledger.record("dispatch", f"unit:{ck.digest}", Outcome.ok(value))
    tc = TaskCache(cache, warn=lambda _w: None)
    try:
        hit = tc.find(ck)
        if hit is None:
            return True
        _ = hit.files_bytes
        return not tc.verify(ck, hit)
    except (AttributeError, KeyError, TypeError, ValueError):
        return True
    finally:
        tc.close()


def _edit(value: dict[str, Any], how: str) -> dict[str, Any]:
    v = copy.deepcopy(value)
    file0 = v["files"][0]
    if how == "dotdot":
        file0["path"] = "../escape.txt"
    elif how == "absolute":
        file0["path"] = "/tmp/escape.txt"
    elif how == "empty-component":
        file0["path"] = "out//a.txt"
    elif how == "dot-component":
        file0["path"] = "./out/a.txt"
    elif how == "nul":
        file0["path"] = "out/a\0.txt"
    elif how == "bad-digest":
        file0["digest"] = "sha256:../../etc/passwd"
    elif how == "no-digest":
        del file0["digest"]
    elif how == "files-not-a-list":
        v["files"] = "junk"
    elif how == "no-record":
        del v["record"]
    elif how == "record-not-an-object":
        v["record"] = ["p"]
    elif how == "failed-record":
        v["record"]["status"] = "failed"
    elif how == "restored-record-recorded":
        v["record"]["cached"] = True
    elif how == "unknown-member":
        v["extra"] = 1
    elif how == "file-unknown-member":
        file0["mode"] = 420
    elif how == "negative-size":
        file0["size"] = -1
    elif how == "restored-not-a-digest":
        v["restored_record"] = "sha256:xyz"
    elif how == "restored-for-an-instance":
        v["record"]["key"] = "x"
    else:
        raise AssertionError(how)
    return v


#: samples the cache's hit path refuses too (a miss, warned)
BOTH = [
    "dotdot", "absolute", "empty-component", "dot-component", "nul", "bad-digest",
    "no-digest", "files-not-a-list", "no-record", "record-not-an-object",
]  # fmt: skip
#: what the engine never writes, which a reader tolerates (cache.md: a reader
#: ignores members it does not know; a failed record is restored as recorded)
SCHEMA_ONLY = [
    "failed-record", "restored-record-recorded", "unknown-member", "file-unknown-member",
    "negative-size", "restored-not-a-digest", "restored-for-an-instance",
]  # fmt: skip


def test_the_sound_value_is_a_hit(recorded: Path, scratch: Path) -> None:
    sound = _sound(recorded)
    assert first_error("cache-value.json", sound) is None
    assert not _tool_refuses(scratch, sound)


@pytest.mark.parametrize("how", BOTH)
def test_the_schema_refuses_what_the_hit_path_refuses(
    recorded: Path, scratch: Path, how: str
) -> None:
    sample = _edit(_sound(recorded), how)
    assert first_error("cache-value.json", sample) is not None
    assert _tool_refuses(scratch, sample)


@pytest.mark.parametrize("how", SCHEMA_ONLY)
def test_the_schema_refuses_what_the_engine_never_writes(recorded: Path, how: str) -> None:
    assert first_error("cache-value.json", _edit(_sound(recorded), how)) is not None


def test_the_walk_checks_cache_values_in_steps_jsonl() -> None:
    """A ledger line of the cache with a bad value is a problem of the walk."""
    from crucible.ledger import Ledger, Outcome

    with tempfile.TemporaryDirectory(prefix="cache-value-walk-") as d:
        with Ledger(Path(d)) as ledger:
            ledger.record(
                "dispatch", "unit:sha256:" + "1" * 64, Outcome.ok({"record": {}, "files": "x"})
            )
            ledger.record("other", "unit:sha256:" + "1" * 64, Outcome.ok({"files": "x"}))
        problems = walker.check_tree([Path(d)])[1]
    assert [p.message.split(":")[0] for p in problems] == ["cache-value.json"], problems
