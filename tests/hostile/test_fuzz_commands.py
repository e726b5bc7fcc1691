"""Fuzz targets for the commands issue 12 found without one (compile/validate,
verify and report have theirs beside their tools): stage capture over hostile
result files, dispatch over mutated plans, the ledger over a mutated
steps.jsonl. Each asserts what the contract promises whatever the input: an
exit code from the documented set and never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
DOCUMENTED = {0, 1, 2, 3}
FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def _contract(proc: subprocess.CompletedProcess[bytes]) -> None:
    assert proc.returncode in DOCUMENTED, (proc.returncode, proc.stderr[-2000:])
    assert b"Traceback" not in proc.stderr, proc.stderr[-2000:]


def _hello_plan(tmp: Path) -> dict[str, Any]:
    out = tmp / "plan.json"
    proc = _run(
        [str(BIN / "crucible-compile"), str(REPO / "examples/hello/pack.toml"), "-o", str(out)], tmp
    )
    assert proc.returncode == 0, proc.stderr
    plan: dict[str, Any] = json.loads(out.read_bytes())
    return plan


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
def test_stage_capture_of_any_result_file(tmp_path_factory: Any, data: bytes) -> None:
    tmp = tmp_path_factory.mktemp("capture")
    state = tmp / "st"
    state.mkdir()
    (state / "plan.json").write_bytes(json.dumps(_hello_plan(tmp)).encode())
    stage = str(BIN / "crucible-stage")
    assert _run([stage, "inputs", "--state", str(state), "--task", "greet"], tmp).returncode == 0
    (tmp / "out.json").write_bytes(data)
    _contract(
        _run(
            [stage, "capture", "--state", str(state), "--task", "greet", "--exit-code", "0",
             "--output", str(tmp / "out.json")],
            tmp,
        )
    )  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


@FUZZ
@given(pick=st.integers(min_value=0), new=json_values)
def test_dispatch_of_a_mutated_plan(tmp_path_factory: Any, pick: int, new: Any) -> None:
    tmp = tmp_path_factory.mktemp("dispatch")
    plan = _hello_plan(tmp)
    paths = _paths(plan)
    mutated = _replace(plan, paths[pick % len(paths)], new)
    (tmp / "m.json").write_text(json.dumps(mutated))
    _contract(
        _run([str(BIN / "crucible-dispatch"), str(tmp / "m.json"), "--state", str(tmp / "s")], tmp)
    )
    if (tmp / "s").exists():
        _contract(_run([str(BIN / "crucible-dispatch"), "report", str(tmp / "s")], tmp))


@FUZZ
@given(cut=st.integers(min_value=0), junk=st.binary(max_size=80))
def test_ledger_over_a_mutated_ledger(tmp_path_factory: Any, cut: int, junk: bytes) -> None:
    tmp = tmp_path_factory.mktemp("ledger")
    ledger = str(BIN / "crucible-ledger")
    d = tmp / "L"
    for i in range(3):
        argv = [
            ledger,
            "run",
            "--dir",
            str(d),
            "--scope",
            "s",
            "--key",
            f"k={i}",
            "--",
            "echo",
            str(i),
        ]
        proc = _run(argv, tmp)
        assert proc.returncode == 0, proc.stderr
    data = (d / "steps.jsonl").read_bytes()
    at = cut % (len(data) + 1)
    (d / "steps.jsonl").write_bytes(data[:at] + junk + data[at:])
    for argv in (["verify"], ["ls"], ["get", "--scope", "s", "--key", "k=1"], ["compact"]):
        _contract(_run([ledger, argv[0], "--dir", str(d), *argv[1:]], tmp))
    shutil.rmtree(d)
