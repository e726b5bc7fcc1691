"""A command that cannot start is an error of the tree (issue 11 item 1): ledger's
``CannotStart`` carries its exit code, and the edge maps it, not a translation by type."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from crucible.core.errors import EXIT_OPERATIONAL, EXIT_USAGE, CrucibleError, StartFailed
from crucible.ledger._runner import CannotStart
from crucible.ledger.commands import StepRunOptions, run_run


def test_cannot_start_is_in_the_tree_with_its_exit_code() -> None:
    assert issubclass(CannotStart, StartFailed)
    assert CannotStart("cannot start 'x'", usage=True).exit_code == EXIT_USAGE
    assert CannotStart("cannot start 'x': EIO", usage=False).exit_code == EXIT_OPERATIONAL


def test_run_run_raises_it_as_it_is(tmp_path: Path) -> None:
    options = StepRunOptions(
        str(tmp_path / "ledger"), "s", (), (), (), (str(tmp_path / "no-such-program"),)
    )
    with pytest.raises(CannotStart) as info:
        run_run(options, io.BytesIO(), io.TextIOWrapper(io.BytesIO()))
    assert isinstance(info.value, CrucibleError) and info.value.exit_code == EXIT_USAGE
    assert info.value.message.startswith("cannot start ")
