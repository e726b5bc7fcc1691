"""A wide fan-out's report folds its plain instances (crucible.run.report._fold,
docs/spec/run.md "Report", "At scale"): the task table, the ``--json`` rows and
the task totals are the same bytes folded or not; every failed, retried or
unsettled instance and the outliers stay rows; the HTML page draws the rest as
one density strip. The threshold is lowered here (``fold_above``) so a run of
a few dozen instances shows what a run of a million does."""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from crucible.run.report import _report as report
from crucible.run.report import _timeline as timeline
from crucible.run.report._fold import HEAVIEST, SLOWEST
from tests.run.dispatchtests import DISPATCH

Pack = Callable[..., Path]
N = 60

BODY = f"""
[[workflow.task]]
name = "items"
emits = {{ items = "array" }}
run = '''printf '{{"items": [' > "$CRUCIBLE_OUTPUT"; seq -s, 1 {N} >> "$CRUCIBLE_OUTPUT"; printf ']}}' >> "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["items"]
map = "items.items"
retry = {{ limit = 1 }}
on_failure = "continue"
run = '''
case "$CRUCIBLE_KEY" in
  *7) echo "seven is refused" >&2; exit 3 ;;
  *5) [ "${{CRUCIBLE_LAST_EXIT:-}}" ] || exit 4 ;;
esac
printf '{{}}' > "$CRUCIBLE_OUTPUT"
'''

[[workflow.task]]
name = "after"
needs = ["each"]
run = 'printf "{{}}" > "$CRUCIBLE_OUTPUT"'
"""


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: 60 instances, those ending in 7 failing, those ending in 5
    passing at their second attempt."""
    root = tmp_path_factory.mktemp("fold")
    pack = root / "pack.toml"
    pack.write_text(f'edition = 4\n\n[workflow]\nname = "fold"\n{BODY}')
    state = root / "state"
    done = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "-j", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return state


def _table(rows: report.Report) -> str:
    out = io.StringIO()
    report.render_table(rows, out, instances=False)
    return out.getvalue()


def _json(rows: report.Report) -> list[dict[str, object]]:
    return [report.row_json(r) for r in rows if r.key is None]


def test_folded_totals_are_the_same_bytes(wide: Path) -> None:
    whole = report.collect(wide, fold_above=None)
    folded = report.collect(wide, fold_above=0)
    assert _table(folded) == _table(whole)
    assert _json(folded) == _json(whole)
    each = next(r for r in folded if r.task == "each" and r.key is None)
    assert each.folded is not None and len(each.folded) > 0
    assert each.instances == N and each.counts == next(
        r.counts for r in whole if r.task == "each" and r.key is None
    )


def test_notable_instances_stay_rows(wide: Path) -> None:
    whole = report.collect(wide, fold_above=None)
    folded = report.collect(wide, fold_above=0)
    kept = {r.key for r in folded if r.task == "each" and r.key is not None}
    notable = {
        r.key
        for r in whole
        if r.task == "each" and r.key is not None and (r.status != "passed" or r.attempts > 1)
    }
    assert notable <= kept  # every failed and retried instance
    assert len(kept) < N  # and not every instance
    assert len(kept - notable) <= SLOWEST + 2 * HEAVIEST  # the outliers
    slowest = sorted(
        (r for r in whole if r.task == "each" and r.key not in notable and r.key is not None),
        key=lambda r: -(r.duration or 0.0),
    )[:3]
    assert {r.key for r in slowest} <= kept
    # rows keep item order
    order = [r.key for r in whole if r.task == "each" and r.key is not None]
    shown = [r.key for r in folded if r.task == "each" and r.key is not None]
    assert shown == [k for k in order if k in kept]


def test_a_run_cut_short_folds_alike(wide: Path, tmp_path: Path) -> None:
    """No aggregate record, half of the log and of the records: the same
    statuses, counts (instances never started included) and notes."""
    state = tmp_path / "cut"
    shutil.copytree(wide, state, symlinks=True)
    (state / "results" / "each.json").unlink()
    (state / "results" / "after.json").unlink()
    for name in ("session.jsonl", "results/each.jsonl"):
        lines = (state / name).read_bytes().splitlines(keepends=True)
        (state / name).write_bytes(b"".join(lines[: len(lines) // 2]))
    whole = report.collect(state, fold_above=None)
    folded = report.collect(state, fold_above=0)
    assert _table(folded) == _table(whole)
    assert _json(folded) == _json(whole)
    each = next(r for r in folded if r.task == "each" and r.key is None)
    assert each.counts.get("pending", 0) > 0


def test_folded_html_draws_a_strip_and_every_failure(wide: Path) -> None:
    whole = report.collect(wide, fold_above=None)
    folded = report.collect(wide, fold_above=0)
    page = timeline.render_report(folded, title="t")
    full = timeline.render_report(whole, title="t")
    assert 'class="r i fd"' in page and "folded" in page
    assert len(page) < len(full)
    failed = [r for r in whole if r.status == "failed" and r.key is not None]
    assert failed and all(f">{r.key}</b>" in page for r in failed)
    assert f"Failures ({len(failed)})" in page and f"Failures ({len(failed)})" in full
    assert f"{N}: " in page  # the group's count: every instance, folded or not
