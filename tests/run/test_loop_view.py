"""``crucible-dispatch report`` on a scored loop (issue 18 item 5; docs/spec/loop.md,
"Report"): the revisions table, the ``loop`` line of ``--json``, a damaged
``STATE/loop.json`` refused in one line, and the HTML chart checked in headless
Chromium (points, running best, kept and failed marks; 1 and 200 revisions).

The loop.json files are hand-written to the contract (docs/briefs loop contract,
docs/schemas/loop.json) on the state dir of a real run of a plain pack."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.run.dispatchtests import DISPATCH
from tests.run.test_timeline import browse, needs_chromium

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loopbase")
    pack = root / "pack.toml"
    pack.write_text(
        'edition = 3\n\n[workflow]\nname = "t"\n\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
    )
    state = root / "s"
    done = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return state


@pytest.fixture
def state(base_state: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "s"
    shutil.copytree(base_state, copy, symlinks=True)
    return copy


def revision(
    n: int,
    score: float | None,
    *,
    kept: bool,
    delta: float | None = None,
    note: str = "",
    verdict: str | None = None,
) -> dict[str, Any]:
    failed = score is None
    return {
        "revision": n,
        "status": "failed" if failed else "passed",
        "score": score,
        "verdict": verdict or ("failed" if failed else "improved" if kept else "not_improved"),
        "kept": kept,
        "note": note,
        "delta": delta,
        "fields": {} if failed else {"score": score},
        "duration_ms": 1000 + n,
    }


def loop_doc(
    revisions: list[dict[str, Any]],
    *,
    direction: str = "max",
    stop: str | None = "max_revisions",
    finished: bool = True,
    max_revisions: int = 10,
) -> dict[str, Any]:
    kept = [r for r in revisions if r["kept"]]
    return {
        "format": "crucible.loop/1",
        "direction": direction,
        "metric": "score",
        "max_revisions": max_revisions,
        "revisions": revisions,
        "kept_revision": kept[-1]["revision"] if kept else None,
        "best_score": kept[-1]["score"] if kept else None,
        "stop_reason": stop,
        "finished": finished,
    }


def simulate(
    scores: list[float | None], direction: str = "max", min_delta: float = 0.0
) -> list[dict[str, Any]]:
    """Revisions as the engine keeps them: the first passed one kept, then each
    one better than the kept score by more than min_delta."""
    out = []
    best: float | None = None
    for n, s in enumerate(scores, start=1):
        if s is None:
            out.append(revision(n, None, kept=False, note="evaluate: exited with status 1"))
            continue
        better = best is None or (
            s - best > min_delta if direction == "max" else best - s > min_delta
        )
        delta = None if best is None else round(s - best, 9)
        out.append(revision(n, s, kept=better, delta=delta, note=f"tried {n}"))
        if better:
            best = s
    return out


def write_loop(state: Path, doc: dict[str, Any], target: float | None = None) -> None:
    (state / "loop.json").write_text(json.dumps(doc))
    if target is not None:
        plan = json.loads((state / "plan.json").read_text())
        # a loop is an edition-4 member (IR v3): the report reads the plan
        # through the plan model, which refuses it in an older plan
        plan["version"], plan["edition"] = 3, 4
        plan["loop"] = {
            "body": ["a"],
            "direction": doc["direction"],
            "max_revisions": 10,
            "metric": "score",
            "min_delta": 0,
            "score": "a",
            "target": target,
            "history_bytes": 65536,
        }
        (state / "plan.json").write_text(json.dumps(plan))


def report(state: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, "report", str(state), *argv], capture_output=True, text=True, timeout=120
    )


SCORES = [0.5, 0.62, None, 0.6, 0.7, 0.69, None, 0.75]


# -- the table ----------------------------------------------------------------------


def test_table_lists_every_revision(state: Path) -> None:
    write_loop(state, loop_doc(simulate(SCORES), stop="patience"))
    done = report(state)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    task_table, loop = text.split("\nLOOP  ", 1)
    assert task_table.startswith("TASK") and "\na " in task_table
    head, *lines = loop.rstrip("\n").split("\n")
    assert head == (
        "metric score (higher is better); 8 of 10 revisions; 2 failed; stopped: patience; "
        "kept revision 8 (*), score 0.75"
    )
    assert re.split(r"\s{2,}", lines[0]) == [
        "REVISION",
        "STATUS",
        "SCORE",
        "BEST",
        "DELTA",
        "KEPT",
        "DURATION",
        "NOTE",
    ]
    rows = [re.split(r"\s+", line.strip()) for line in lines[1:]]
    assert [r[0] for r in rows] == [str(n) for n in range(1, 9)]
    by = {int(r[0]): r for r in rows}
    assert by[1][1:6] == ["passed", "0.5", "0.5", "-", "kept"]
    assert by[2][1:6] == ["passed", "0.62", "0.62", "+0.12", "kept"]
    assert by[3][1:5] == ["failed", "-", "0.62", "-"]  # failed: no score, best holds
    assert by[4][1:5] == ["passed", "0.6", "0.62", "-0.02"]
    assert "kept" not in by[4] and "kept" not in by[3]
    assert by[8][5:7] == ["kept", "*"]  # the kept revision at the end
    assert lines[3].endswith("evaluate: exited with status 1")


def test_min_direction_and_unfinished(state: Path) -> None:
    doc = loop_doc(simulate([3, 2, 5], direction="min"), direction="min", stop=None, finished=False)
    write_loop(state, doc)
    done = report(state)
    assert done.returncode == 0, done.stderr
    assert (
        "metric score (lower is better); 3 of 10 revisions; running; kept revision 2 (*), score 2"
        in done.stdout
    )
    assert re.search(r"^3\s+passed\s+5\s+2\s+\+3\s+", done.stdout, re.M)


def test_no_revision_kept(state: Path) -> None:
    write_loop(state, loop_doc(simulate([None, None]), stop="body_failed"))
    done = report(state)
    assert done.returncode == 0, done.stderr
    assert "stopped: body failed; no revision kept" in done.stdout


def test_note_is_escaped_and_cut(state: Path) -> None:
    revs = simulate([1.0])
    revs[0]["note"] = "line1\nline2\x1b[31m" + "x" * 300
    write_loop(state, loop_doc(revs))
    done = report(state)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.split("\n") if line.startswith("1 "))
    assert "line1\\nline2\\x1b[31m" in row and row.endswith("\u2026") and len(row) < 220


def test_no_loop_json_no_loop_block(state: Path) -> None:
    done = report(state)
    assert done.returncode == 0 and "LOOP" not in done.stdout
    lines = report(state, "--json").stdout.splitlines()
    assert all("loop" not in json.loads(line) for line in lines)


def test_task_report_leaves_the_loop_out(state: Path) -> None:
    write_loop(state, loop_doc(simulate([1.0])))
    done = report(state, "a")
    assert done.returncode == 0 and "LOOP" not in done.stdout
    assert all(
        "loop" not in json.loads(x) for x in report(state, "a", "--json").stdout.splitlines()
    )


# -- --json ----------------------------------------------------------------------------


def test_json_carries_the_loop_line(state: Path) -> None:
    write_loop(state, loop_doc(simulate(SCORES)), target=0.9)
    done = report(state, "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    assert lines[0]["task"] == "a"
    loop = lines[-1]["loop"]
    assert loop["kept_revision"] == 8 and loop["best_score"] == 0.75 and loop["target"] == 0.9
    revs = loop["revisions"]
    assert [r["revision"] for r in revs] == list(range(1, 9))
    assert [r["best"] for r in revs] == [0.5, 0.62, 0.62, 0.62, 0.7, 0.7, 0.7, 0.75]
    assert revs[2] == {
        "revision": 3,
        "status": "failed",
        "score": None,
        "best": 0.62,
        "delta": None,
        "kept": False,
        "note": "evaluate: exited with status 1",
        "verdict": "failed",
        "duration_ms": 1003,
    }
    assert revs[3]["delta"] == -0.02
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs/schemas/report-row.json").read_text())
    for line in lines:
        jsonschema.validate(line, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"loop": {**loop, "revisions": [{"revision": 0}]}}, schema)


# -- a damaged loop.json ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "where", "message"),
    [
        ([1, 2], "loop.json", "must hold a JSON object, not array"),
        ({"direction": "max"}, "loop.json", "missing required field 'revisions'"),
        ({"revisions": {}}, "loop.json:$.revisions", "revisions must be an array"),
        ({"revisions": [3]}, "loop.json:$.revisions[0]", "a revision must be an object"),
        (
            {"revisions": [{"revision": 1}]},
            "loop.json:$.revisions[0]",
            "missing required field 'status'",
        ),
        (
            {"revisions": [{"revision": 0, "status": "passed"}]},
            "loop.json:$.revisions[0].revision",
            "revision must be an integer >= 1, not 0",
        ),
        (
            {"revisions": [{"revision": 1, "status": "passed", "score": "high"}]},
            "loop.json:$.revisions[0].score",
            "score must be a number or null, not 'high'",
        ),
        (
            {"revisions": [{"revision": 1, "status": "passed", "kept": 1}]},
            "loop.json:$.revisions[0].kept",
            "kept must be a boolean, not 1",
        ),
        (
            {
                "revisions": [
                    {"revision": 2, "status": "passed"},
                    {"revision": 1, "status": "passed"},
                ]
            },
            "loop.json:$.revisions[1].revision",
            "must be in increasing order",
        ),
        (
            {"revisions": [], "direction": "up"},
            "loop.json:$.direction",
            "direction must be max or min",
        ),
        ({"revisions": [], "stop_reason": "bored"}, "loop.json:$.stop_reason", "known stop reason"),
        (
            {"revisions": [], "kept_revision": "1"},
            "loop.json:$.kept_revision",
            "an integer >= 1 or null",
        ),
    ],
)
def test_bad_loop_json_is_one_line_exit_2(state: Path, doc: Any, where: str, message: str) -> None:
    (state / "loop.json").write_text(json.dumps(doc))
    for argv in ((), ("--json",), ("--html", str(state.parent / "p.html"))):
        done = report(state, *argv)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        lines = done.stderr.strip().split("\n")
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"{state / where}" in lines[0] and message in lines[0], lines[0]


def test_unparseable_loop_json(state: Path) -> None:
    (state / "loop.json").write_text('{"revisions": [')
    done = report(state)
    assert done.returncode == 2 and "invalid JSON" in done.stderr and "loop.json" in done.stderr


def test_loop_json_symlink_and_fifo_refused(state: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(loop_doc(simulate([1.0]))))
    (state / "loop.json").symlink_to(outside)
    done = report(state)
    assert done.returncode == 2 and "symlink" in done.stderr, done.stderr
    (state / "loop.json").unlink()
    os.mkfifo(state / "loop.json")
    done = report(state)  # never waits for a writer
    assert done.returncode == 2 and "FIFO" in done.stderr, done.stderr


# -- the HTML chart in Chromium ---------------------------------------------------------

#: run in the page after layout: what the chart drew, for the test to read
_PROBE = """<script>
const svg = document.querySelector('svg.chart');
const r = svg.getBoundingClientRect();
const num = (e, a) => parseFloat(e.getAttribute(a));
const pts = [...svg.querySelectorAll('circle.pt')].map(c => ({
  rev: +c.dataset.rev, x: num(c, 'cx'), y: num(c, 'cy'), kept: c.classList.contains('kept'),
  w: c.getBoundingClientRect().width, tip: c.querySelector('title').textContent}));
