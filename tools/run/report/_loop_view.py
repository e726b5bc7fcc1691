"""A scored loop as ``report`` shows it (docs/spec/loop.md, "Report").

Reads ``STATE/loop.json`` (written by the engine after every revision,
docs/schemas/loop.json) through the report's rules: a regular file only, each
member the report uses checked, a bad one ``loop.json:$.member: message``
(exit 2). It gives the revisions table under the task table, the ``loop``
line of ``report --json`` and the HTML page's chart: score per revision with
the running best, kept revisions marked, failed ones shown (inline SVG, no
script, no external resource) -- what autoresearch's notebook plots.
"""

from __future__ import annotations

import html
import math
import sys
from pathlib import Path
from typing import IO, Any

from crucible.core.errors import ParseError
from crucible.core.plan import Loop
from crucible.core.structs import dataclass
from crucible.run._display import clip, escape

__all__ = ["LoopView", "Revision", "load", "render_html", "render_table", "to_json"]

#: table cells: a note is cut to this many characters (``--json`` keeps it whole)
NOTE_CELL_MAX = 120
#: tooltips: characters of a note
TIP_MAX = 160
_STATUSES = ("passed", "failed")
_VERDICTS = ("improved", "not_improved", "failed")
_STOPS = ("target", "max_revisions", "patience", "time_budget", "body_failed", "interrupted")
_SAFE = 2**53 - 1
#: docs/schemas/loop.json ``format``
LOOP_FORMAT = "crucible.loop/1"


@dataclass(slots=True)
class Revision:
    revision: int
    status: str
    score: float | None
    kept: bool
    verdict: str | None = None
    note: str = ""
    delta: float | None = None
    duration_ms: float | None = None
    fields: dict[str, Any] | None = None
    #: the kept score once this revision settled (the running best), computed
    best: float | None = None


@dataclass(slots=True)
class LoopView:
    direction: str
    metric: str
    max_revisions: int | None
    revisions: list[Revision]
    kept_revision: int | None
    best_score: float | None
    stop_reason: str | None
    finished: bool
    #: the plan's loop target (plan.json ``loop.target``), for the chart
    target: float | None = None


# -- reading -------------------------------------------------------------------


def _type(value: Any) -> str:
    # lazy: run.report._state is not loaded with this module; only _type() needs it
    from crucible.run.report._state import _type as kind

    return kind(value)


