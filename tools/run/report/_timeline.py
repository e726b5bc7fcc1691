"""The HTML timeline of ``report --html``: one self-contained page.

Readable at 10,000 instances: the failures first (unit, note, log path, stderr
tail), then a sticky header with the legend and a time axis, then one row per
top-level task and one collapsible group per mapped task (a ``<details>``
element: no script needed; collapsed when every instance passed) holding its
instances in item order. Every attempt is a bar (class ``bar``, status in
``data-s``); sessions are laid side by side with the idle time between them
cut out and their boundary marked. Markup is kept terse so 10,000 instances
stay well under 2 MiB; rows off screen skip layout (``content-visibility``).
"""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from crucible.run._display import clip, escape, name_signals
from crucible.run.report._report import Report, display_note
from crucible.run.report._usage import unit_usage

if TYPE_CHECKING:
    from crucible.run.report._fold import Folded
    from crucible.run.report._report import Attempt, Row, Session

__all__ = ["FAILURES_SHOWN", "render", "render_report"]

#: failed units listed (with their stderr tail) in the summary at the top
FAILURES_SHOWN = 50
#: characters of a key in a row label, of a note in a tooltip
LABEL_MAX = 40
TIP_MAX = 120
#: width (percent of the lane) of the cut between two sessions
GAP = 2.0
#: a folded task's plain instances are drawn as this many density bars
STRIP_BINS = 200

#: status -> (one-letter code used in data-s, colour)
STATUS_STYLE = {
    "passed": ("p", "#2e9d4f"),
    "failed": ("f", "#d1422f"),
    "tolerated": ("t", "#e8958a"),
    "skipped": ("s", "#9a9a9a"),
    "interrupted": ("i", "#e0a526"),
    "running": ("r", "#4a7fd1"),
    "pending": ("q", "#cfd8e3"),
    "not_selected": ("n", "#eceff3"),
}

_CSS = """
*{box-sizing:border-box}
body{font:13px system-ui,sans-serif;margin:0 1.2em 2em;color:#222}
h1{font-size:1.25em;margin:.6em 0 .2em} h2{font-size:1.05em;margin:1em 0 .3em}
.sum{color:#444;margin:.2em 0 .6em}
.top{position:sticky;top:0;z-index:3;background:#fff;border-bottom:1px solid #ccd;padding:.3em 0}
.legend span{display:inline-block;margin-right:1.1em;white-space:nowrap}
.sw{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:-.1em}
.sw.sb{width:2px;background:#333}
.fails{max-height:38vh;overflow:auto;margin-bottom:.8em;border:1px solid #e4e6ea;padding:0 .4em}
.fail{border-collapse:collapse;max-width:100%}
.fail td,.fail th{border-top:1px solid #e4e6ea;padding:.25em .6em .25em 0;text-align:left;vertical-align:top}
.fail td:first-child{font-family:monospace;white-space:nowrap}
.fail pre{margin:.2em 0 0;padding:.3em;background:#fbf3f2;white-space:pre-wrap;font-size:12px;max-height:9em;overflow:auto}
.tl{position:relative}
.r{display:flex;align-items:center;height:15px}
.r>b,.r>span:first-child{flex:0 0 200px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;font:12px monospace;font-weight:normal}
details>.r>span:first-child{font-weight:bold}
.r>s{position:relative;flex:1;height:11px;background:#f3f5f8;text-decoration:none}
.r>u{flex:0 0 170px;padding-left:8px;font:12px monospace;color:#555;white-space:nowrap;overflow:hidden;text-decoration:none}
.g>.r{height:18px;background:#eef1f6;cursor:pointer}
.g .r>b{padding-left:1.2em}
.i{content-visibility:auto;contain-intrinsic-size:auto 15px}
.fd>b{font-style:italic}
summary{list-style:none} summary::-webkit-details-marker{display:none}
summary>span:first-child::before{content:"\\25b8 "} details[open]>summary>span:first-child::before{content:"\\25be "}
.bar,.span{position:absolute;top:0;height:11px;min-width:2px}
.span{top:3px;height:5px}
[data-s][data-c]{background:#9fd8ae repeating-linear-gradient(45deg,#2e9d4f 0 2px,transparent 2px 5px)}
.bar[data-s=t]{background-image:repeating-linear-gradient(-45deg,#fff8 0 3px,transparent 3px 6px)}
.ov{position:absolute;top:0;bottom:0;left:200px;right:170px;pointer-events:none;z-index:2}
.ov i{position:absolute;top:0;bottom:0;border-left:2px dashed #333}
.ax{height:3.2em;align-items:flex-end}
.ax>s{background:none;height:3em;border-bottom:1px solid #888}
.tk{position:absolute;bottom:0;height:5px;border-left:1px solid #888}
.tk em{position:absolute;bottom:6px;left:2px;font:11px monospace;font-style:normal;color:#555;white-space:nowrap}
.sl{position:absolute;top:0;font:11px system-ui,sans-serif;color:#222;white-space:nowrap;padding-left:3px;border-left:2px dashed #333;height:1.3em}
[data-s=p]{background:#2e9d4f}[data-s=f]{background:#d1422f}[data-s=t]{background-color:#e8958a}
[data-s=s]{background:#9a9a9a}[data-s=i]{background:#e0a526}[data-s=r]{background:#4a7fd1}[data-s=q]{background:#cfd8e3}[data-s=n]{background:#eceff3;outline:1px dashed #aab}
"""


