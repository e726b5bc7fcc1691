"""Edition-4 fan-outs through real ``crucible-dispatch`` subprocesses: literal, param
and sequence maps, matrices (GitHub's documented examples), ``key``, ``parallelism``
(issue 17)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from crucible.run.engine._matrix import combination_key, combinations
from tests.packed import keyed
from tests.run.dispatchtests import DISPATCH, start_dispatch

#: each instance writes its key and item into its output
ECHO = (
    'run = \'printf "{\\"item\\": %s, \\"key\\": \\"%s\\"}" '
    '"$(cat "$CRUCIBLE_INPUTS_DIR/item")" "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"\'\n'
)


def dispatch(
    tmp_path: Path, toml: str, *args: str, state: str = "state"
) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(toml).lstrip())
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / state), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_text().splitlines()]


def outputs(state: Path, task: str) -> dict[str, Any]:
    """key -> output of each instance, in the aggregate record's order."""
    agg = json.loads((state / "results" / f"{task}.json").read_bytes())
    from crucible import stage

    out = {}
    for key in agg["keys"]:
        rec = stage.load_result(state, task, key)
        assert rec is not None
        out[key] = rec.get("output")
    return out


def admitted(state: Path, task: str) -> dict[str, Any]:
    (event,) = [e for e in events(state) if e["event"] == "plan_admitted"]
    return next(t for t in event["tasks"] if t["name"] == task)  # type: ignore[no-any-return]


def test_literal_map_expands_at_admission(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "lit"
        [[workflow.task]]
        name = "t"
        map = ["a", {{ b = 2 }}, 3]
        emits = {{ item = "any", key = "string" }}
        {ECHO}""",
    )
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    assert admitted(state, "t")["instances"] == ["0", "1", "2"]
    assert outputs(state, "t") == {
        "0": {"item": "a", "key": "0"},
        "1": {"item": {"b": 2}, "key": "1"},
        "2": {"item": 3, "key": "2"},
    }
    started = [e for e in events(state) if e["event"] == "task_started"]
    assert sorted(e["item"] for e in started) == ['"a"', "3", '{"b":2}']


PARAM_PACK = f"""
edition = 4
[workflow]
name = "par"
[workflow.params.regions]
type = "array"
default = ["eu", "us"]
[[workflow.task]]
name = "t"
map = "params.regions"
emits = {{ item = "any", key = "string" }}
{ECHO}"""


def test_param_map_takes_the_default_and_a_p_override(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, PARAM_PACK)
    assert proc.returncode == 0, proc.stderr
    assert [v["item"] for v in outputs(tmp_path / "state", "t").values()] == ["eu", "us"]
    proc = dispatch(tmp_path, PARAM_PACK, "-p", 'regions=["ap", "sa", "af"]', state="s2")
    assert proc.returncode == 0, proc.stderr
    assert [v["item"] for v in outputs(tmp_path / "s2", "t").values()] == ["ap", "sa", "af"]
    assert admitted(tmp_path / "s2", "t")["instances"] == ["0", "1", "2"]


def test_param_map_over_an_any_param_that_is_no_collection_is_refused_at_admission(
    tmp_path: Path,
) -> None:
    toml = PARAM_PACK.replace('type = "array"\ndefault = ["eu", "us"]', 'type = "any"')
    proc = dispatch(tmp_path, toml, "-p", "regions=7")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "params.regions" in proc.stderr
    assert not (tmp_path / "state" / "plan.json").exists()  # refused before the claim


def test_sequence_map(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "seq"
        [[workflow.task]]
        name = "t"
        map = {{ start = 10, end = 2, step = -4 }}
        emits = {{ item = "integer", key = "string" }}
        {ECHO}""",
    )
    assert proc.returncode == 0, proc.stderr
    assert outputs(tmp_path / "state", "t") == {
        "0": {"item": 10, "key": "0"},
        "1": {"item": 6, "key": "1"},
        "2": {"item": 2, "key": "2"},
    }


