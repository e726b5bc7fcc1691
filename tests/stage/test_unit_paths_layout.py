"""run's ``UnitPaths.output``/``work`` spell an unmapped unit's paths by hand on the
hot path (one join onto a cached directory instead of the layout's Path steps):
they must stay the paths ``StateLayout`` spells (docs/spec/run.md, "State
directory"), for every task, key and attempt, the first call and the cached ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.run.executors._unit_paths import UnitPaths
from crucible.stage import StateLayout

#: unmapped and mapped units; keys the layout escapes; a name with a dot and a dash
UNITS = [
    ("build", None),
    ("a.b-c", None),
    ("build", "0"),
    ("build", "a/b"),
    ("fan", "x y%z"),
]


@pytest.mark.parametrize("attempt", [1, 2, 17])
def test_output_is_the_layouts_output_path(tmp_path: Path, attempt: int) -> None:
    layout = StateLayout(tmp_path)
    paths = UnitPaths(tmp_path, layout)
    for _round in range(2):  # the second round reads the cached attempt directory
        for name, key in UNITS:
            got = paths.output(name, key, attempt)
            assert got == layout.output_path(name, key, attempt)
            assert got.parent.is_dir()  # made, as the unit writes into it next


def test_output_caches_each_attempt_directory_apart(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    paths = UnitPaths(tmp_path, layout)
    for attempt in (1, 2, 1, 3, 2):
        assert paths.output("t", None, attempt) == layout.output_path("t", None, attempt)
        assert paths.output("u", None, attempt) == layout.output_path("u", None, attempt)


def test_work_is_the_layouts_work_dir(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    paths = UnitPaths(tmp_path, layout)
    for name, key in UNITS * 2:
        assert paths.work(name, key) == layout.work_dir(name, key)