def _code(status: str, tolerated: bool = False) -> str:
    if tolerated and status == "failed":
        return "t"
    return STATUS_STYLE.get(status, ("q", ""))[0]


class _Axis:
    """Maps (session, time) to a percentage of the lane: sessions side by side,
    each as wide as its share of the run's busy time, cut apart by GAP."""

    def __init__(self, sessions: list[Session]) -> None:
        self.sessions = sessions
        lengths = [max(s.end - s.start, 1e-3) for s in sessions]
        total = sum(lengths)
        usable = 100.0 - GAP * max(len(sessions) - 1, 0)
        self.offset: dict[int, float] = {}
        self.scale = usable / (total or 1.0)
        x = 0.0
        for s, length in zip(sessions, lengths, strict=True):
            self.offset[s.number] = x
            x += length * self.scale + GAP
        self.start = {s.number: s.start for s in sessions}
        self.busy = total

    def x(self, session: int, t: float) -> float:
        off = self.offset.get(session)
        if off is None:
            return 0.0
        return min(max(off + (t - self.start[session]) * self.scale, 0.0), 100.0)


def _nice_step(span: float, ticks: int = 8) -> float:
    """The smallest 1, 2 or 5 x 10^k seconds that gives at most ``ticks`` ticks."""
    raw = max(span / ticks, 1e-3)
    return min(m * 10.0**e for m in (1, 2, 5) for e in range(-3, 8) if m * 10.0**e >= raw)


def _fmt_seconds(s: float) -> str:
    if s >= 1:
        s = round(s)
    if s >= 3600:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    if s >= 60:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{s:g}s" if s >= 1 or s == 0 else f"{s * 1000:g}ms"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _axis_row(axis: _Axis) -> str:
    parts = ['<div class="r ax"><span></span><s>']
    step = _nice_step(axis.busy)
    previous_end: float | None = None
    for s in axis.sessions:
        left = axis.offset[s.number]
        label = f"session {s.number} \u00b7 {_clock(s.start)}"
        if previous_end is not None:
            label += f" (after {_fmt_seconds(max(s.start - previous_end, 0.0))} idle)"
        parts.append(f'<span class="sl" style="left:{left:.3f}%">{html.escape(label)}</span>')
        k = 0
        while k * step <= s.end - s.start + 1e-9 and k < 200:
            x = axis.x(s.number, s.start + k * step)
            parts.append(
                f'<i class="tk" style="left:{x:.3f}%"><em>{_fmt_seconds(round(k * step, 3))}</em></i>'
            )
            k += 1
        previous_end = s.end
    parts.append("</s><u></u></div>")
    return "".join(parts)


def _legend() -> str:
    items = [
        ("p", "passed", ""),
        ("p", "passed (cached)", " data-c"),
        ("f", "failed", ""),
        ("t", "failed (tolerated)", ""),
        ("s", "skipped", ""),
        ("i", "interrupted", ""),
        ("r", "running", ""),
        ("q", "pending", ""),
        ("n", "not selected", ""),
    ]
    spans = [
        f'<span><i class="sw" data-s={code}{extra}></i>{label}</span>'
        for code, label, extra in items
    ]
    spans.append('<span><i class="sw sb"></i>session boundary (idle time cut out)</span>')
    return '<div class="legend">' + "".join(spans) + "</div>"


def _name(r: Row) -> str:
    return escape(r.task) if r.key is None else f"{escape(r.task)}[{escape(r.key)}]"


