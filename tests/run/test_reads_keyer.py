"""The ``reads`` component and its stat memo (crucible.run.cache._reads;
docs/spec/cache.md, "Declared reads")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import crucible.run.cache._storefs as cache_mod
from crucible.run.cache._reads import ReadsKeyer, describe_change, match_files


def _tree(root: Path) -> None:
    (root / "data" / "sub").mkdir(parents=True)
    (root / "data" / "a.csv").write_text("a\n")
    (root / "data" / "b.csv").write_text("b\n")
    (root / "data" / "note.txt").write_text("n\n")
    (root / "data" / "sub" / "c.csv").write_text("c\n")


def test_globs_directories_and_absolute_entries(tmp_path: Path) -> None:
    _tree(tmp_path)
    pack = str(tmp_path)
    assert [k for k, _ in match_files("data/*.csv", pack)] == ["data/a.csv", "data/b.csv"]
    assert [k for k, _ in match_files("data/**/*.csv", pack)] == [
        "data/a.csv",
        "data/b.csv",
        "data/sub/c.csv",
    ]
    # a directory named without a glob is every file beneath it
    assert [k for k, _ in match_files("data", pack)] == [
        "data/a.csv",
        "data/b.csv",
        "data/note.txt",
        "data/sub/c.csv",
    ]
    assert match_files("missing/*.csv", pack) == []
    absolute = str(tmp_path / "data" / "a.csv")
    assert match_files(absolute, "/elsewhere") == [(absolute, absolute)]


def test_a_symlink_loop_is_not_followed(tmp_path: Path) -> None:
    _tree(tmp_path)
    (tmp_path / "data" / "sub" / "loop").symlink_to(tmp_path / "data")
    found = [k for k, _ in match_files("data/**", str(tmp_path))]
    assert "data/sub/c.csv" in found
    assert not any("loop" in k for k in found)


def test_each_file_is_hashed_once_across_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path)
    hashed: list[str] = []
    real = cache_mod.file_digest

    def counting(path: str | os.PathLike[str]) -> str:
        hashed.append(str(path))
        return real(path)

    monkeypatch.setattr(cache_mod, "file_digest", counting)
    monkeypatch.setattr(ReadsKeyer, "RACY_NS", 0)  # the files were written just now
    cache = tmp_path / "cache"
    cache.mkdir()
    first = ReadsKeyer(str(tmp_path), cache).component(["data/**"])
    assert len(hashed) == 4
    hashed.clear()
    # a later run (a new keyer, the memo read back from the cache dir) only stats
    again = ReadsKeyer(str(tmp_path), cache).component(["data/**"])
    assert again == first and hashed == []
    with open(tmp_path / "data" / "b.csv", "a") as f:
        f.write("more\n")
    keyer = ReadsKeyer(str(tmp_path), cache)
    changed = keyer.component(["data/**"])
    assert changed != first
    assert hashed == [str(tmp_path / "data" / "b.csv")]
    # the listing behind each digest is kept, so a miss can name the file
    before = keyer.kept_listing(first)
    now = keyer.kept_listing(changed)
    assert before is not None and now is not None
    assert describe_change(before, now) == "read data/b.csv changed"


def test_a_linked_file_is_keyed_by_its_target_bytes(tmp_path: Path) -> None:
    _tree(tmp_path)
    target = tmp_path / "elsewhere.csv"
    target.write_text("linked\n")
    (tmp_path / "data" / "l.csv").symlink_to(target)
    keyer = ReadsKeyer(str(tmp_path), None)
    listing = keyer.listing(["data/*.csv"])
    assert ["data/l.csv", cache_mod.file_digest(target)] in listing[0][1]
    before = keyer.component(["data/*.csv"])
    target.write_text("changed\n")
    assert ReadsKeyer(str(tmp_path), None).component(["data/*.csv"]) != before


def test_an_empty_match_is_part_of_the_key(tmp_path: Path) -> None:
    keyer = ReadsKeyer(str(tmp_path), None)
    none = keyer.component(["extra/*.txt"])
    assert none != ReadsKeyer(str(tmp_path), None).component(["other/*.txt"])
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "x.txt").write_text("x")
    assert ReadsKeyer(str(tmp_path), None).component(["extra/*.txt"]) != none


def test_describe_change() -> None:
    before = [["d/*", [["d/a", "sha256:1"], ["d/b", "sha256:2"]]]]
    assert describe_change(before, [["d/*", [["d/a", "sha256:1"]]]]) == "read d/b removed"
    assert (
        describe_change(before, [["d/*", [["d/a", "sha256:1"], ["d/b", "sha256:2"], ["d/c", "x"]]]])
        == "read d/c added"
    )
    assert describe_change(before, [*before, ["e", []]]) == "reads entry 'e' added"
    assert describe_change(before, []) == "reads entry 'd/*' removed"
    assert describe_change(None, before) == "changed reads"


def test_the_keyer_keys_a_tasks_reads_with_the_workflows(tmp_path: Path) -> None:
    """The unit's key (the one keyer) holds the reads component of the task's
    reads, the workflow's merged in, and a changed file changes it."""
    from crucible.compile import compile_bytes
    from crucible.run.cache._keyer import Keyer
    from crucible.run.cache._reads import ReadsKeyer

    _tree(tmp_path)
    manifest = b"""edition = 4
[workflow]
name = "k"
reads = ["data/*.csv"]
[[workflow.task]]
name = "t"
run = "true"
"""
    plan = compile_bytes(manifest, "pack.toml", tmp_path).plan
    state = tmp_path / "state"
    state.mkdir()
    keyer = Keyer(plan, state, environ={}, agent_cmd=None, emit_cap=65536, pack_dir=str(tmp_path))
    ck = keyer.key("t", None)
    expected = ReadsKeyer(str(tmp_path), None).component(plan["tasks"][0]["reads"])
    assert ck.components["reads"] == expected
    (tmp_path / "data" / "a.csv").write_text("changed\n")
    again = Keyer(plan, state, environ={}, agent_cmd=None, emit_cap=65536, pack_dir=str(tmp_path))
    assert again.key("t", None).components["reads"] != expected


