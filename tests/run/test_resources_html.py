"""``report --html``'s Resources section and ``report --tsv`` (issue 29 items 2
and 3): a real run of known cost, and a 10,000-instance state whose every
attempt carries usage, checked in headless Chromium (page size, every task
present, no script errors) with a screenshot written for people to look at."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from tests.run.dispatchtests import DISPATCH, write_pack
from tests.run.test_timeline import CHROMIUM, FLAGS, MiB, N, needs_chromium, write_big_state

#: Nextflow's trace fields a trace-parsing script reads, in raw units
#: (``trace.raw = true``: milliseconds, bytes, %cpu a number)
NEXTFLOW_FIELDS = (
    "task_id",
    "name",
    "status",
    "exit",
    "attempt",
    "realtime",
    "%cpu",
    "peak_rss",
    "read_bytes",
    "write_bytes",
    "vol_ctxt",
    "inv_ctxt",
)

_OUT = 'echo {} > "$CRUCIBLE_OUTPUT"'
PACK = f"""
edition = 4

[workflow]
name = "res"

[[workflow.task]]
name = "list"
emits = {{ items = "array" }}
run = 'printf "{{\\"items\\": %s}}" "$(cat "$CRUCIBLE_PACK_DIR/items.json")" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "hog"
resources = {{ memory = "64MiB" }}
run = 'python3 -c "b = bytearray(100 * 1024 * 1024)" && {_OUT}'

[[workflow.task]]
name = "each"
needs = ["list"]
map = "list.items"
resources = {{ cpus = 2 }}
run = 'sleep 0.1 && {_OUT}'
"""


@pytest.fixture(scope="module")
def small_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: a list, a task over its memory request, ten instances."""
    root = tmp_path_factory.mktemp("small")
    (root / "items.json").write_text(json.dumps(list("abcdefghij")))
    pack = write_pack(root, PACK)
    state = root / "state"
    done = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "-j", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return state


def report(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [DISPATCH, "report", str(state), *args], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_tsv_reads_as_a_nextflow_trace(small_state: Path) -> None:
    done = report(small_state, "--tsv", "-")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(done.stdout.splitlines(), delimiter="\t"))
    assert rows and set(NEXTFLOW_FIELDS) <= set(rows[0])
    assert len(rows) == 12  # list, hog, ten instances: one row per attempt
    assert [int(r["task_id"]) for r in rows] == list(range(1, 13))
    by_name = {r["name"]: r for r in rows}
    assert {"list", "hog", "each (0)", "each (9)"} <= set(by_name)
    for r in rows:
        assert r["status"] == "COMPLETED" and r["exit"] == "0" and r["attempt"] == "1"
        assert int(r["realtime"]) >= 0  # milliseconds
        assert 0 <= float(r["%cpu"]) <= 400  # percent, a number
        assert int(r["peak_rss"]) > 1 << 20  # bytes
        for field in ("read_bytes", "write_bytes", "vol_ctxt", "inv_ctxt"):
            assert int(r[field]) >= 0
    hog = by_name["hog"]
    assert abs(int(hog["peak_rss"]) - 110 * MiB) < 15 * MiB  # the interpreter and its 100 MiB
    assert int(by_name["each (2)"]["realtime"]) >= 100  # sleep 0.1
    assert by_name["each (2)"]["process"] == "each" and by_name["each (2)"]["tag"] == "2"
    # to a file, and never with --html or --json
    trace = small_state.parent / "trace.txt"
    assert report(small_state, "--tsv", str(trace)).returncode == 0
    assert trace.read_text() == done.stdout
    both = report(small_state, "--tsv", "-", "--json")
    assert both.returncode == 2 and both.stderr.count("\n") == 1


