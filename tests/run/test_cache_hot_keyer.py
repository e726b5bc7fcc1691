"""The keyer's per-run memos (crucible.run.cache._keyer) never keep a stale
component: STATE/reserved listed again when it changes, an ancestor's files
component read again when its record is replaced, ancestors walked once per
task and still equal to a fresh keyer's key for every instance."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


def test_a_steady_pass_checks_params_and_reserved_once_and_the_next_pass_sees_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, plan = _dispatched(tmp_path)
    units = _units(plan, state)
    assert len(units) > 2
    stats: list[str] = []
    real_stat = os.stat
    watched = {str(state / "params.json"), str(state / "reserved")}

    def counting_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path) in watched:
            stats.append(str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting_stat)

    def checks_in_a_pass(keyer: Keyer, some: list[tuple[str, str | None]]) -> int:
        stats.clear()
        with keyer.steady():
            for u in some:
                keyer.key(*u)
        return len(stats)

    # as many checks for every unit in one pass as for one unit (a fresh keyer
    # each: the first pass also reads params.json)
    one = checks_in_a_pass(_keyer(plan, state), units[:1])
    keyer = _keyer(plan, state)
    assert checks_in_a_pass(keyer, units) == one
    before = {u: keyer.key(*u).components for u in units}
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_bytes(b"[]")
    with keyer.steady():  # the next pass sees what changed between passes
        after = {u: keyer.key(*u).components for u in units}
    assert all(after[u] != before[u] for u in units)
    assert after == {u: _keyer(plan, state).key(*u).components for u in units}
    stats.clear()
    for u in units[:2]:  # outside a pass: both checked at every key, as before
        keyer.key(*u)
    assert len(stats) == 4