def _pc(x: float) -> str:
    """A percentage in few bytes: 0.01% of a lane is a tenth of a pixel."""
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return (text[1:] if text.startswith("0.") else text) + "%"


_LOG_SUFFIX = re.compile(r" \(log: [^)]*\)$")


def _attempt_note(t: Attempt) -> str:
    """An attempt's note for a tooltip: its first line, without the log path
    the dispatcher appends (the failure summary and the row give those)."""
    return _LOG_SUFFIX.sub("", name_signals(t.note, t.exit_code).split("\n", 1)[0])


def _cost(t: Attempt) -> str:
    """``62% cpu, 20M``: an attempt's %CPU and peak RSS for its bar's title
    ("" when it was not measured); a peak that only bounds (run.md,
    "Resource usage") reads ``<=20M``. Terse: 10,000 bars carry it."""
    if not t.fields:
        return ""
    duration = t.fields.get("duration")
    u = unit_usage(t.fields, float(duration) if isinstance(duration, int | float) else None)
    if u is None:
        return ""
    parts = []
    if u.cpu_pct is not None:
        parts.append(f"{u.cpu_pct:.0f}% cpu")
    if u.max_rss_kib is not None:
        mib = u.max_rss_kib / 1024
        parts.append(
            ("<=" if u.rss_bound else "") + (f"{mib:.0f}M" if mib >= 10 else f"{mib:.1f}M")
        )
    return ", ".join(parts)


def _bars(r: Row, axis: _Axis, name: str) -> str:
    """One bar per attempt; ``name`` heads each tooltip (an instance's row
    already shows its key: its bars say only ``#attempt``). A unit's one
    passed attempt has no tooltip: its row says all of it (bytes: 10,000
    instances)."""
    out = []
    cached = " data-c" if r.cached else ""
    for n, t in enumerate(r.tries, start=1):
        if t.start is None:
            continue
        end = t.end if t.end is not None else axis.sessions[-1].end if axis.sessions else t.start
        left = axis.x(t.session, t.start)
        width = max(axis.x(t.session, end) - left, 0.0)
        last = n == len(r.tries)
        status = r.status if last and r.status in ("passed", "failed", "skipped") else t.status
        code = _code(status, r.tolerated and last)
        title = ""
        cost = _cost(t)
        if not (len(r.tries) == 1 and status == "passed" and not t.note and not name):
            tip = f"{name}#{t.number or n} s{t.session}: {status}"
            if t.end is not None:
                tip += f" {t.end - t.start:.3f}s"
            if cost:
                tip += f" ({cost})"
            note = _attempt_note(t)
            if note:
                tip += " \u2014 " + escape(note)
            title = f' title="{html.escape(clip(tip, TIP_MAX))}"'
        elif cost:  # a passed attempt alone in its row: what it cost only (bytes)
            title = f' title="{html.escape(cost)}"'
        out.append(
            f'<i class="bar" data-s={code}{cached if last else ""} style="left:{_pc(left)};'
            f'width:{_pc(width)}"{title}></i>'
        )
    return "".join(out)


def _meta(r: Row) -> str:
    d = "" if r.duration is None else f" {r.duration:.3f}s"
    return html.escape(r.label + d)


def _group_spans(agg: Row, members: list[Row], axis: _Axis) -> str:
    spans: dict[int, list[float]] = {}
    if agg.folded is not None:
        spans = {s: list(lo_hi) for s, lo_hi in agg.folded.totals()[2].items()}
    for m in members:
        for t in m.tries:
            if t.start is None:
                continue
            end = t.end if t.end is not None else t.start
            lo_hi = spans.setdefault(t.session, [t.start, end])
            lo_hi[0] = min(lo_hi[0], t.start)
            lo_hi[1] = max(lo_hi[1], end)
    code = _code(agg.status, agg.tolerated)
    out = []
    for session, (lo, hi) in sorted(spans.items()):
        left = axis.x(session, lo)
        width = max(axis.x(session, hi) - left, 0.0)
        tip = f"{escape(agg.task)} s{session}: {hi - lo:.3f}s busy"
        out.append(
            f'<i class="span" data-s={code} style="left:{_pc(left)};width:{_pc(width)}" '
            f'title="{html.escape(tip)}"></i>'
        )
    return "".join(out)


