"""The -j 1 race of commit 23de59e (issue 14): a consumer that writes a staged,
hard-linked file is checked before its slot is given back, so the consumer
after it never starts before the change was found and the published copy
restored; and a consumer refreshed while another restores still gets the
captured bytes (docs/spec/inputs.md 3.4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.stage import StateDir
from crucible.stage._share import verify_consumer
from tests.run.dispatchtests import dispatch, result
from tests.stage.stageplans import plan, settle, task

BIG = b"captured bytes\n" * 500


def _plan() -> dict:  # type: ignore[type-arg]
    return plan(
        task("p", emits_files=["out/**"]),
        task("a", needs=["p"]),
        task("b", needs=["p"]),
        version=2,
    )


def test_a_holding_is_judged_by_its_own_bytes_when_the_copy_was_restored_meanwhile(
    tmp_path: Path,
) -> None:
    """b was linked to the inode a then wrote. b's refresh read the manifest,
    then a's check restored the published copy (a new tree at the same path)
    before b's refresh judged its holding. The holding must be judged by its
    own bytes, not by the path in the published tree (now the fresh captured
    bytes): before the fix b was found unchanged and started with a's bytes."""
    from crucible.stage._inputs import held_units
    from crucible.stage._share import _changed_holdings, _read_manifest

    state = tmp_path / "state"
    state.mkdir()
    p = _plan()
    settle(p, state, "p", None, files={"out/f": BIG})
    sd = StateDir(p, state)
    a, b = state / "work" / "a", state / "work" / "b"
    sd.stage_inputs("a", a)
    sd.stage_inputs("b", b)  # staged ahead while a runs
    victim = a / "inputs" / "p" / "out" / "f"
    if victim.stat().st_nlink == 1:
        pytest.skip("reflinked: nothing is shared")
    victim.chmod(0o644)
    victim.write_bytes(b"EVIL")
    (unit,) = held_units(sd.view, state, "b")
    found = _read_manifest(unit.root, unit.label, unit.store)  # b's refresh reads the manifest ...
    assert found is not None
    notes = verify_consumer(state, "a", held_units(sd.view, state, "a"), a)  # ... a is restored ...
    assert notes and "changed while a held it" in notes[0]
    # ... and only then b's refresh judges what b holds, against what it read
    # (True: the inode that manifest names, still to be restored as far as it knew)
    assert _changed_holdings(found[1], b / "inputs" / "p") == {"out/f": True}
    # against the manifest now published, the same inode is one already restored
    now = _read_manifest(unit.root, unit.label, unit.store)
    assert now is not None
    assert _changed_holdings(now[1], b / "inputs" / "p") == {"out/f": False}
    assert sd.refresh_inputs("b", b) == ["inputs/p/out/f"]
    held = b / "inputs" / "p" / "out" / "f"
    assert held.read_bytes() == BIG and held.stat().st_mode & 0o777 == 0o444
    rb = sd.capture("b", b, output_file=b / "none", exit_code=0)
    assert rb["status"] == "passed", rb["note"]


TAMPER = """edition = 3

[workflow]
name = "tamper"

[[workflow.task]]
name = "p"
# many files: checking a holder takes a while (the window the fix closes)
run = "mkdir out && cd out && seq 1500 | xargs touch && printf captured > f"
emits_files = ["out"]

[[workflow.task]]
name = "q"
run = "true"

[[workflow.task]]
name = "z"
needs = ["q"]
run = "sleep 1.5; date +%s%N > done_at"  # longer than staging a: a waits for its slot

[[workflow.task]]
name = "a"
needs = ["p"]
run = "date +%s%N > started_at; sleep 0.2; chmod u+w inputs/p/out/f && printf EVIL > inputs/p/out/f"

[[workflow.task]]
name = "b"
needs = ["z"]
emits = { found = "boolean", at = "string" }
run = '''
at=$(date +%s%N)
if [ -e "$CRUCIBLE_WORKSPACE/../../shared/@tampered/p" ]; then found=true; else found=false; fi
printf '{"found": %s, "at": "%s"}' "$found" "$at" > "$CRUCIBLE_OUTPUT"
'''

[[workflow.task]]
name = "c"
needs = ["p", "a"]
join = "settled"
emits = { seen = "string" }
run = '''printf '{"seen": "%s"}' "$(cat inputs/p/out/f)" > "$CRUCIBLE_OUTPUT"'''
"""


def _ns(state: Path, task: str, name: str) -> int:
    return int((state / "work" / task / name).read_text())


def _runs_racing_b_against_a(tmp_path: Path, wanted: int) -> list[Path]:
    """Runs in which a started before b: at -j 1 the one (pipelined) worker
    starts a, then b on a's slot — b staged behind a, or handed back while a
    sleeps and submitted again once a's slot is free. (Before workers were
    pipelined, z ran first and a, staged while z slept, took z's slot.)"""
    pack = tmp_path / "pack.toml"
    pack.write_text(TAMPER)
    found: list[Path] = []
    for i in range(3 * wanted):
        state = tmp_path / f"st{i}"
        r = dispatch(pack, "--state", state, "-j", "1")
        assert r.returncode == 1, r.stderr
        a_at = _ns(state, "a", "started_at")
        b = result(state, "b")
        assert b is not None, r.stderr
        if a_at < int(b["output"]["at"]):
            found.append(state)
            if len(found) == wanted:
                return found
    pytest.fail(f"not z, a, b in {3 * wanted - len(found)} of {3 * wanted} runs")


def test_at_j1_the_writer_is_checked_before_the_next_unit_starts(tmp_path: Path) -> None:
    """At -j 1, the unit after a writer (b, handed to another worker while a
    runs, waiting for a's slot) starts only once a's change was found and the
    published copy restored: the tampered list exists when b's first command
    runs. Before the fix a's worker gave the slot back first and checked a
    afterwards, so b could start (and a consumer like b read a's bytes, as in
    CI) before the change was found."""
    for state in _runs_racing_b_against_a(tmp_path, 2):
        a = result(state, "a")
        assert a is not None and a["status"] == "failed"
        assert "changed while a held it" in a["note"]
        b = result(state, "b")
        assert b is not None and b["status"] == "passed", b
        assert b["output"]["found"] is True, state
        c = result(state, "c")
        assert c is not None and c["status"] == "passed" and c["output"] == {"seen": "captured"}
