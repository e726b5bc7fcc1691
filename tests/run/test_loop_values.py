"""Issue 27 items 7, 8 and 21 (time_budget): a scored loop over extreme values —
a score from -1e308 to 1e308 (an infinite delta), a loop with no revision —
records, reports and resumes (docs/spec/loop.md)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

PACK = """edition = 4

[workflow]
name = "lv"

[[workflow.task]]
name = "score"
kind = "evaluate"
emits = {{ score = "number" }}
run = '''
n=$(cat "$CRUCIBLE_INPUTS_DIR/revision")
if [ "$n" = 1 ]; then s=-1e308; else s=1e308; fi
printf '{{"verdict": "pass", "score": %s}}\\n' "$s" > "$CRUCIBLE_OUTPUT"
'''

[loop]
body = ["score"]
score = "score"
metric = "score"
max_revisions = 3
{extra}
"""


def _run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([DISPATCH, *map(str, argv)], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _pack(tmp_path: Path, extra: str = "") -> Path:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK.format(extra=extra))
    return pack


def test_an_infinite_delta_is_recorded_as_none_and_reported(tmp_path: Path) -> None:
    # was: error: $: number inf is not finite (exit 2), and every --resume the same
    state = tmp_path / "s"
    done = _run(_pack(tmp_path), "--state", state)
    assert done.returncode == 0, done.stderr
    loop = json.loads((state / "loop.json").read_text())
    second = loop["revisions"][1]
    assert (second["score"], second["delta"], second["kept"]) == (1e308, None, True)
    assert second["note"] == "improved on revision 1 by more than a number can hold"
    table = _run("report", state)
    assert table.returncode == 0, table.stderr
    assert "kept revision 2 (*), score 1e+308" in table.stdout
    # was: OverflowError: cannot convert float infinity to integer
    page = tmp_path / "p.html"
    html = _run("report", state, "--html", page)
    assert html.returncode == 0, html.stderr
    text = page.read_text()
    assert 'class="pt kept" data-rev' in text
    # every coordinate of the chart is a finite number
    coords = re.findall(r'\b(?:x|y|x1|x2|y1|y2|cx|cy|d)="([^"]*)"', text)
    assert coords and not [c for c in coords if "nan" in c or "inf" in c]


def test_a_loop_with_no_revision_reports_and_fails_by_its_body(tmp_path: Path) -> None:
    # item 8: report's table was a TypeError (exit 70); item 21: the run's last
    # line said "run failed: 0 passed, 0 failed, 0 skipped"
    state = tmp_path / "s"
    done = _run(_pack(tmp_path, "time_budget = 1e-300"), "--state", state)
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert "run failed: 0 passed, 1 failed, 0 skipped" in last and "failed: score" in last
    table = _run("report", state)
    assert table.returncode == 0, table.stderr
    assert "0 of 3 revisions; stopped: time budget; no revision kept" in table.stdout
    assert "loop kept no revision: no revision ran (stopped by time_budget)" in table.stdout
    assert table.stdout.rstrip().endswith("NOTE")  # the header of an empty table
