"""A unit keyed before staging (crucible.run.cache._keyer, the one key function)
holds, for each ``input:`` component, the digest of what staging then wrote in
its workspace (read back here, from ``inputs/@values/index.json`` or v1's
``@inputs.json``: the test's oracle), for every kind of input every example pack
stages — declared values, folds, reserved inputs (params, item, outcome), v1
delivery, agents, failed and skipped producers under settled joins."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from crucible.core import canon, digest
from crucible.run.cache._keyer import Keyer
from crucible.stage import StateDir, unescape_key
from tests.run.dispatchtests import DISPATCH, fanout_run

REPO = Path(__file__).resolve().parents[2]
STAND_IN = str(REPO / "examples" / "agent" / "stand-in.sh")
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "X": "1"}

CASES = {
    "fanout": ("examples/fanout/pack.toml", []),
    "fanout-failing": ("examples/fanout/pack.toml", ["-p", "fail_on=gamma"]),
    "legacy-v1": ("examples/legacy-v1/pack.toml", []),
    "edition2": ("examples/edition2/pack.toml", []),
    "matrix": ("examples/matrix/pack.toml", []),
    "enrich": ("examples/enrich/pack.toml", []),
    "release": ("examples/release/pack.toml", []),
    "agent": ("examples/agent/pack.toml", []),
    "daily": ("examples/daily/pack.toml", []),
}


def staged_inputs(workspace: Path, version: int) -> dict[str, str]:
    """One ``input:`` component per input staging wrote in ``workspace``: the
    digest of its index entry without ``path`` and ``size`` (v2+), or of its
    value in the whole input object (v1) — docs/spec/cache.md."""

    def digest_of(value: object) -> str:
        return digest.of_bytes(canon.dumps(value))

    inputs = workspace / "inputs"
    if version >= 2:
        if not inputs.exists():  # nothing to stage (inputs.md 3.7): no inputs
            return {}
        index = canon.loads((inputs / "@values" / "index.json").read_bytes())
        return {
            f"input:{e['name']}": digest_of({k: v for k, v in e.items() if k not in ("path", "size")})
            for e in index.get("inputs", [])
        }
    whole = canon.loads((inputs / "@inputs.json").read_bytes())
    return {f"input:{name}": digest_of(value) for name, value in whole.items()}


def inputs_of(components: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in components.items() if k.startswith("input:")}


def units(state: Path) -> list[tuple[str, str | None, Path]]:
    """Every unit that was staged: (task, raw key, workspace)."""
    out: list[tuple[str, str | None, Path]] = []
    plan = canon.loads((state / "plan.json").read_bytes())
    mapped = {t["name"] for t in plan["tasks"] if "map" in t or "matrix" in t}
    for ws in sorted((state / "work").iterdir()):
        if ws.name not in mapped:
            out.append((ws.name, None, ws))
            continue
        for inst in sorted(ws.iterdir()):
            out.append((ws.name, unescape_key(inst.name), inst))
    return [u for u in out if (u[2] / "inputs").is_dir()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_keyed_before_staging_equals_the_staged_key(tmp_path: Path, case: str) -> None:
    pack, args = CASES[case]
    state = tmp_path / "state"
    proc = subprocess.run(
        [
            DISPATCH,
            pack,
            "--state",
            str(state),
            "--keep-workspaces",
            "--agent-cmd",
            STAND_IN,
            *args,
        ],
        cwd=REPO,
        env={**os.environ, **ENV},
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr
    plan = canon.loads((state / "plan.json").read_bytes())
    keyer = Keyer(plan, state, environ=ENV, agent_cmd=STAND_IN, emit_cap=65536)
    found = units(state)
    assert found
    for name, key, workspace in found:
        early = keyer.key(name, key)
        assert inputs_of(early.components) == staged_inputs(workspace, plan["version"]), (
            name,
            key,
        )
        assert early.digest == keyer.key(name, key).digest  # stable


def test_a_refused_staging_is_refused_before_staging(tmp_path: Path) -> None:
    """A producer that passed without its declared field cannot be keyed: the
    unit goes to staging, which names the mismatch."""
    from crucible.core.errors import CrucibleError

    state = fanout_run(tmp_path / "state")
    record_path = state / "results" / "list.json"
    record = canon.loads(record_path.read_bytes())
    del record["output"]["fail_on"]
    os.chmod(record_path, 0o644)
    record_path.write_bytes(canon.dumps(record))
    plan = canon.loads((state / "plan.json").read_bytes())
    keyer = Keyer(plan, state, environ=ENV, agent_cmd=None, emit_cap=65536)
    with pytest.raises(CrucibleError, match="without its declared field 'fail_on'"):
        keyer.key("measure", "0")


def test_reserved_state_inputs_are_keyed_as_staged(tmp_path: Path) -> None:
    """Reserved inputs an outer loop leaves in STATE/reserved/ (and params that
    changed) are in the key exactly as staging hands them."""

    state = fanout_run(tmp_path / "state")
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_text('[{"score": 1.5}]')
    (state / "reserved" / "revision.json").write_text('"r2"')
    plan = canon.loads((state / "plan.json").read_bytes())
    keyer = Keyer(plan, state, environ=ENV, agent_cmd=None, emit_cap=65536)
    before = keyer.key("list", None)
    for round_ in ("first", "params changed"):
        for name, key in [("list", None), ("measure", "1"), ("total", None), ("summary", None)]:
            workspace = tmp_path / f"ws-{round_}-{name}"
            StateDir(plan, state).stage_inputs(name, workspace, key=key)
            staged = staged_inputs(workspace, plan["version"])
            assert inputs_of(keyer.key(name, key).components) == staged, (round_, name)
        params = canon.loads((state / "params.json").read_bytes())
        params["fail_on"] = "beta"
        os.chmod(state / "params.json", 0o644)
        (state / "params.json").write_bytes(canon.dumps(params))
    assert keyer.key("list", None).components["input:params"] != before.components["input:params"]
    assert "input:history" in before.components and "input:revision" in before.components


@pytest.mark.parametrize(
    "names",
    [
        ["task", "input:n", "files:make"],
        ["input:é", "input:z", "input:\u00ff"],
        ["input:\ue001", "input:\uffff", "input:a"],  # above U+E000: UTF-16 order
        ["input:\U0001d11e", "input:\ufb01", "input:b"],  # an astral name sorts first
        [""],
    ],
)
def test_the_keys_digest_is_the_canonical_one(names: list[str]) -> None:
    """The key's digest takes orjson's sorted output only where it equals
    RFC 8785 (crucible.run.cache._store._components_digest): the same digest as the
    canonical bytes, whatever the component names."""
    from crucible.core import digest
    from crucible.run.cache._store import KEY_FORMAT, CacheKey

    components = {n: f"sha256:{i:064x}" for i, n in enumerate(names)}
    expected = digest.of_bytes(canon.dumps({"format": KEY_FORMAT, "components": components}))
    assert CacheKey("t", None, components).digest == expected


def test_a_replaced_ancestor_record_is_read_again(tmp_path: Path) -> None:
    """The keyer remembers each ancestor's files component by its record file's
    identity: a record replaced since is read again."""
    from tests.run.test_cache_key import dispatched

    state = dispatched(tmp_path)
    plan = canon.loads((state / "plan.json").read_bytes())
    keyer = Keyer(plan, state, environ=ENV, agent_cmd=None, emit_cap=65536)
    first = keyer.key("use", None).components["files:make"]
    assert keyer.key("use", None).components["files:make"] == first
    path = state / "results" / "make.json"
    record = canon.loads(path.read_bytes())
    record["files"][0]["digest"] = "sha256:" + "0" * 64
    tmp = path.with_name("make.json.new")
    tmp.write_bytes(canon.dumps(record))
    os.replace(tmp, path)
    assert keyer.key("use", None).components["files:make"] != first
