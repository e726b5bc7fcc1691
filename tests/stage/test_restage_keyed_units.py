"""Restaging in place (inputs.md 3.8) builds a keyed producer's published set
from its own line of the packed records, as fresh staging does: without the
key, the set was built as "files whose unit has no record" (its identity the
store directory's, no recorded digests to check the files against)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.stage import _share


@pytest.mark.parametrize("restage", [False, True])
def test_both_writers_publish_a_keyed_unit_with_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restage: bool
) -> None:
    seen: list[Any] = []

    class _Stop(Exception):
        pass

    def publish(state: Path, store: Path, record: Path, root: Path, label: str, key: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
        seen.append(key)
        raise _Stop

    monkeypatch.setattr(_share, "publish", publish)
    unit = _share.Unit(
        store=tmp_path / "files" / "a" / "%40rev2",
        record=tmp_path / "results" / "a.jsonl",
        root=tmp_path / "shared" / "a" / "%40rev2",
        label="a[%40rev2]",
        staged="a",
        key="@rev2",
    )
    write = _share.restage_units if restage else _share.stage_units
    with pytest.raises(_Stop):
        write(tmp_path, [unit], tmp_path / "ws" / "inputs", 0, 1 << 20)
    assert seen == ["@rev2"]