def test_a_fifo_or_a_directory_is_never_matched(tmp_path: Path) -> None:
    """Only regular files: a FIFO among the data is listed past, never opened
    (opening one would wait for a writer)."""
    _tree(tmp_path)
    os.mkfifo(tmp_path / "data" / "pipe.csv")
    (tmp_path / "data" / "dir.csv").mkdir()
    found = [k for k, _ in match_files("data/*.csv", str(tmp_path))]
    assert found == ["data/a.csv", "data/b.csv"]
    assert match_files("data/pipe.csv", str(tmp_path)) == []
    ReadsKeyer(str(tmp_path), None).component(["data/**"])  # returns: nothing blocks


def test_a_name_that_is_not_utf8_is_keyed_escaped(tmp_path: Path) -> None:
    _tree(tmp_path)
    (tmp_path / "data").joinpath(os.fsdecode(b"caf\xe9.csv")).write_text("x\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    keyer = ReadsKeyer(str(tmp_path), cache)
    keyer.component(["data/*.csv"])
    listing = keyer.listing(["data/*.csv"])
    assert [p for p, _ in listing[0][1]] == ["data/a.csv", "data/b.csv", "data/caf\\xe9.csv"]


def test_the_listing_bytes_are_canonical_json(tmp_path: Path) -> None:
    from crucible.core import canon
    from crucible.run.cache._reads import _listing_bytes

    _tree(tmp_path)
    (tmp_path / "data" / "sp\u00e9cial \"q\" \t.csv").write_text("x")
    (tmp_path / "data" / os.fsdecode(b"raw\xff.csv")).write_text("y")
    listing = ReadsKeyer(str(tmp_path), None).listing(["data/**", "/abs/none"])
    assert _listing_bytes(listing) == canon.dumps(listing)


def test_a_file_changed_just_now_is_not_memoized(tmp_path: Path) -> None:
    """It could change again within the same timestamp tick, same size, after
    it was read: read again next run until it has been still for RACY_NS."""
    _tree(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    ReadsKeyer(str(tmp_path), cache).component(["data/**"])
    assert not (cache / "reads-memo.json").exists()
    old = 1_000_000_000
    for p in (tmp_path / "data").rglob("*.csv"):
        os.utime(p, ns=(old, old))  # mtime old; ctime is now: still racy
    ReadsKeyer(str(tmp_path), cache).component(["data/**"])
    assert not (cache / "reads-memo.json").exists()


def test_nothing_is_written_or_read_through_a_link_planted_in_the_cache(tmp_path: Path) -> None:
    _tree(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (cache / "reads").symlink_to(outside)
    (cache / "reads-memo.json").symlink_to(tmp_path / "data" / "a.csv")
    keyer = ReadsKeyer(str(tmp_path), cache)
    keyer.RACY_NS = 0
    value = keyer.component(["data/**"])
    assert list(outside.iterdir()) == []  # the listing was not kept through the link
    assert ReadsKeyer(str(tmp_path), cache).kept_listing(value) is None
    # the memo's link was replaced by the memo, never written through
    assert (tmp_path / "data" / "a.csv").read_text() == "a\n"
    assert not (cache / "reads-memo.json").is_symlink()