def _number(value: Any) -> bool:
    """A JSON number of the canonical domain: finite, an integer within +-(2^53-1)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= _SAFE
    return isinstance(value, float) and math.isfinite(value)


def _int(value: Any, minimum: int) -> bool:
    return type(value) is int and minimum <= value <= _SAFE


def _member(
    obj: dict[str, Any], name: str, where: str, path: str, ok: Any, what: str, default: Any
) -> Any:
    if name not in obj:
        return default
    value = obj[name]
    if not ok(value):
        shown = value if _type(value) in ("integer", "number", "string") else None
        detail = f"{_type(value)}" if shown is None else f"{shown!r}"
        raise ParseError(f"{name} must be {what}, not {detail}", where=f"{where}:$.{path}{name}")
    return value


def _nullable(ok: Any) -> Any:
    return lambda v: v is None or ok(v)


def _revision(value: Any, where: str, i: int) -> Revision:
    path = f"revisions[{i}]."
    if not isinstance(value, dict):
        raise ParseError(
            f"a revision must be an object, not {_type(value)}", where=f"{where}:$.revisions[{i}]"
        )
    for name in ("revision", "status"):
        if name not in value:
            raise ParseError(f"missing required field {name!r}", where=f"{where}:$.revisions[{i}]")

    def get(name: str, ok: Any, what: str, default: Any = None) -> Any:
        return _member(value, name, where, path, ok, what, default)

    number = get("revision", lambda v: _int(v, 1), "an integer >= 1")
    status = get("status", lambda v: v in _STATUSES, "passed or failed")
    return Revision(
        revision=number,
        status=status,
        score=get("score", _nullable(_number), "a number or null"),
        kept=get("kept", lambda v: isinstance(v, bool), "a boolean", False),
        verdict=get("verdict", _nullable(lambda v: v in _VERDICTS), "a known verdict or null"),
        note=get("note", lambda v: isinstance(v, str), "a string", ""),
        delta=get("delta", _nullable(_number), "a number or null"),
        duration_ms=get(
            "duration_ms", _nullable(lambda v: _number(v) and v >= 0), "a number >= 0 or null"
        ),
        fields=get("fields", _nullable(lambda v: isinstance(v, dict)), "an object or null"),
    )


def body_tasks(loop: Loop | None) -> frozenset[str]:
    """The loop body's task names (of the plan's ``loop``): the report shows each
    as a group of its revisions (instance keys ``@rev<N>``), as a mapped task of
    its instances."""
    return frozenset() if loop is None else frozenset(loop.body)


def load(state: Path, loop: Loop | None) -> LoopView | None:
    """``STATE/loop.json`` checked, or None when the run has no loop; ``loop``
    is the plan's (its target is drawn on the chart)."""
    # lazy: not loaded with this module; only load() needs it
    import orjson

    # lazy: run.report._state, stage are not loaded with this module; only load() needs it
    from crucible.run.report._state import read_regular
    from crucible.stage import StateLayout

    path = StateLayout(state).loop_path
    data = read_regular(path, "loop.json")
    if data is None:
        return None
    where = str(path)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ParseError(f"invalid JSON: {exc}", where=where) from None
    if not isinstance(value, dict):
        raise ParseError(f"loop.json must hold a JSON object, not {_type(value)}", where=where)
    if "revisions" not in value:
        raise ParseError("missing required field 'revisions'", where=where)
    if value.get("format", LOOP_FORMAT) != LOOP_FORMAT:
        raise ParseError(
            f"unknown loop state format {value['format']!r} (expected {LOOP_FORMAT})",
            where=f"{where}:$.format",
        )

    def get(name: str, ok: Any, what: str, default: Any = None) -> Any:
        return _member(value, name, where, "", ok, what, default)

    raw = get("revisions", lambda v: isinstance(v, list), "an array")
    revisions = [_revision(r, where, i) for i, r in enumerate(raw)]
    for i, r in enumerate(revisions):
        if i and r.revision <= revisions[i - 1].revision:
            raise ParseError(
                f"revision {r.revision} follows revision {revisions[i - 1].revision}: "
                "revisions must be in increasing order",
                where=f"{where}:$.revisions[{i}].revision",
            )
    view = LoopView(
        direction=get("direction", lambda v: v in ("max", "min"), "max or min", "max"),
        metric=get("metric", lambda v: isinstance(v, str), "a string", "score"),
        max_revisions=get("max_revisions", _nullable(lambda v: _int(v, 1)), "an integer >= 1"),
        revisions=revisions,
        kept_revision=get(
            "kept_revision", _nullable(lambda v: _int(v, 1)), "an integer >= 1 or null"
        ),
        best_score=get("best_score", _nullable(_number), "a number or null"),
        stop_reason=get("stop_reason", _nullable(lambda v: v in _STOPS), "a known stop reason"),
        finished=get("finished", lambda v: isinstance(v, bool), "a boolean", False),
        target=None if loop is None or loop.target is None else float(loop.target),
    )
    _running_best(view)
    return view


def _running_best(view: LoopView) -> None:
    """Each revision's ``best``: the score kept once it settled. A revision
    counts as kept when it says so or its verdict is ``improved`` (an engine
    that clears ``kept`` on a superseded revision still draws its step)."""
    best: float | None = None
    for r in view.revisions:
        if r.status == "passed" and r.score is not None and (r.kept or r.verdict == "improved"):
            best = r.score
        r.best = best


# -- text ------------------------------------------------------------------------


def number_text(x: float | None, sign: bool = False) -> str:
    """A score for people: up to 6 significant digits (``--json`` keeps it exact)."""
    if x is None:
        return "-"
    text = str(x) if isinstance(x, int) and abs(x) < 10**15 else f"{x:.6g}"
    return f"+{text}" if sign and x > 0 else text


def _cells(view: LoopView, r: Revision, note_max: int) -> tuple[str, ...]:
    """One revision's cells, as the table and the HTML page show them."""
    return (
        str(r.revision),
        r.status,
        number_text(r.score),
        number_text(r.best),
        number_text(r.delta, sign=True),
        _kept_cell(view, r),
        "-" if r.duration_ms is None else f"{r.duration_ms / 1000:.3f}s",
        clip(escape(r.note), note_max),
    )


def _kept_cell(view: LoopView, r: Revision) -> str:
    if r.revision == view.kept_revision:
        return "kept *"
    return "kept" if r.kept or r.verdict == "improved" else ""


