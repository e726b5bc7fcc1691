"""Every path under STATE is spelled once, by ``StateLayout`` (issue 11 item 4):
the paths its callers used to spell by hand, as docs/spec/run.md and inputs.md
name them."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core.errors import InputRefused
from crucible.stage import StateLayout, _share, _store
from crucible.stage._loop_outcome import loop_outcome


def test_the_layout_names_the_state_files(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    assert layout.loop_path == tmp_path / "loop.json"
    assert layout.outputs_path == tmp_path / "outputs.json"
    assert layout.publish_scratch == tmp_path / ".publish"
    assert layout.executor_token_path == tmp_path / "executor-token"
    assert layout.shared_dir("t") == tmp_path / "shared" / "t"
    assert layout.shared_dir("t", "a/b") == tmp_path / "shared" / "t" / "a%2Fb"
    with pytest.raises(InputRefused):
        layout.shared_dir("../t")


def test_the_store_and_the_shared_units_take_their_paths_from_the_layout(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    assert _store.plain_path(tmp_path, "t") == layout.result_path("t")
    assert _store.packed_path(tmp_path, "t") == layout.packed_path("t")
    with pytest.raises(InputRefused):
        _store.packed_path(tmp_path, "a/b")
    layout.files_dir("t").mkdir(parents=True)
    (unit,) = _share.units_of(tmp_path, "t", mapped=False)
    assert (unit.store, unit.record, unit.root) == (
        layout.files_dir("t"),
        layout.result_path("t"),
        layout.shared_dir("t"),
    )


def test_loop_json_is_read_where_the_layout_says(tmp_path: Path) -> None:
    StateLayout(tmp_path).loop_path.write_text('{"revisions": [{}, {}], "stop_reason": "target"}')
    assert loop_outcome(tmp_path)["revisions"] == 2