# GitHub Actions docs, "Excluding matrix configurations" (3 axes, 12 - 3 = 9 jobs)
# plus "Expanding or adding matrix configurations" (the fruit/animal include example).
GITHUB_EXCLUDE = """
os = ["macos-latest", "windows-latest"]
version = [12, 14, 16]
environment = ["staging", "production"]
exclude = [
  { os = "macos-latest", version = 12, environment = "production" },
  { os = "windows-latest", version = 16 },
]
"""
GITHUB_INCLUDE = """
fruit = ["apple", "pear"]
animal = ["cat", "dog"]
include = [
  { color = "green" },
  { color = "pink", animal = "cat" },
  { fruit = "apple", shape = "circle" },
  { fruit = "banana" },
  { fruit = "banana", animal = "cat" },
]
"""
GITHUB_INCLUDE_RESULT = [
    {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
    {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
    {"fruit": "pear", "animal": "cat", "color": "pink"},
    {"fruit": "pear", "animal": "dog", "color": "green"},
    {"fruit": "banana"},
    {"fruit": "banana", "animal": "cat"},
]


def _matrix_pack(axes: str) -> str:
    return (
        'edition = 4\n[workflow]\nname = "m"\n[[workflow.task]]\nname = "t"\n'
        'emits = { item = "object", key = "string" }\n' + ECHO + "[workflow.task.matrix]\n" + axes
    )


def test_github_exclude_example_gives_its_nine_jobs(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, _matrix_pack(GITHUB_EXCLUDE))
    assert proc.returncode == 0, proc.stderr
    got = [v["item"] for v in outputs(tmp_path / "state", "t").values()]
    expected = [
        {"os": os_, "version": v, "environment": env}
        for os_ in ("macos-latest", "windows-latest")
        for v in (12, 14, 16)
        for env in ("staging", "production")
        if not (os_ == "macos-latest" and v == 12 and env == "production")
        and not (os_ == "windows-latest" and v == 16)
    ]
    assert len(got) == 9 and got == expected
    keys = admitted(tmp_path / "state", "t")["instances"]
    assert keys[0] == "environment=staging,os=macos-latest,version=12"
    assert admitted(tmp_path / "state", "t")["matrix"] == ["os", "version", "environment"]
    import pytest

    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "docs/schemas/session-event.json").read_text()
    )
    for event in events(tmp_path / "state"):
        jsonschema.validate(event, schema)


def test_github_include_example_gives_its_six_combinations(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, _matrix_pack(GITHUB_INCLUDE))
    assert proc.returncode == 0, proc.stderr
    got = [v["item"] for v in outputs(tmp_path / "state", "t").values()]
    assert got == GITHUB_INCLUDE_RESULT


def test_three_axes_with_exclude_and_include(tmp_path: Path) -> None:
    """GitHub's exclude example plus includes: one that extends the windows/14 jobs,
    one that adds back an excluded combination (includes come after excludes)."""
    axes = GITHUB_EXCLUDE + (
        "include = [\n"
        '  { os = "windows-latest", version = 14, npm = 6 },\n'
        '  { os = "windows-latest", version = 16, environment = "staging" },\n'
        "]\n"
    )
    proc = dispatch(tmp_path, _matrix_pack(axes))
    assert proc.returncode == 0, proc.stderr
    got = [v["item"] for v in outputs(tmp_path / "state", "t").values()]
    assert len(got) == 10
    assert [c for c in got if c.get("npm") == 6] == [
        {"os": "windows-latest", "version": 14, "environment": "staging", "npm": 6},
        {"os": "windows-latest", "version": 14, "environment": "production", "npm": 6},
    ]
    assert got[-1] == {"os": "windows-latest", "version": 16, "environment": "staging"}