def summary(view: LoopView) -> str:
    """One line: metric and direction, revisions, stop reason, the kept revision."""
    done = len(view.revisions)
    of = f" of {view.max_revisions}" if view.max_revisions is not None else ""
    better = "higher" if view.direction == "max" else "lower"
    parts = [f"metric {escape(view.metric)} ({better} is better)", f"{done}{of} revisions"]
    failed = sum(1 for r in view.revisions if r.status == "failed")
    if failed:
        parts.append(f"{failed} failed")
    if view.stop_reason is not None:
        parts.append(f"stopped: {view.stop_reason.replace('_', ' ')}")
    elif not view.finished:
        parts.append("running")
    if view.kept_revision is not None:
        parts.append(
            f"kept revision {view.kept_revision} (*), score {number_text(view.best_score)}"
        )
    else:
        parts.append("no revision kept")
    if view.target is not None:
        parts.append(f"target {number_text(view.target)}")
    return "; ".join(parts)


def render_table(view: LoopView, out: IO[str]) -> None:
    """The revisions table: number, status, score, running best, delta, kept,
    duration, note (``*`` marks the final kept revision)."""
    out.write(f"\nLOOP  {summary(view)}\n")
    header = ("REVISION", "STATUS", "SCORE", "BEST", "DELTA", "KEPT", "DURATION", "NOTE")
    rows = [_cells(view, r, NOTE_CELL_MAX) for r in view.revisions]
    # max over a list: with no revision (zero rows) max(len(h)) was a TypeError
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(header)]
    for cells in (header, *rows):
        padded = "  ".join(c.ljust(widths[i]) for i, c in enumerate(cells[:-1]))
        out.write(f"{padded}  {cells[-1]}".rstrip(" ") + "\n")


def to_json(view: LoopView) -> dict[str, Any]:
    """The ``report --json`` loop line's value (report-row.json ``$defs/loop``):
    exact numbers, raw notes, each revision's running ``best``."""
    revisions = []
    for r in view.revisions:
        item: dict[str, Any] = {
            "revision": r.revision,
            "status": r.status,
            "score": r.score,
            "best": r.best,
            "delta": r.delta,
            "kept": r.kept,
            "note": r.note,
        }
        if r.verdict is not None:
            item["verdict"] = r.verdict
        if r.duration_ms is not None:
            item["duration_ms"] = r.duration_ms
        revisions.append(item)
    data: dict[str, Any] = {
        "direction": view.direction,
        "metric": view.metric,
        "max_revisions": view.max_revisions,
        "kept_revision": view.kept_revision,
        "best_score": view.best_score,
        "stop_reason": view.stop_reason,
        "finished": view.finished,
        "revisions": revisions,
    }
    if view.target is not None:
        data["target"] = view.target
    return data


# -- the chart -----------------------------------------------------------------------

#: the chart's drawing box (SVG user units; the page scales it to its width)
W, H = 800.0, 300.0
LEFT, RIGHT, TOP, BOTTOM = 64.0, 16.0, 14.0, 42.0

_CSS = """
.loop{margin:.6em 0 1.2em}
.loop svg.chart{width:100%;max-width:1000px;height:auto;display:block;border:1px solid #e4e6ea;background:#fff}
.loop .ax{stroke:#888;stroke-width:1;fill:none}
.loop .gr{stroke:#eceff3;stroke-width:1}
.loop text{font:11px monospace;fill:#555}
.loop .best{fill:none;stroke:#2e6fd1;stroke-width:2}
.loop .tgt{stroke:#b08a00;stroke-width:1;stroke-dasharray:5 4}
.loop .pt{fill:#fff;stroke:#8a94a6;stroke-width:1.5}
.loop .pt.kept{fill:#2e9d4f;stroke:#1d6b34}
.loop .final{fill:none;stroke:#1d6b34;stroke-width:2}
.loop .fail{stroke:#d1422f;stroke-width:2.2;fill:none}
.loop .legend span{display:inline-block;margin-right:1.1em;white-space:nowrap}
.loop summary{cursor:pointer;margin-top:.4em} .loop summary::before{content:"\\25b8 "} .loop details[open]>summary::before{content:"\\25be "}
.loop table{border-collapse:collapse;margin-top:.4em}
.loop td,.loop th{border-top:1px solid #e4e6ea;padding:.15em .8em .15em 0;text-align:left;font:12px monospace}
"""


#: the largest power of ten a float holds (1e308)
_MAX_EXP = 308


