"""Every machine output matches its schema: files a run leaves, and what the commands
print for scripts (validate --json, stage inputs --json, report --json, the
ledger's get/put/verify/compact).

Real subprocesses of the installed commands, over packs of each IR version that
reach every kind of file: a fold, an epilogue (its ``outcome``), listed fan-outs
(``STATE/instances``), run results (``outputs.json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.schemas.walker import check_tree, first_error, walk

BIN = Path(sys.executable).parent

WRITE = "python3 -c \"import json,os,sys; json.dump(json.loads(sys.argv[1]), open(os.environ['CRUCIBLE_OUTPUT'], 'w'))\""

PACKS = {
    # IR v1: whole-object inputs (@inputs.json), a fold, an epilogue
    1: f"""
edition = 2
[workflow]
name = "v1"
[workflow.params.size]
type = "integer"
default = 2
[[workflow.task]]
name = "list"
run = '''{WRITE} '{{"items": [1, 2], "note": "x"}}' '''
emits = {{ items = "array" }}
[[workflow.task]]
name = "each"
needs = ["list"]
map = "list.items"
run = '''{WRITE} '{{"n": 1}}' '''
emits = {{ n = "integer" }}
[[workflow.task]]
name = "sum"
needs = ["each"]
run = '''cat "$CRUCIBLE_INPUTS_FILE" > /dev/null; {WRITE} '{{"total": 2}}' '''
[[workflow.task]]
name = "wrap"
epilogue = true
run = "true"
""",
    # IR v2: declared inputs as files (index.json), a fold, an epilogue
    2: f"""
edition = 3
[workflow]
name = "v2"
[[workflow.task]]
name = "list"
run = '''{WRITE} '{{"items": [1, 2], "extra": 1}}' '''
emits = {{ items = "array" }}
[[workflow.task]]
name = "each"
needs = ["list"]
map = "list.items"
run = '''{WRITE} '{{"n": 1}}' '''
emits = {{ n = "integer" }}
[[workflow.task]]
name = "sum"
needs = ["each", "list"]
inputs = {{ ns = "each.n", items = "list.items" }}
run = '''{WRITE} '{{"total": 2}}' '''
emits = {{ total = "integer" }}
[[workflow.task]]
name = "wrap"
epilogue = true
run = "true"
""",
    # IR v3: a literal map, a matrix, a failure tolerated, run results
    3: f"""