def test_matrix_axis_from_a_producer_expands_when_ready(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "m"
        [[workflow.task]]
        name = "split"
        emits = {{ shards = "array" }}
        run = 'echo "{{\\"shards\\": [1, 2]}}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "t"
        needs = ["split"]
        emits = {{ item = "object", key = "string" }}
        matrix = {{ os = ["a", "b"], shard = "split.shards" }}
        {ECHO}""",
    )
    assert proc.returncode == 0, proc.stderr
    got = outputs(tmp_path / "state", "t")
    assert list(got) == ["os=a,shard=1", "os=a,shard=2", "os=b,shard=1", "os=b,shard=2"]
    assert "instances" not in admitted(tmp_path / "state", "t")


def test_combinations_library_matches_github_and_bounds() -> None:
    axes = [("fruit", ["apple", "pear"]), ("animal", ["cat", "dog"])]
    include = [
        {"color": "green"},
        {"color": "pink", "animal": "cat"},
        {"fruit": "apple", "shape": "circle"},
        {"fruit": "banana"},
        {"fruit": "banana", "animal": "cat"},
    ]
    assert combinations(axes, (), include) == GITHUB_INCLUDE_RESULT
    # JSON equality: true is not 1
    assert combinations([("a", [1, True])], [{"a": 1}]) == [{"a": True}]
    assert combination_key({"b": 2, "a": "x", "c": [1]}) == "a=x,b=2,c=[1]"
    from crucible.run.engine._matrix import FanoutFailed

    try:
        combinations([("a", list(range(1000))), ("b", list(range(101)))])
    except FanoutFailed as exc:
        assert "101,000 combinations" in str(exc) and "100,000" in str(exc)
    else:
        raise AssertionError("over the bound")


KEYED = f"""
edition = 4
[workflow]
name = "k"
[workflow.params.targets]
type = "array"
default = [{{ name = "alpha", n = 1 }}, {{ name = "beta", n = 2 }}]
[[workflow.task]]
name = "t"
map = "params.targets"
key = "name"
emits = {{ item = "object", key = "string" }}
{ECHO}"""


def test_key_names_instances_by_a_field(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, KEYED)
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    assert outputs(state, "t") == {
        "alpha": {"item": {"name": "alpha", "n": 1}, "key": "alpha"},
        "beta": {"item": {"name": "beta", "n": 2}, "key": "beta"},
    }
    assert "alpha" in keyed(state, "t")


def test_duplicate_keys_fail_the_task_before_any_instance_runs(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, KEYED, "-p", 'targets=[{"name": "a"}, {"name": "b"}, {"name": "a"}]')
    assert proc.returncode == 1
    state = tmp_path / "state"
    record = json.loads((state / "results" / "t.json").read_bytes())
    assert record["status"] == "failed" and record["keys"] == []
    assert "duplicate instance key 'a'" in record["note"]
    assert not [e for e in events(state) if e["event"] == "task_started"]
    assert "duplicate instance key 'a'" in admitted(state, "t")["fanout_error"]


def test_parallelism_is_never_exceeded(tmp_path: Path) -> None:
    log = tmp_path / "spans"
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "p"
        [[workflow.task]]
        name = "t"
        map = {{ count = 8 }}
        parallelism = 2
        run = 'echo "start $(date +%s%N)" >> {log}; sleep 0.2; echo "end $(date +%s%N)" >> {log}'
        [[workflow.task]]
        name = "free"
        map = {{ count = 4 }}
        run = 'sleep 0.2'
        """,
        "-j",
        "6",
    )
    assert proc.returncode == 0, proc.stderr
    marks = sorted(
        (int(t), 1 if kind == "start" else -1)
        for kind, t in (line.split() for line in log.read_text().splitlines())
    )
    assert len(marks) == 16
    running = peak = 0
    for _, delta in sorted(marks, key=lambda m: (m[0], m[1])):  # an end before a start at a tie
        running += delta
        peak = max(peak, running)
    assert peak == 2  # bounded, and the bound was used
    # the dispatcher's own view agrees: never more than 2 instances of t started and unfinished
    live = peak_events = 0
    for e in events(tmp_path / "state"):
        if e.get("task") == "t" and e.get("key") is not None:
            if e["event"] == "task_started":
                live += 1
            elif e["event"] == "task_finished":
                live -= 1
            peak_events = max(peak_events, live)
    assert peak_events <= 2


def test_sigterm_then_resume_of_a_matrix_reruns_only_unsettled_instances(tmp_path: Path) -> None:
    import signal
    import time

    gate = tmp_path / "gate"
    gate.write_text("closed")
    ran = tmp_path / "ran"
    pack = tmp_path / "pack.toml"
    pack.write_text(
        textwrap.dedent(
            f"""
            edition = 4
            [workflow]
            name = "m"
            [workflow.outputs]
            n = "count.n"
            [[workflow.task]]
            name = "t"
            matrix = {{ a = ["x", "y"], b = {{ count = 2 }} }}
            emits = {{ item = "object", key = "string" }}
            run = '''echo "$CRUCIBLE_KEY" >> {ran}; if [ "$CRUCIBLE_KEY" = "a=y,b=1" ]; then while [ -e {gate} ]; do sleep 0.05; done; fi; printf '{{"item": %s, "key": "%s"}}' "$(cat "$CRUCIBLE_INPUTS_DIR/item")" "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"'''
            [[workflow.task]]
            name = "count"
            needs = ["t"]
            inputs = {{ keys = "t.key" }}
            emits = {{ n = "integer" }}
            run = 'echo "{{\\"n\\": $(ls "$CRUCIBLE_INPUTS_DIR/keys" | wc -l)}}" > "$CRUCIBLE_OUTPUT"'
            """
        ).lstrip()
    )
    state = tmp_path / "state"
    proc = start_dispatch(pack, state, "-j", "4")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = len(keyed(state, "t")) if state.exists() else 0
        if done == 3 and ran.exists() and "a=y,b=1" in ran.read_text():
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    doc = json.loads((state / "outputs.json").read_bytes())
    assert doc["@run"] == "interrupted" and doc["@absent"]["n"]["reason"] == "not-run"
    gate.unlink()
    again = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "--resume"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert sorted(ran.read_text().split()) == [
        "a=x,b=0",
        "a=x,b=1",
        "a=y,b=0",
        "a=y,b=1",
        "a=y,b=1",
    ]
    assert json.loads((state / "outputs.json").read_bytes())["n"] == 4


