"""The task cache's key and store (crucible.run.cache._store), on real dispatched state."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.run.cache._keyer import Keyer
from crucible.run.cache._store import CacheKey, TaskCache, explain_miss, scalar_digest
from crucible.stage import escape_key
from tests.run.dispatchtests import DISPATCH

PACK = """edition = 3

[workflow]
name = "k"

[workflow.params.n]
type = "integer"
default = 1

[[workflow.task]]
name = "make"
emits = { n = "integer" }
emits_files = ["out/*.txt"]
run = 'mkdir -p out && echo data > out/a.txt && echo "{\\"n\\": 7}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "use"
description = "reads n"
needs = ["make"]
inputs = { n = "make.n" }
run = 'true'
"""


def dispatched(tmp_path: Path, pack: str = PACK, *args: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pack.toml").write_text(pack)
    state = tmp_path / "state"
    proc = subprocess.run(
        [DISPATCH, str(tmp_path / "pack.toml"), "--state", str(state), *args],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return state


def key_of(
    state: Path,
    task: str = "use",
    *,
    environ: dict[str, str] | None = None,
    emit_cap: int = 65536,
) -> CacheKey:
    """The unit's key as a run computes it: the one keyer (crucible.run.cache._keyer)."""
    plan = canon.loads((state / "plan.json").read_bytes())
    keyer = Keyer(
        plan, state, environ=environ or {"PATH": "/usr/bin"}, agent_cmd=None, emit_cap=emit_cap
    )
    return keyer.key(task, None)


def test_key_is_stable_and_names_its_parts(tmp_path: Path) -> None:
    state = dispatched(tmp_path)
    first, second = key_of(state), key_of(state)
    assert first.digest == second.digest and first.digest.startswith("sha256:")
    assert {"task", "program:sh", "emit_cap", "input:n", "input:params", "files:make"} <= set(
        first.components
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"environ": {"PATH": "/usr/bin", "LANG": "C"}}, "changed environment variable LANG"),
        ({"emit_cap": 10}, "changed emit cap"),
    ],
)
def test_each_component_changes_the_key(
    tmp_path: Path, change: dict[str, object], reason: str
) -> None:
    state = dispatched(tmp_path)
    base, other = key_of(state), key_of(state, "use", **change)  # type: ignore[arg-type]
    assert base.digest != other.digest
    assert explain_miss(base.components, other.components) == reason
    instance = CacheKey("use", "x", {**base.components, "instance": scalar_digest("x")})
    assert instance.digest != base.digest
    assert explain_miss(base.components, instance.components) == "new instance"


def test_changed_input_value_and_file_are_named(tmp_path: Path) -> None:
    a = key_of(dispatched(tmp_path / "a"))
    b = key_of(dispatched(tmp_path / "b", PACK.replace('\\"n\\": 7', '\\"n\\": 8')))
    assert explain_miss(a.components, b.components) == "changed input 'n'"
    c = key_of(dispatched(tmp_path / "c", PACK.replace("echo data", "echo other")))
    assert explain_miss(a.components, c.components) == "changed files of 'make'"


def test_description_is_not_in_the_key_but_run_is(tmp_path: Path) -> None:
    a = key_of(dispatched(tmp_path / "a"))
    b = key_of(dispatched(tmp_path / "b", PACK.replace("reads n", "reads the n")))
    assert a.digest == b.digest
    c = key_of(dispatched(tmp_path / "c", PACK.replace("run = 'true'", "run = ':'")))
    assert explain_miss(a.components, c.components) == "changed task definition"


def test_save_lookup_restore_and_tamper(tmp_path: Path) -> None:
    state = dispatched(tmp_path)
    warnings: list[str] = []
    cache = TaskCache(tmp_path / "cache", warn=warnings.append)
    ck = key_of(state, task="make")
    assert cache.lookup(ck) is None
    record = canon.loads((state / "results" / "make.json").read_bytes())
    cache.save(ck, record, state / "files" / "make", escape_key)
    hit = cache.lookup(ck)
    assert hit is not None and hit.record == record
    out = tmp_path / "restored"
    cache.restore(hit, out)
    assert (out / "out" / "a.txt").read_text() == "data\n"
    assert not os.access(out / "out" / "a.txt", os.W_OK) or os.geteuid() == 0
    assert cache.last_components("make", None, escape_key) == ck.components
    cache.close()
    # altering the store file (through any link) turns the hit into a reported miss
    store = (tmp_path / "cache" / "files").rglob("*")
    (stored,) = [p for p in store if p.is_file() and p.read_bytes() == b"data\n"]
    os.chmod(stored, 0o644)
    stored.write_text("tampered\n")
    again = TaskCache(tmp_path / "cache", warn=warnings.append)
    assert again.lookup(ck) is None
    assert any("missing or altered" in w for w in warnings)