def test_json_rows_carry_usage(small_state: Path) -> None:
    done = report(small_state, "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["task"]: r for r in map(json.loads, done.stdout.splitlines())}
    hog = rows["hog"]
    assert hog["max_rss_kib"] > 100 * 1024 and "rss_bound" not in hog
    assert hog["cpu_s"] > 0 and hog["cpu_pct"] > 0
    spread = rows["each"]["usage"]
    assert spread["units"] == 10
    assert set(spread["cpu_s"]) == {"sum", "max", "median"}
    assert set(spread["cpu_pct"]) == {"max", "median"}
    table = report(small_state).stdout
    assert table.splitlines()[0].split()[6:11] == ["CPU", "%CPU", "PEAK_RSS", "READ", "WRITE"]
    assert re.search(r"^    usage of 10 units: cpu sum [0-9.]+s max", table, re.M)


def browse(page: Path, tmp: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    """Chromium on ``page`` with its console on stderr (script errors show there)."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={tmp / ('profile' + '-'.join(m[2:8] for m in mode))}",
            *mode,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Uncaught" not in done.stderr and "SyntaxError" not in done.stderr
    return done


def _resources(dom: str) -> str:
    start = dom.index('id="resources"')
    return dom[start : dom.index('class="top"', start)]


@needs_chromium
def test_resources_section_at_ten_units_in_chromium(small_state: Path, tmp_path: Path) -> None:
    page = tmp_path / "small.html"
    assert report(small_state, "--html", str(page)).returncode == 0
    dom = browse(page, tmp_path, "--dump-dom").stdout
    section = _resources(dom)
    for task in ("list", "hog", "each"):
        assert f"<td>{task}</td>" in section
    # hog asked for 64 MiB and used ~110: flagged; each instance reserved 2
    # CPUs and slept
    assert re.search(r"memory 64\.0 MiB: median 1[5-9][0-9]%", section)
    assert "1 over memory" in section and "10 used &lt;25% of CPUs" in section
    # the heaviest units link to their timeline rows, which exist
    links = re.findall(r'<a href="#(u[0-9]+)">', section)
    assert links and all(f'id="{anchor}"' in dom for anchor in links)
    # a bar's title says what the attempt cost
    assert re.search(r'class="bar"[^>]*title="[0-9]+% cpu, (&lt;=)?[0-9.]+M"', dom)
    shot = tmp_path / "resources-10.png"
    browse(page, tmp_path, f"--screenshot={shot}")
    assert shot.stat().st_size > 1000
    print(f"screenshot: {shot}")


def _with_usage(state: Path) -> None:
    """Every task_finished of the big state gains usage (deterministic, varied),
    and the plan declares resources for ``each``."""
    lines = (state / "session.jsonl").read_bytes().splitlines()
    out = []
    for n, line in enumerate(lines):
        event: dict[str, Any] = json.loads(line)
        if event["event"] == "task_finished" and "attempt" in event:
            wall = float(event.get("duration") or 0.01)
            event.update(
                cpu_user_s=round(wall * (0.1 + (n % 9) / 10), 6),
                cpu_sys_s=0.002,
                max_rss_kib=18_000 + (n * 37) % 300_000,
                spawner_rss_kib=20_000,
                read_bytes=4096 * (n % 50),
                write_bytes=512 * (n % 3000),
                vol_ctxt=n % 40,
                inv_ctxt=n % 7,
            )
        out.append(canon.dumps(event))
    (state / "session.jsonl").write_bytes(b"\n".join(out) + b"\n")
    plan = json.loads((state / "plan.json").read_text())
    # resources are an edition-4 member (IR v3): the report reads the plan
    # through the plan model, which refuses them in an older plan
    plan["version"], plan["edition"] = 3, 4
    for task in plan["tasks"]:
        if task["name"] == "each":
            task["resources"] = {"memory": 256 * MiB, "cpus": 1}
    (state / "plan.json").write_text(json.dumps(plan))


@pytest.fixture(scope="module")
def big_measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state, _ = write_big_state(tmp_path_factory.mktemp("big-usage"), failures=30)
    _with_usage(state)
    return state


@needs_chromium
def test_resources_section_at_ten_thousand_instances_in_chromium(
    big_measured: Path, tmp_path: Path
) -> None:
    page = tmp_path / "big.html"
    assert report(big_measured, "--html", str(page)).returncode == 0
    size = page.stat().st_size
    assert size <= 2 * MiB, size
    text = page.read_text()
    section = _resources(text)
    # aggregated per task: the section does not grow with the instances
    assert len(section) < 20_000, len(section)
    for task in ("items", "each", "count"):  # every task, count too (skipped: nothing ran)
        assert f"<td>{task}</td>" in section
    assert f'<td class="n">{N}</td>' in section  # every instance of each measured
    assert '<td class="n">0</td><td colspan="6">no attempt measured</td>' in section
    assert "over memory" in section  # ~some instances above 256 MiB
    assert section.count("<a href=") == 20
    dom = browse(page, tmp_path, "--dump-dom").stdout
    assert 'id="resources"' in dom and dom.count('class="bar"') == text.count('class="bar"')
    shot = tmp_path / "resources-10000.png"
    browse(page, tmp_path, f"--screenshot={shot}")
    assert shot.stat().st_size > 1000
    print(f"page {size / MiB:.2f} MiB; screenshot: {shot}")