edition = 4
[workflow]
name = "v3"
[workflow.outputs]
total = "sum.total"
[[workflow.task]]
name = "each"
map = {{ items = ["a", "b"] }}
run = '''{WRITE} '{{"n": 1}}' '''
emits = {{ n = "integer" }}
[[workflow.task]]
name = "grid"
matrix = {{ x = [1, 2], y = ["p"] }}
run = "true"
[[workflow.task]]
name = "flaky"
run = "exit 3"
on_failure = "continue"
[[workflow.task]]
name = "sum"
needs = ["each"]
inputs = {{ ns = "each.n" }}
run = '''{WRITE} '{{"total": 2}}' '''
emits = {{ total = "integer" }}
[[workflow.task]]
name = "wrap"
epilogue = true
run = "true"
""",
}


def cli(
    *argv: str, stdin: bytes = b"", cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def lines_match(schema: str, data: bytes) -> list[Any]:
    values = [json.loads(line) for line in data.splitlines()]
    assert values, "no output"
    for value in values:
        assert first_error(schema, value) is None, (schema, value, first_error(schema, value))
    return values


@pytest.fixture(scope="module", params=sorted(PACKS), ids=[f"v{v}" for v in sorted(PACKS)])
def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, Path]:
    version: int = request.param
    root = tmp_path_factory.mktemp(f"outputs-v{version}")
    (root / "pack.toml").write_text(PACKS[version])
    state = root / "state"
    done = cli("crucible-dispatch", str(root / "pack.toml"), "--state", str(state))
    assert done.returncode == 0, done.stderr.decode()
    return version, state


def test_a_run_leaves_files_that_match_their_schemas(run: tuple[int, Path]) -> None:
    version, state = run
    kinds = {found.schema for found in walk(state)}
    expected = {"plan", "params.json", "session-event.json", "result-record.json"}
    expected |= {
        1: {"inputs-v1.json"},  # the epilogue's outcome is in it ($ref outcome.json)
        2: {"inputs-index.json", "outcome.json"},
        3: {"inputs-index.json", "outcome.json", "instances.json", "outputs.json"},
    }[version]
    assert expected <= kinds
    checked, problems = check_tree([state])
    assert checked > 8
    assert [str(p) for p in problems] == []


def test_stage_inputs_json_matches(run: tuple[int, Path]) -> None:
    version, state = run
    done = cli("crucible-stage", "inputs", "--state", str(state), "--task", "sum", "--json")
    assert done.returncode == 0, done.stderr.decode()
    (env,) = lines_match("stage-env.json", done.stdout)
    assert ("CRUCIBLE_INPUTS_FILE" in env) == (version == 1)


def test_report_json_rows_match(run: tuple[int, Path]) -> None:
    _, state = run
    for argv in ((), ("each",)):
        done = cli("crucible-dispatch", "report", str(state), *argv, "--json")
        assert done.returncode == 0, done.stderr.decode()
        rows = lines_match("report-row.json", done.stdout)
        assert len(rows) >= 2


def test_every_report_row_member_is_in_the_schema() -> None:
    """report-row.json names every member row_json can write (all of them set)."""
    from crucible.run.report._report import Row, row_json

    row = Row(
        "t",
        None,
        status="failed",
        note="exited with status -9",
        attempts=2,
        duration=1.5,
        exit_code=-9,
        output_bytes=3,
        files_bytes=4,
        instances=2,
        counts={"failed": 2},
        mapped=True,
        log="logs/t.log",
        stderr_tail="boom",
        cached=True,
        cache_miss="read data/b.csv changed",
        tolerated=True,
    )
    from crucible.run.report._usage import UnitUsage

    measured = UnitUsage(
        cpu_s=0.5, cpu_pct=50.0, wall_s=1.0, max_rss_kib=2048, rss_bound=True,
        read_bytes=4096, write_bytes=8192, vol_ctxt=3, inv_ctxt=1,
    )  # fmt: skip
    row.member_usage = [measured]  # a mapped task's: its instances' spread
    unit = Row("t", "k", status="passed", attempts=1, usage=measured)
    data = {**row_json(row), **row_json(unit)}
    properties = json.loads(
        (Path(__file__).resolve().parents[2] / "docs/schemas/report-row.json").read_text()
    )["$defs"]["row"]["properties"]
    assert set(data) == set(properties)
    assert first_error("report-row.json", row_json(row)) is None
    assert first_error("report-row.json", row_json(unit)) is None
    instance = row_json(Row("t", "k", status="passed", attempts=1))
    assert first_error("report-row.json", instance) is None


def test_validate_json_diagnostics_match(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[workflow]\nname = " "\n[[workflow.task]]\nname = "a"\nrun = ["", "x"]\ncolour = 1\n'
    )
    legacy = tmp_path / "legacy.toml"
    legacy.write_text('[workflow]\nname = "w"\n[[workflow.task]]\nname = "a"\nrun = "true"\n')
    plan = tmp_path / "plan.json"
    plan.write_text('{"version": 1, "edition": 1, "workflow": {"name": "w"}, "tasks": [{}]}')
    seen: set[str] = set()
    for path, code in ((bad, 1), (legacy, 0), (plan, 1)):
        done = cli("crucible-validate", "--json", str(path))
        assert done.returncode == code, done.stderr.decode()
        for diagnostic in lines_match("validate-diagnostic.json", done.stdout):
            seen |= set(diagnostic) | {diagnostic["severity"]}
    done = cli("crucible-validate", "--json", "-", stdin=bad.read_bytes(), cwd=tmp_path)
    assert done.returncode == 1
    assert {d["file"] for d in lines_match("validate-diagnostic.json", done.stdout)} == {"<stdin>"}
    assert {"line", "col", "path", "error", "warning"} <= seen


def test_ledger_outputs_match(tmp_path: Path) -> None:
    d = str(tmp_path / "ledger")
    put = cli(
        "crucible-ledger", "put", "--dir", d, "--scope", "s", "--step", "x", stdin=b'{"a": 1}'
    )
    assert put.returncode == 0, put.stderr.decode()
    lines_match("ledger-reply.json", put.stdout)
    run = cli("crucible-ledger", "run", "--dir", d, "--scope", "s", "--", "echo", "hi")
    assert run.returncode == 0
    get = cli("crucible-ledger", "get", "--dir", d, "--scope", "s", "--step", "x")
    assert get.returncode == 0, get.stderr.decode()
    (reply,) = lines_match("ledger-reply.json", get.stdout)
    assert reply["value"] == {"a": 1}
    with open(tmp_path / "ledger" / "steps.jsonl", "ab") as f:
        f.write(b"junk\n")
    verify = cli("crucible-ledger", "verify", "--dir", d)
    assert verify.returncode == 1
    (report,) = lines_match("ledger-verify.json", verify.stdout)
    assert report["bad_lines"] == 1
    compact = cli("crucible-ledger", "compact", "--dir", d)
    assert compact.returncode == 0, compact.stderr.decode()
    (done,) = lines_match("ledger-compact.json", compact.stdout)
    assert done["rejected"] is not None
    (healthy,) = lines_match(
        "ledger-verify.json", cli("crucible-ledger", "verify", "--dir", d).stdout
    )
    assert healthy["damaged"] is False
    checked, problems = check_tree([tmp_path])
    assert checked == 1 and problems == []