const fails = [...svg.querySelectorAll('path.fail')].map(p => {
  const b = p.getBBox(); return {rev: +p.dataset.rev, x: b.x + b.width / 2, y: b.y + b.height / 2,
  tip: p.querySelector('title').textContent}; });
const line = svg.querySelector('polyline.best');
const best = line ? line.getAttribute('points').trim().split(/\\s+/).map(p => p.split(',').map(Number)) : [];
const finals = [...svg.querySelectorAll('circle.final')].map(c => ({x: num(c, 'cx'), y: num(c, 'cy')}));
const tgt = svg.querySelector('line.tgt');
const plot = svg.querySelector('path.ax').getBBox();
document.documentElement.dataset.m = JSON.stringify({
  width: r.width, height: r.height, pts, fails, best, finals, plot: [plot.x, plot.y, plot.width, plot.height],
  target: tgt ? num(tgt, 'y1') : null,
  bestLen: line ? line.getTotalLength() : 0});
</script></body>"""


def measure(state: Path, tmp_path: Path) -> dict[str, Any]:
    page = tmp_path / "page.html"
    done = report(state, "--html", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert (
        "<script src" not in text
        and "http" not in text.split("</style>", 2)[-1].split("<script>")[0]
    )
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", _PROBE, 1))
    dom = browse(probe, tmp_path / "profile", "--dump-dom").stdout
    found = re.search(r'data-m="([^"]*)"', dom)
    assert found, "the probe did not run"
    import html as html_mod

    return dict(json.loads(html_mod.unescape(found.group(1))))


def check_chart(m: dict[str, Any], revs: list[dict[str, Any]], direction: str) -> None:
    assert m["width"] > 300 and m["height"] > 100  # drawn, at a readable size
    passed = [r for r in revs if r["status"] == "passed"]
    failed = [r for r in revs if r["status"] == "failed"]
    pts = {p["rev"]: p for p in m["pts"]}
    assert sorted(pts) == [r["revision"] for r in passed]
    assert sorted(p["rev"] for p in m["pts"] if p["kept"]) == [
        r["revision"] for r in passed if r["kept"]
    ]
    assert sorted(f["rev"] for f in m["fails"]) == [r["revision"] for r in failed]
    assert all(p["w"] > 1 for p in m["pts"])  # each point is visible on screen
    px, py, pw, ph = m["plot"]
    for p in [*m["pts"], *m["fails"]]:
        assert px - 0.01 <= p["x"] <= px + pw + 0.01 and py - 0.01 <= p["y"] <= py + ph + 0.01, p
    # x grows with the revision number; failed marks sit on the axis, in their column
    xs = sorted((p["rev"], p["x"]) for p in [*m["pts"], *m["fails"]])
    assert all(a[1] < b[1] for a, b in itertools.pairwise(xs))
    for f in m["fails"]:
        assert f["y"] > max(p["y"] for p in m["pts"]) - 1e-6 or not m["pts"]
        assert "failed" in f["tip"]
    # higher score, higher on screen (SVG y grows downwards)
    scores = sorted((r["score"], pts[r["revision"]]["y"]) for r in passed)
    assert all(a[1] >= b[1] - 1e-6 for a, b in itertools.pairwise(scores))
    # the running best: a step line that never gets worse, through every kept point
    best = m["best"]
    assert len(best) >= 2
    ys = [y for _, y in best]
    if direction == "max":
        assert all(a >= b - 1e-6 for a, b in itertools.pairwise(ys))
    else:
        assert all(a <= b + 1e-6 for a, b in itertools.pairwise(ys))
    for r in passed:
        if r["kept"]:
            p = pts[r["revision"]]
            assert any(abs(x - p["x"]) < 0.02 and abs(y - p["y"]) < 0.02 for x, y in best), r
    # it runs to the last revision, at the kept score
    last_x = max(p["x"] for p in [*m["pts"], *m["fails"]])
    kept = [r for r in passed if r["kept"]]
    assert best[-1][0] >= last_x and abs(best[-1][1] - pts[kept[-1]["revision"]]["y"]) < 0.02
    # the kept revision ringed, once
    assert len(m["finals"]) == 1
    k = pts[kept[-1]["revision"]]
    assert abs(m["finals"][0]["x"] - k["x"]) < 0.02 and abs(m["finals"][0]["y"] - k["y"]) < 0.02
    assert "the kept revision" in k["tip"]


@needs_chromium
def test_chart_in_chromium(state: Path, tmp_path: Path) -> None:
    revs = simulate(SCORES)
    write_loop(state, loop_doc(revs), target=0.8)
    m = measure(state, tmp_path)
    check_chart(m, revs, "max")
    assert len(m["pts"]) == 6 and len(m["fails"]) == 2
    # the target line above every point (0.8 > 0.75)
    assert m["target"] is not None and m["target"] < min(p["y"] for p in m["pts"])
    tip = next(p["tip"] for p in m["pts"] if p["rev"] == 4)
    assert tip.startswith("revision 4: passed, score 0.6, delta -0.02") and "tried 4" in tip


@needs_chromium
def test_chart_one_revision(state: Path, tmp_path: Path) -> None:
    revs = simulate([0.3])
    write_loop(state, loop_doc(revs, max_revisions=1))
    m = measure(state, tmp_path)
    check_chart(m, revs, "max")
    assert len(m["pts"]) == 1 and m["bestLen"] > 10


@needs_chromium
def test_chart_two_hundred_revisions_min(state: Path, tmp_path: Path) -> None:
    import random

    rng = random.Random(18)
    scores: list[float | None] = [
        None if n % 17 == 0 else round(100 / (1 + n / 20) + rng.uniform(-8, 8), 4)
        for n in range(1, 201)
    ]
    revs = simulate(scores, direction="min", min_delta=0.5)
    write_loop(state, loop_doc(revs, direction="min", max_revisions=200))
    m = measure(state, tmp_path)
    check_chart(m, revs, "min")
    assert len(m["pts"]) + len(m["fails"]) == 200
    page = (tmp_path / "page.html").read_text()
    assert len(page) < 200_000  # inline, terse


def test_page_without_loop_has_no_chart(state: Path, tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    assert report(state, "--html", str(page)).returncode == 0
    # the Resources section draws its own small plots; the loop's chart is the
    # one svg of class "chart"
    assert '<svg class="chart"' not in page.read_text()


# -- the hand-written files are the engine's format ---------------------------------------


def test_fixtures_match_the_loop_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs/schemas/loop.json").read_text())
    for doc in (
        loop_doc(simulate(SCORES)),
        loop_doc(simulate([3, 2, 5], direction="min"), direction="min", stop=None, finished=False),
        loop_doc(simulate([None, None]), stop="body_failed"),
    ):
        jsonschema.validate(doc, schema)


def test_unknown_format_refused(state: Path) -> None:
    write_loop(state, {**loop_doc(simulate([1.0])), "format": "crucible.loop/9"})
    done = report(state)
    assert done.returncode == 2 and "loop.json:$.format" in done.stderr, done.stderr
    assert "crucible.loop/9" in done.stderr


# -- real runs ------------------------------------------------------------------------------

#: a one-task body (the score task) whose revision 2 fails and whose score
#: otherwise grows: revision N scores N / 10
FAILING = """edition = 4

