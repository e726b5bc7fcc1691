"""Property tests on a real filesystem: no valid task name and no key whatsoever
makes a staged or captured path leave its directory."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crucible.stage import (
    KEY_COMPONENT_MAX,
    StateDir,
    StateLayout,
    escape_key,
    load_result,
    unescape_key,
)
from crucible.stage._names import is_shortened, task_name_problem
from tests.stage.stageplans import plan, task

HOSTILE = [
    "",
    ".",
    "..",
    "...",
    "a/../../x",
    "../../../../etc/passwd",
    "/etc/passwd",
    "%2e%2e",
    "%2E%2E%2F",
    "%",
    "%25",
    "~",
    "x~" + "0" * 64,
    "\x00",
    "a\x00b",
    "\\..\\..",
    ".hidden",
    "@values",
    "index.json",
    "k" * 251,
    "é" * 300,
    "\U0001f600" * 100,
    "\n",
    " ",
]
keys = st.one_of(st.sampled_from(HOSTILE), st.text(), st.text(min_size=80, max_size=400))
settings_fs = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _inside(path: Path, root: Path) -> bool:
    real = os.path.realpath(path)
    root_real = os.path.realpath(root)
    return real.startswith(root_real + os.sep)


def _tree(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), root))
    return out


@given(keys)
@settings(max_examples=500)
def test_escape_is_one_safe_component_and_reversible(key: str) -> None:
    e = escape_key(key)
    assert e not in ("", ".", "..")
    assert "/" not in e and "\\" not in e and "\x00" not in e
    assert e.isascii() and len(e.encode()) <= KEY_COMPONENT_MAX
    assert not e.startswith(".") and not e.startswith("@")
    if is_shortened(e):
        assert len(e) > 64
    else:
        assert unescape_key(e) == key
        assert escape_key(unescape_key(e)) == e


@given(st.lists(keys, unique=True, max_size=30))
@settings(max_examples=200)
def test_escape_is_injective(ks: list[str]) -> None:
    assert len({escape_key(k) for k in ks}) == len(ks)


@given(keys, keys)
@settings(max_examples=500)
def test_escape_distinguishes_any_two_keys(a: str, b: str) -> None:
    assert (escape_key(a) == escape_key(b)) == (a == b)


valid_names = st.one_of(
    st.sampled_from(["a", "a.b", ".x", "...", "a@b", "~", "%2e%2e", "é", " x "]),
    st.text(min_size=1, max_size=60),
).filter(lambda n: task_name_problem(n) is None)


@given(valid_names, keys)
@settings_fs
def test_layout_paths_stay_inside_state_on_a_real_filesystem(name: str, key: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        layout = StateLayout(state)
        for root, path in (
            (state / "results", layout.result_path(name)),
            (state / "results", layout.result_path(name, key)),  # packed: <name>.jsonl
            (state / "files" / name, layout.files_dir(name, key)),
            (state / "work" / name, layout.work_dir(name, key)),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")  # the OS accepts it as a file name
            assert _inside(path, root), (root, path)
            assert path.parent == root
            path.unlink()


@given(valid_names, st.lists(keys, unique=True, min_size=1, max_size=4))
@settings_fs
def test_capture_and_stage_never_leave_their_directories(name: str, ks: list[str]) -> None:
    consumer = "consumer" if name != "consumer" else "consumer2"
    src = "src" if name not in ("src",) else "src2"
    p = plan(
        task(src, emits={"xs": "object"}),
        task(name, needs=[src], map=f"{src}.xs", emits={"v": "any"}, emits_files=["out", "g/*"]),
        task(consumer, needs=[name], join="settled", inputs={"vs": f"{name}.v"}),
        version=2,
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = root / "state"
        outside = root / "outside"
        outside.mkdir()
        (outside / "secret").write_bytes(b"SECRET")
        state.mkdir()
        (state / "results").mkdir()
        xs = {k: i for i, k in enumerate(ks)}
        from crucible.core import canon
        from crucible.stage._records import RESULT_FORMAT

        (state / "results" / f"{src}.json").write_bytes(
            canon.dumps(
                {
                    "format": RESULT_FORMAT,
                    "task": src,
                    "status": "passed",
                    "note": "",
                    "retryable": False,
                    "output": {"xs": xs},
                }
            )
        )
        for i, k in enumerate(ks):
            ws = root / "wss" / str(i)
            (ws / "out").mkdir(parents=True)
            (ws / "g").mkdir()
            (ws / "out" / "data").write_bytes(k.encode("utf-8", "surrogatepass"))
            (ws / "g" / "ok").write_bytes(b"ok")
            if i % 2:  # symlink tricks: out of the workspace, directly and via a parent
                (ws / "out" / "leak").symlink_to(outside / "secret")
            else:
                (ws / "g" / "up").symlink_to(outside)
            (ws / "o.json").write_bytes(canon.dumps({"v": k}))
            rec = StateDir(p, state).capture(
                name, ws, output_file=ws / "o.json", exit_code=0, key=k
            )
            assert rec["status"] == "failed" and "outside the workspace" in rec["note"]
            assert rec["output"] == {"v": k}
            # and a clean attempt captures
            (ws / "out" / "leak").unlink(missing_ok=True)
            (ws / "g" / "up").unlink(missing_ok=True)
            rec = StateDir(p, state).capture(
                name, ws, output_file=ws / "o.json", exit_code=0, key=k, attempt=2
            )
            assert rec["status"] == "passed", rec["note"]
            assert load_result(state, name, k) == rec
        order = [k for k, _ in StateDir(p, state).map_items(name)]
        assert sorted(order) == sorted(ks)
        StateDir(p, state).settle_fold(name, order)
        for path in _tree(state):
            assert _inside(state / path, state)
        # every captured file sits in the instance's own directory
        files_root = state / "files" / name
        assert sorted(os.listdir(files_root)) == sorted(escape_key(k) for k in ks)
        ws = root / "consumer-ws"
        ws.mkdir()
        # a previous attempt's inputs/ replaced by a symlink out of the workspace
        (ws / "inputs").symlink_to(outside)
        before_outside = _tree(outside)
        staged = StateDir(p, state).stage_inputs(consumer, ws)
        assert _tree(outside) == before_outside
        assert staged.values_dir is not None
        for rel in _tree(ws):
            assert _inside(ws / rel, ws / "inputs") or rel == "inputs"
        assert all(
            b"SECRET" not in (ws / rel).read_bytes() for rel in _tree(ws) if (ws / rel).is_file()
        )
        entries = staged.index["inputs"][0]["entries"] if staged.index else []
        assert [e["key"] for e in entries] == sorted(
            ks, key=lambda k: k.encode("utf-16-be", "surrogatepass")
        )
        index_bytes = (ws / "inputs" / "@values" / "index.json").read_bytes()
        assert index_bytes == canon.dumps(canon.loads(index_bytes))  # canonical, fast path or not
        for e in entries:
            assert (ws / e["path"]).parent == ws / "inputs" / "@values" / "vs"
            data = (ws / e["path"]).read_bytes()
            assert canon.loads(data) == e["key"] and data == canon.dumps(e["key"])
        for k in ks:
            data = ws / "inputs" / name / escape_key(k) / "out" / "data"
            assert data.read_bytes() == k.encode("utf-8", "surrogatepass")


@given(
    st.text(max_size=20), st.sampled_from(["/", "\\", "@", "[", "]", "\x00"]), st.text(max_size=20)
)
@settings(max_examples=200)
def test_unsafe_task_names_are_refused_in_a_plan(a: str, bad: str, b: str) -> None:
    import pytest

    from crucible.core.errors import InputRefused
    from crucible.stage._plan import build_view

    name = a + bad + b if bad != "@" else bad + a + b
    assert task_name_problem(name) is not None
    with pytest.raises(InputRefused):
        build_view(plan(task(name)))
    with pytest.raises(InputRefused):
        StateLayout(Path("/nonexistent")).result_path(name)


@given(st.one_of(st.text(min_size=1, max_size=40), st.text(min_size=240, max_size=260)), keys)
@settings_fs
def test_names_compile_accepts_stay_inside_or_are_refused_cleanly(name: str, key: str) -> None:
    """Against the compiler's own rule: every name validation accepts either
    stages inside its directory, or (longer than 250 bytes, where
    ``<name>.json`` would not fit NAME_MAX) is refused by stage, never escapes."""
    import pytest

    from crucible.compile._names import task_name_problems
    from crucible.core.errors import InputRefused

    if task_name_problems(name):
        return
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        layout = StateLayout(state)
        if len(name.encode("utf-8", "surrogatepass")) > 250:
            with pytest.raises(InputRefused, match="250"):
                layout.result_path(name)
            return
        assert task_name_problem(name) is None
        paths = [layout.files_dir(name, key), layout.result_path(name)]
        # <name>.jsonl is one byte longer than <name>.json: a 250-byte name's
        # packed file is over NAME_MAX (open: docs/spec/inputs.md 5)
        if len(name.encode("utf-8", "surrogatepass")) <= 249:
            paths.append(layout.result_path(name, key))
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
            assert _inside(path, state)


@st.composite
def _dags(draw: st.DrawFn) -> list[tuple[list[int], bool]]:
    """Tasks t0..tn-1, each needing some earlier ones, some emitting files."""
    n = draw(st.integers(1, 12))
    return [
        (
            draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else [],
            draw(st.booleans()),
        )
        for i in range(n)
    ]


@given(_dags())
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_file_ancestors_are_the_ancestors_that_emit_files(dag: list[tuple[list[int], bool]]) -> None:
    """PlanView.file_ancestors (worked out once per task) is what filtering every
    ancestor gives, in declaration order, asked once or twice."""
    from crucible.stage._plan import build_view

    tasks = [
        task(f"t{i}", needs=[f"t{d}" for d in needs], emits_files=["out/*"] if files else [])
        for i, (needs, files) in enumerate(dag)
    ]
    pv = build_view(plan(*tasks, version=2))
    for _ in range(2):
        for name in pv.order:
            expected = tuple(a for a in pv.ancestors(name) if pv.tasks[a].emits_files)
            assert pv.file_ancestors(name) == expected
