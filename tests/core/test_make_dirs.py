"""crucible.core.fsio.make_dirs: ``mkdir -p`` whose failure is one OperationalError
at the path (the state dir, a workspace, a publish target)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core.errors import OperationalError
from crucible.core.fsio import make_dirs


def test_the_missing_parents_are_made_and_an_existing_directory_is_kept(tmp_path: Path) -> None:
    make_dirs(tmp_path / "a" / "b", "state dir")
    make_dirs(tmp_path / "a" / "b", "state dir")
    assert (tmp_path / "a" / "b").is_dir()


@pytest.mark.parametrize(
    ("what", "said"), [("state dir", "cannot create state dir: "), (None, "cannot create: ")]
)
def test_a_file_in_the_way_is_one_operational_error_at_the_path(
    tmp_path: Path, what: str | None, said: str
) -> None:
    (tmp_path / "f").write_text("x")
    target = tmp_path / "f" / "d"
    with pytest.raises(OperationalError) as info:
        make_dirs(target, what)
    assert str(info.value.args[0]).startswith(said)
    assert "Not a directory" in str(info.value)
    assert info.value.where == str(target)