[workflow]
name = "lv"

[[workflow.task]]
name = "score"
kind = "evaluate"
emits = { score = "number" }
run = '''
n=$(cat "$CRUCIBLE_INPUTS_DIR/revision")
if [ "$n" = 2 ]; then echo "revision 2 breaks" >&2; exit 1; fi
printf '{"verdict": "pass", "score": 0.%s}\\n' "$n" > "$CRUCIBLE_OUTPUT"
'''

[loop]
body = ["score"]
score = "score"
metric = "score"
max_revisions = 4
"""


def dispatch_run(pack: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(state)], capture_output=True, text=True, timeout=300
    )


def test_real_loop_report_table_json_and_timeline(tmp_path: Path) -> None:
    state = tmp_path / "s"
    done = dispatch_run(REPO / "examples/loop/pack.toml", state)
    assert done.returncode == 0, done.stderr
    text = report(state)
    assert text.returncode == 0, text.stderr
    # the body tasks count their revisions' attempts (instances @rev1..@rev4)
    assert re.search(r"^propose\s+passed\s+4\s", text.stdout, re.M), text.stdout
    assert re.search(r"^evaluate\s+passed\s+4\s", text.stdout, re.M), text.stdout
    assert "stopped: target; kept revision 4 (*), score 1; target 0.95" in text.stdout
    table = text.stdout.split("\nLOOP  ", 1)[1]
    assert [line.split()[0] for line in table.splitlines()[2:]] == ["1", "2", "3", "4"]
    one = report(state, "propose")
    assert re.findall(r"^propose\[(@rev[0-9]+)\]", one.stdout, re.M) == [
        "@rev1",
        "@rev2",
        "@rev3",
        "@rev4",
    ]
    lines = [json.loads(x) for x in report(state, "--json").stdout.splitlines()]
    loop = lines[-1]["loop"]
    assert [r["score"] for r in loop["revisions"]] == [0.1, 0.4, 0.7, 1]
    assert next(x for x in lines if x.get("task") == "propose")["instances"] == 4
    jsonschema = pytest.importorskip("jsonschema")
    rows = json.loads((REPO / "docs/schemas/report-row.json").read_text())
    for line in lines:
        jsonschema.validate(line, rows)
    page = tmp_path / "p.html"
    assert report(state, "--html", str(page)).returncode == 0
    html_text = page.read_text()
    assert html_text.count('class="pt kept" data-rev') == 4 and 'class="final"' in html_text
    assert 'class="tgt"' in html_text
    # each body task is a group of its revisions on the timeline
    assert html_text.count('<details class="g"') == 2 and html_text.count("@rev") >= 8


def test_real_loop_with_a_failed_revision(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(FAILING)
    state = tmp_path / "s"
    done = dispatch_run(pack, state)
    assert done.returncode in (0, 1), done.stderr
    text = report(state)
    assert text.returncode == 0, text.stderr
    table = text.stdout.split("\nLOOP  ", 1)[1]
    head, _, *rows = table.splitlines()
    assert "4 of 4 revisions; 1 failed; stopped: max revisions; kept revision 4 (*)" in head
    cells = [re.split(r"\s{2,}", r.strip()) for r in rows]
    assert cells[1][:3] == ["2", "failed", "-"] and cells[1][3] == "0.1"
    assert cells[2][:5] == ["3", "passed", "0.3", "0.3", "+0.2"]
    page = tmp_path / "p.html"
    assert report(state, "--html", str(page)).returncode == 0
    html_text = page.read_text()
    assert html_text.count('class="fail" data-rev') == 1 and 'data-rev="2"' in html_text
    # the failed revision's unit is open in its group on the timeline
    assert '<details class="g" open>' in html_text
