"""Edition-4 ``temp_files`` (issue 33 item 2): plan form and located refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.compile import compile_bytes
from crucible.compile._manifest import analyze_manifest


def pack(temp: str, emits: str = '["big", "keep.txt", "parts/*.bin"]', *, edition: int = 4,
         publish: str = "") -> bytes:  # fmt: skip
    return (
        f'edition = {edition}\n[workflow]\nname = "t"\n{publish}[[workflow.task]]\nname = "a"\n'
        f'run = "true"\nemits_files = {emits}\ntemp_files = {temp}\n'
    ).encode()


def codes(data: bytes) -> list[tuple[str, str | None]]:
    analysis = analyze_manifest(data, "pack.toml", Path("."))
    return [(d.code, d.location.where()) for d in analysis.errors]


@pytest.mark.parametrize("temp", ['["big"]', '["big/x/y"]', '["parts/a.bin"]', '["parts/*.bin"]'])
def test_entries_under_emits_files_compile_into_the_plan(temp: str) -> None:
    task = compile_bytes(pack(temp), "pack.toml", Path(".")).plan["tasks"][0]
    assert task["temp_files"] == [temp[2:-2]]


def test_no_temp_files_leaves_the_plan_unchanged() -> None:
    data = b'edition = 4\n[workflow]\nname = "t"\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
    assert "temp_files" not in compile_bytes(data, "pack.toml", Path(".")).plan["tasks"][0]


@pytest.mark.parametrize("temp", ['["other"]', '["keep"]', '["parts/x.txt"]', '["bi*"]'])
def test_an_entry_not_under_emits_files_is_refused_where_it_is(temp: str) -> None:
    found = codes(pack(temp))
    assert [c for c, _ in found] == ["temp-not-emitted"]
    assert found[0][1] is not None and found[0][1].startswith("pack.toml:8:")


def test_a_published_temporary_is_refused() -> None:
    publish = '[workflow.publish]\nout = { from = ["a:big/*"] }\n'
    assert [c for c, _ in codes(pack('["big"]', publish=publish))] == ["temp-published"]
    ok = '[workflow.publish]\nout = { from = ["a:keep.txt"] }\n'
    assert codes(pack('["big"]', publish=ok)) == []


def test_edition_3_does_not_know_the_key() -> None:
    found = codes(pack('["big"]', edition=3))
    assert "unknown-key" in [c for c, _ in found]


def test_under_is_by_whole_path_components() -> None:
    """Property: a path inside a literal entry is under it; one that merely
    shares a prefix of its name is not (``big`` covers ``big/x``, not ``bigger``)."""
    from hypothesis import given
    from hypothesis import strategies as st

    from crucible.compile._temps import temp_under

    seg = st.text(alphabet="abcxyz_-.0", min_size=1, max_size=6).filter(
        lambda s: s not in (".", "..")
    )

    @given(st.lists(seg, min_size=1, max_size=3), st.lists(seg, min_size=1, max_size=3), seg)
    def prop(base: list[str], rest: list[str], extra: str) -> None:
        entry = "/".join(base)
        assert temp_under([entry], entry)
        assert temp_under([entry], "/".join(base + rest))
        sibling = "/".join([*base[:-1], base[-1] + extra])
        assert not temp_under([entry], sibling)

    prop()