def _group_counts(members: list[Row], folded: Folded | None = None) -> str:
    """``6`` when every instance passed, else ``6: 1 failed, 2 interrupted``
    (a folded task's: its folded and never started instances counted in)."""
    counts: dict[str, int] = {}
    for m in members:
        if m.status != "passed":
            counts[m.label] = counts.get(m.label, 0) + 1
    total = len(members)
    if folded is not None:
        total += len(folded) + folded.pending
        if folded.pending:
            counts["pending"] = counts.get("pending", 0) + folded.pending
    detail = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return f"{total}: {detail}" if detail else str(total)


def _folded_strip(folded: Folded, axis: _Axis) -> str:
    """The row of a folded task's plain instances: how many passed in each
    :data:`STRIP_BINS`-th of the lane (a bar each, darker where more ran),
    with their median and longest duration."""
    bins = [0] * STRIP_BINS
    last = STRIP_BINS - 1
    # axis.x inlined (the same arithmetic): it runs once per folded instance
    offset, begins, scale = axis.offset, axis.start, axis.scale
    for session, start, end in folded.starts():
        off = offset.get(session)
        x = (
            0.0
            if off is None
            else min(max(off + ((start + end) / 2 - begins[session]) * scale, 0.0), 100.0)
        )
        bins[min(int(x * STRIP_BINS / 100.0), last)] += 1
    peak = max(bins, default=0) or 1
    width = 100.0 / STRIP_BINS
    bars = "".join(
        f'<i class="bar" data-s=p style="left:{_pc(b * width)};width:{_pc(width)};'
        f'opacity:{0.25 + 0.75 * c / peak:.2f}" title="{c}"></i>'
        for b, c in enumerate(bins)
        if c
    )
    n = len(folded)
    durations = sorted(folded.figure("duration"))
    meta = ""
    if durations:
        meta = f"median {durations[len(durations) // 2]:.3f}s max {durations[-1]:.3f}s"
    tip = (
        f"{n} instances that passed at their first attempt, drawn as a density "
        "(how many in each stretch of time), not one row each"
    )
    return (
        f'<div class="r i fd"><b title="{html.escape(tip)}">{n} passed (folded)</b>'
        f"<s>{bars}</s><u>{html.escape(meta)}</u></div>"
    )


def _failures(rows: list[Row], ids: dict[int, str]) -> str:
    failed = [
        (i, r)
        for i, r in enumerate(rows)
        if r.status == "failed" and not (r.mapped and r.key is None)
    ]
    failed.sort(key=lambda ir: ir[1].tolerated)  # tolerated failures after the others
    if not failed:
        return ""
    parts = [
        f"<h2>Failures ({len(failed)})</h2>",
        '<div class="fails"><table class="fail"><tr><th>unit</th><th>log</th><th>note</th></tr>',
    ]
    for i, r in failed[:FAILURES_SHOWN]:
        name = html.escape(clip(_name(r), 120))
        label = " (tolerated)" if r.tolerated else ""
        note = html.escape(clip(display_note(r), 600))
        tail = ""
        if r.stderr_tail:
            tail = (
                "<pre>"
                + html.escape("\n".join(escape(x) for x in r.stderr_tail.rstrip("\n").split("\n")))
                + "</pre>"
            )
        log = html.escape(escape(r.log)) if r.log else "-"
        parts.append(
            f'<tr><td><a href="#{ids[i]}">{name}</a>{label}</td><td>{log}</td><td>{note}{tail}</td></tr>'
        )
    parts.append("</table></div>")
    if len(failed) > FAILURES_SHOWN:
        parts.append(
            f"<p>\u2026 and {len(failed) - FAILURES_SHOWN} more failed units "
            "(<code>crucible-dispatch report STATE TASK</code> lists them all).</p>"
        )
    return "".join(parts)


def _loop_section(loop: Any) -> str:
    """A scored loop's chart and revisions (crucible.run.report._loop_view), before the timeline."""
    if loop is None:
        return ""
    # lazy: run.report._loop_view is not loaded with this module; only _loop_section() needs it
    from crucible.run.report import _loop_view as loop_view

    return loop_view.render_html(loop)