def test_key_over_a_producer_field_and_its_fold(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "kp"
        [[workflow.task]]
        name = "list"
        emits = { hosts = "array" }
        run = '''echo '{"hosts": [{"host": "db", "port": 5432}, {"host": "web", "port": 80}]}' > "$CRUCIBLE_OUTPUT"'''
        [[workflow.task]]
        name = "probe"
        needs = ["list"]
        map = "list.hosts"
        key = "host"
        emits = { port = "integer" }
        run = '''python3 -c 'import json, os; i = json.load(open(os.environ["CRUCIBLE_INPUTS_DIR"] + "/item")); json.dump({"port": i["port"]}, open(os.environ["CRUCIBLE_OUTPUT"], "w"))' '''
        [[workflow.task]]
        name = "sum"
        needs = ["probe"]
        inputs = { ports = "probe.port" }
        emits = { keys = "array" }
        run = '''python3 -c 'import json, os; idx = json.load(open(os.environ["CRUCIBLE_INPUTS_DIR"] + "/index.json")); (f,) = [i for i in idx["inputs"] if i["name"] == "ports"]; json.dump({"keys": [e["key"] for e in f["entries"]]}, open(os.environ["CRUCIBLE_OUTPUT"], "w"))' '''
        """,
    )
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    assert list(outputs(state, "probe")) == ["db", "web"]
    assert outputs(state, "probe")["web"] == {"port": 80}
    from crucible import stage

    record = stage.load_result(state, "sum")
    assert record is not None and record["output"] == {"keys": ["db", "web"]}
    assert "instances" not in admitted(state, "probe")  # expanded when ready, not at start


def test_every_instance_start_carries_a_short_item_preview(tmp_path: Path) -> None:
    long = "x" * 200
    proc = dispatch(
        tmp_path,
        f"""
        edition = 3
        [workflow]
        name = "pv"
        [[workflow.task]]
        name = "src"
        emits = {{ xs = "array" }}
        run = '''echo '{{"xs": ["{long}", {{"a": 1}}]}}' > "$CRUCIBLE_OUTPUT"'''
        [[workflow.task]]
        name = "each"
        needs = ["src"]
        map = "src.xs"
        run = "true"
        """,
    )
    assert proc.returncode == 0, proc.stderr
    items = {
        e["key"]: e["item"]
        for e in events(tmp_path / "state")
        if e["event"] == "task_started" and "key" in e
    }
    assert items["1"] == '{"a":1}'
    assert len(items["0"]) == 80 and items["0"].endswith("…") and items["0"].startswith('"xxx')


def _reference(
    axes: list[tuple[str, list[Any]]], exclude: list[dict[str, Any]], include: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """GitHub's documented rules, written as plainly as possible (values here are
    small integers, so == is JSON equality)."""
    import itertools

    names = [n for n, _ in axes]
    combos = [dict(zip(names, vs, strict=True)) for vs in itertools.product(*(v for _, v in axes))]
    combos = [c for c in combos if not any(all(c[k] == v for k, v in e.items()) for e in exclude)]
    extra: list[dict[str, Any]] = []
    for entry in include:
        hits = [c for c in combos if all(c[k] == v for k, v in entry.items() if k in names)]
        for c in hits:
            c.update({k: v for k, v in entry.items() if k not in names})
        if not hits:
            extra.append(dict(entry))
    return combos + extra


def test_combinations_agree_with_the_plain_reading_of_the_rules() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    axis_names = ["a", "b", "c"]
    values = st.integers(min_value=0, max_value=2)

    @st.composite
    def cases(draw: Any) -> Any:
        k = draw(st.integers(min_value=1, max_value=3))
        axes = [
            (n, draw(st.lists(values, min_size=1, max_size=3, unique=True))) for n in axis_names[:k]
        ]
        names = [n for n, _ in axes]
        entry = st.dictionaries(st.sampled_from(names), values, min_size=1)
        exclude = draw(st.lists(entry, max_size=3))
        inc_keys = st.sampled_from([*names, "x", "y"])
        include = draw(st.lists(st.dictionaries(inc_keys, values, min_size=1), max_size=3))
        return axes, exclude, include

    @settings(max_examples=200, deadline=None)
    @given(cases())
    def check(case: Any) -> None:
        axes, exclude, include = case
        assert combinations(axes, exclude, include) == _reference(axes, exclude, include)

    check()


def test_a_plan_of_one_matrix_task_gets_the_jobs_it_asks_for(tmp_path: Path) -> None:
    """-j is capped at the task count for plans without fan-out; a matrix is one."""
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "j"
        [[workflow.task]]
        name = "t"
        matrix = { a = { count = 4 } }
        run = "true"
        """,
        "-j",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    (event,) = [e for e in events(tmp_path / "state") if e["event"] == "plan_admitted"]
    assert event["jobs"] == 3