def _nice_ticks(lo: float, hi: float, count: int = 8) -> list[float]:
    """Round tick values covering [lo, hi]: a step of 1, 2 or 5 x 10^k."""
    # halves first: hi − lo of scores near ±1e308 is inf (an OverflowError below)
    raw = (hi / 2 - lo / 2) / max(count - 1, 1) * 2
    if not math.isfinite(raw):
        raw = sys.float_info.max
    exp = math.floor(math.log10(raw)) if raw > 0 else 0
    step = min(
        (
            m * 10.0**e
            for m in (1, 2, 5)
            for e in (exp - 1, exp, exp + 1)
            if e <= _MAX_EXP and math.isfinite(m * 10.0**e) and m * 10.0**e >= raw
        ),
        default=raw or 1.0,
    )
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    k = 0
    while first + k * step <= hi + step * 1e-9 and k < 50:
        ticks.append(round(first + k * step, 12))
        k += 1
    return ticks


class _Scale:
    def __init__(self, view: LoopView) -> None:
        self.n = max((r.revision for r in view.revisions), default=1)
        values = [r.score for r in view.revisions if r.score is not None]
        if view.target is not None:
            values.append(view.target)
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        # in halves, and the padded ends kept within a float's range: scores
        # near ±1e308 have a span past it
        half_span = hi / 2 - lo / 2
        pad = (abs(hi) * 0.1 or 1.0) if half_span < 5e-13 else half_span * 0.12
        top = sys.float_info.max
        self.lo, self.hi = float(max(lo - pad, -top)), float(min(hi + pad, top))

    def x(self, revision: int) -> float:
        return LEFT + (revision - 0.5) / self.n * (W - LEFT - RIGHT)

    def y(self, score: float) -> float:
        share = (self.hi / 2 - score / 2) / (self.hi / 2 - self.lo / 2)
        return TOP + share * (H - TOP - BOTTOM)


