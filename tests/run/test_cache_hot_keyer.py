"""The keyer's per-run memos (crucible.run.cache._keyer) never keep a stale
component: STATE/reserved listed again when it changes, an ancestor's files
component read again when its record is replaced, ancestors walked once per
task and still equal to a fresh keyer's key for every instance."""

from __future__ import annotations

import os
from pathlib import Path

from crucible.core import canon
from crucible.run.cache._keyer import Keyer
from tests.run.dispatchtests import fanout_run

REPO = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _dispatched(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    state = fanout_run(tmp_path / "state", env={**os.environ, **ENV})
    return state, canon.loads((state / "plan.json").read_bytes())


def _units(plan: dict[str, object], state: Path) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for t in plan["tasks"]:  # type: ignore[attr-defined]
        if "map" in t:
            keys = canon.loads((state / "results" / f"{t['name']}.json").read_bytes())["keys"]
            out.extend((t["name"], k) for k in keys)
        else:
            out.append((t["name"], None))
    return out


def _keyer(plan: dict[str, object], state: Path) -> Keyer:
    return Keyer(plan, state, environ=ENV, agent_cmd=None, emit_cap=65536)


def test_one_keyer_keys_every_unit_as_fresh_keyers_do(tmp_path: Path) -> None:
    state, plan = _dispatched(tmp_path)
    shared = _keyer(plan, state)
    for name, key in _units(plan, state) * 2:  # twice: the memos answer the second time
        assert shared.key(name, key).components == _keyer(plan, state).key(name, key).components


def test_reserved_inputs_appearing_mid_run_change_the_key(tmp_path: Path) -> None:
    state, plan = _dispatched(tmp_path)
    keyer = _keyer(plan, state)
    name, key = _units(plan, state)[-1]
    before = keyer.key(name, key).components
    assert keyer.key(name, key).components == before
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_bytes(b"[]")
    after = keyer.key(name, key).components
    assert after != before and after == _keyer(plan, state).key(name, key).components
    (state / "reserved" / "history.json").unlink()
    assert keyer.key(name, key).components == before
