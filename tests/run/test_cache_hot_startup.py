"""A dispatch loads only what a run of its plan needs (issue 15, start-up): a
plan file does not import the manifest compiler or tomllib, and a plan without
a scored loop does not import the loop engine. Checked on the modules a real
``crucible-dispatch`` process holds when it exits."""

from __future__ import annotations

from pathlib import Path

from crucible.compile import compile_path
from tests.run.cachetests import MODULE_LISTER, dispatch_with

PACK = """edition = 4

[workflow]
name = "plain"

[[workflow.task]]
name = "a"
run = 'printf "{}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "b"
needs = ["a"]
run = "true"
"""


def _modules(tmp_path: Path, plan: Path, *args: str) -> set[str]:
    mods = tmp_path / f"mods-{len(list(tmp_path.iterdir()))}.txt"
    done = dispatch_with(
        MODULE_LISTER, plan, "--state", tmp_path / mods.stem, *args, env={"MODS": str(mods)}
    )
    assert done.returncode == 0, done.stderr
    return set(mods.read_text().split())


def test_a_plan_file_run_loads_no_manifest_compiler_and_no_loop_engine(tmp_path: Path) -> None:
    (tmp_path / "pack.toml").write_text(PACK)
    plan = tmp_path / "plan.json"
    plan.write_bytes(compile_path(tmp_path / "pack.toml").data)
    cache = tmp_path / "cache"
    for args in ((), ("--cache", str(cache)), ("--cache", str(cache))):  # plain, record, hit
        mods = _modules(tmp_path, plan, *args)
        assert "crucible.run.engine._dispatcher" in mods  # it did run
        assert not {"crucible.compile._manifest", "tomllib"} & mods
        assert "crucible.run.loop._engine" not in mods


def test_a_manifest_run_still_compiles_it(tmp_path: Path) -> None:
    (tmp_path / "pack.toml").write_text(PACK)
    mods = _modules(tmp_path, tmp_path / "pack.toml")
    assert {"crucible.compile._manifest", "tomllib"} <= mods