def _f(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _tip(view: LoopView, r: Revision) -> str:
    parts = [f"revision {r.revision}: {r.status}"]
    if r.score is not None:
        parts.append(f"{view.metric} {number_text(r.score)}")
    if r.delta is not None:
        parts.append(f"delta {number_text(r.delta, sign=True)}")
    if r.revision == view.kept_revision:
        parts.append("the kept revision")
    elif r.kept:
        parts.append("kept")
    text = ", ".join(parts)
    if r.note:
        text += " \u2014 " + clip(escape(r.note), TIP_MAX)
    return html.escape(text)


_X_STEPS = (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000)


def _axes(view: LoopView, s: _Scale) -> list[str]:
    x0, x1, y0, y1 = LEFT, W - RIGHT, TOP, H - BOTTOM
    out = []
    for t in _nice_ticks(s.lo, s.hi):
        y = s.y(t)
        out.append(
            f'<line class="gr" x1="{_f(x0)}" x2="{_f(x1)}" y1="{_f(y)}" y2="{_f(y)}"/>'
            f'<text x="{_f(x0 - 6)}" y="{_f(y + 4)}" text-anchor="end">{number_text(t)}</text>'
        )
    # at most about 12 labelled revisions, at round steps (1, 2, 5, 10, 20, 25, 50 ...)
    step = next(c for c in _X_STEPS if s.n / c <= 12)
    for rev in sorted({1, *range(step, s.n + 1, step)}):
        x = s.x(rev)
        out.append(
            f'<line class="ax" x1="{_f(x)}" x2="{_f(x)}" y1="{_f(y1)}" y2="{_f(y1 + 4)}"/>'
            f'<text class="xt" x="{_f(x)}" y="{_f(y1 + 16)}" text-anchor="middle">{rev}</text>'
        )
    out.append(
        f'<path class="ax" d="M{_f(x0)} {_f(y0)}V{_f(y1)}H{_f(x1)}"/>'
        f'<text x="{_f((x0 + x1) / 2)}" y="{_f(H - 6)}" text-anchor="middle">revision</text>'
        f'<text x="12" y="{_f((y0 + y1) / 2)}" text-anchor="middle" '
        f'transform="rotate(-90 12 {_f((y0 + y1) / 2)})">{html.escape(escape(view.metric))}</text>'
    )
    return out


def _best_line(view: LoopView, s: _Scale) -> str:
    """A step line: flat while the kept score holds, a step where a revision
    was kept, to the last revision."""
    points: list[tuple[float, float]] = []
    held: float | None = None
    half = (W - LEFT - RIGHT) / s.n / 2
    for r in view.revisions:
        if r.best is None:
            continue
        x = s.x(r.revision)
        if held is None:
            points.append((x - half if s.n > 1 else x - half / 2, s.y(r.best)))
        elif r.best != held:
            points.append((x, s.y(held)))
        points.append((x, s.y(r.best)))
        held = r.best
    if not points:
        return ""
    points.append((points[-1][0] + half, points[-1][1]))
    text = " ".join(f"{_f(x)},{_f(y)}" for x, y in points)
    return f'<polyline class="best" points="{text}"/>'


def chart(view: LoopView) -> str:
    """The SVG: grid and axes, the target (dashed), the running best (a step
    line), one point per scored revision (filled: kept; ringed: the kept
    revision at the end), a red cross on the axis per failed revision."""
    s = _Scale(view)
    parts = [
        f'<svg class="chart" viewBox="0 0 {_f(W)} {_f(H)}" role="img" '
        f'aria-label="{html.escape(escape(view.metric))} per revision">',
        *_axes(view, s),
    ]
    if view.target is not None:
        y = s.y(view.target)
        parts.append(
            f'<line class="tgt" x1="{_f(LEFT)}" x2="{_f(W - RIGHT)}" y1="{_f(y)}" y2="{_f(y)}">'
            f"<title>target {number_text(view.target)}</title></line>"
        )
    parts.append(_best_line(view, s))
    radius = 4.5 if s.n <= 60 else 3.0 if s.n <= 400 else 2.0
    base = H - BOTTOM
    for r in view.revisions:
        x = s.x(r.revision)
        tip = f"<title>{_tip(view, r)}</title>"
        if r.status == "failed" or r.score is None:
            d = radius
            y = base - d - 2
            parts.append(
                f'<path class="fail" data-rev="{r.revision}" d="M{_f(x - d)} {_f(y - d)}'
                f"L{_f(x + d)} {_f(y + d)}M{_f(x - d)} {_f(y + d)}L{_f(x + d)} {_f(y - d)}"
                f'">{tip}</path>'
            )
            continue
        kept = r.kept or r.verdict == "improved"
        y = s.y(r.score)
        if r.revision == view.kept_revision:
            parts.append(f'<circle class="final" cx="{_f(x)}" cy="{_f(y)}" r="{_f(radius + 3)}"/>')
        parts.append(
            f'<circle class="pt{" kept" if kept else ""}" data-rev="{r.revision}" '
            f'cx="{_f(x)}" cy="{_f(y)}" r="{_f(radius)}">{tip}</circle>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend(view: LoopView) -> str:
    svg = '<svg width="14" height="14" viewBox="0 0 14 14" style="vertical-align:-2px">{}</svg>'
    items = [
        (svg.format('<circle class="pt kept" cx="7" cy="7" r="4.5"/>'), "kept"),
        (svg.format('<circle class="pt" cx="7" cy="7" r="4.5"/>'), "not kept"),
        (
            svg.format(
                '<circle class="final" cx="7" cy="7" r="6"/>'
                '<circle class="pt kept" cx="7" cy="7" r="3.5"/>'
            ),
            "the kept revision",
        ),
        (svg.format('<path class="fail" d="M3 3L11 11M3 11L11 3"/>'), "failed (no score)"),
        (svg.format('<path class="best" d="M1 10H7V4H13"/>'), "running best"),
    ]
    if view.target is not None:
        items.append((svg.format('<path class="tgt" d="M0 7H14"/>'), "target"))
    return (
        '<div class="legend">'
        + "".join(f"<span>{icon} {label}</span>" for icon, label in items)
        + "</div>"
    )


def _table(view: LoopView) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("revision", "status", "score", "best", "delta", "kept", "duration", "note")
    )
    rows = []
    for r in view.revisions:
        cells = _cells(view, r, 300)
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return (
        f"<details><summary>revisions ({len(view.revisions)})</summary>"
        f"<table><tr>{head}</tr>{''.join(rows)}</table></details>"
    )


def render_html(view: LoopView) -> str:
    """The page's loop section: a heading, the summary line, the legend, the
    chart and the revisions table (collapsed)."""
    return (
        f"<style>{_CSS}</style>"
        f'<section class="loop" id="loop"><h2>Loop</h2>'
        f'<p class="sum">{html.escape(summary(view))}.</p>'
        f"{_legend(view)}{chart(view)}{_table(view)}</section>"
    )