def render(
    rows: list[Row],
    sessions: list[Session],
    title: str,
    loop: Any = None,
    resources: dict[str, dict[str, int]] | None = None,
) -> str:
    """The page for ``rows`` (as :func:`crucible.run.report._report.collect` returns them);
    ``loop`` (a :class:`crucible.run.report._loop_view.LoopView`) adds its chart;
    ``resources``: each task's declared resources, for the Resources section."""
    # lazy: run.report._resources_html is not loaded with this module; only render() needs it
    from crucible.run.report import _resources_html as resources_html

    axis = _Axis(sessions)
    ids: dict[int, str] = {}
    linked = resources_html.heaviest(rows)  # the Resources section links to them
    for i, r in enumerate(rows):
        if r.status == "failed" or i in linked:
            ids[i] = f"u{i}"
    body: list[str] = []
    i = 0
    while i < len(rows):
        r = rows[i]
        if r.key is None and r.mapped:
            j = i + 1
            while j < len(rows) and rows[j].key is not None and rows[j].task == r.task:
                j += 1
            members = rows[i + 1 : j]
            everything_passed = all(m.status == "passed" for m in members) and not (
                r.folded is not None and r.folded.pending
            )
            head = (
                f'<summary class="r"><span title="{html.escape(clip(_name(r), 200))}">'
                f"{html.escape(clip(_name(r), LABEL_MAX))} "
                f"({_group_counts(members, r.folded)})</span>"
                f"<s>{_group_spans(r, members, axis)}</s><u>{_meta(r)}</u></summary>"
            )
            body.append(f'<details class="g"{"" if everything_passed else " open"}>{head}')
            for k in range(i + 1, j):
                m = rows[k]
                anchor = f' id="{ids[k]}"' if k in ids else ""
                key = escape(m.key or "")
                tip = f' title="{html.escape(clip(_name(m), 200))}"' if len(key) > LABEL_MAX else ""
                body.append(
                    f'<div class="r i"{anchor}><b{tip}>{html.escape(clip(key, LABEL_MAX))}</b>'
                    f"<s>{_bars(m, axis, '')}</s><u>{_meta(m)}</u></div>"
                )
            if r.folded is not None and len(r.folded):
                body.append(_folded_strip(r.folded, axis))
            body.append("</details>")
            i = j
            continue
        name = _name(r)
        anchor = f' id="{ids[i]}"' if i in ids else ""
        body.append(
            f'<div class="r"{anchor}><span title="{html.escape(clip(name, 200))}">'
            f"{html.escape(clip(name, LABEL_MAX))}</span><s>{_bars(r, axis, name)}</s>"
            f"<u>{_meta(r)}</u></div>"
        )
        i += 1
    units = [r for r in rows if not (r.mapped and r.key is None)]
    counts: dict[str, int] = {}
    for r in units:
        counts[r.label] = counts.get(r.label, 0) + 1
    n_units, n_folded = len(units), 0
    for r in rows:  # a folded task's instances without a row
        f = r.folded
        if f is None or r.key is not None:
            continue
        cached = f.cached_count()
        for label, n in (
            ("passed", len(f) - cached),
            ("passed (cached)", cached),
            ("pending", f.pending),
        ):
            if n:
                counts[label] = counts.get(label, 0) + n
        n_units += len(f) + f.pending
        n_folded += len(f)
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    drawn = sum(len(r.tries) for r in rows)
    folded_text = f" ({n_folded} more as density strips)" if n_folded else ""
    overlay = "".join(
        f'<i style="left:{axis.offset[s.number] - GAP / 2:.3f}%"></i>' for s in sessions[1:]
    )
    page = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>{html.escape(escape(title))} \u2014 crucible timeline</title>",
        f"<style>{_CSS}{resources_html.CSS}</style></head><body>",
        f"<h1>{html.escape(escape(title))}</h1>",
        f'<p class="sum">{n_units} units ({html.escape(summary) or "none started"}); '
        f"{drawn} attempts drawn{folded_text} over {axis.busy:.3f} s busy in {len(sessions)} "
        f"session{'s' if len(sessions) != 1 else ''}.</p>",
        _failures(rows, ids),
        resources_html.render_section(rows, resources or {}, ids),
        _loop_section(loop),
        f'<div class="top">{_legend()}{_axis_row(axis)}</div>',
        f'<div class="tl"><div class="ov">{overlay}</div>',
        "\n".join(body),
        "</div>",
        # Parse, style and layout time of this page, for the browser test and
        # the curious (forcing layout here is what a reader waits for).
        "<script>document.body.offsetHeight;"
        "document.documentElement.dataset.renderMs=Math.round(performance.now())</script>",
        "</body></html>",
    ]
    return "\n".join(page) + "\n"


def render_report(rows: list[Row], title: str) -> str:
    """The self-contained HTML timeline of a report (what
    :func:`crucible.run.report._report.collect` returns: its sessions, loop and
    resources ride on it)."""
    if not isinstance(rows, Report):
        return render(rows, [], title, loop=None, resources={})
    return render(rows, rows.sessions, title, loop=rows.loop, resources=rows.resources)
