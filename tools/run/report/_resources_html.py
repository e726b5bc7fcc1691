"""The Resources section of ``report --html`` (docs/spec/run.md, "Report").

Per task, the distribution over its units of duration, %CPU, peak RSS and
block I/O, each drawn as inline SVG on a scale shared by every task (a strip
of points up to :data:`STRIP_MAX` units, a box plot above: so the section's
size grows with the number of tasks, never with the number of instances);
where a task declares ``resources``, what it used against what it asked for
("% allocated", as Nextflow's report says it) and how many units used more
memory than asked or far less CPU than reserved; then the ten heaviest units
by peak RSS and by CPU, each linked to its timeline row. No script: the page
stays self-contained.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from crucible.core.structs import dataclass
from crucible.run._display import clip, escape
from crucible.run.report._usage import UnitUsage, cpu_text, pct_text, rss_text, size_text

if TYPE_CHECKING:
    from crucible.run.report._fold import Folded
    from crucible.run.report._report import Row

__all__ = ["CSS", "HEAVIEST", "heaviest", "render_section"]

#: units listed as the heaviest by peak RSS and by CPU
HEAVIEST = 10
#: up to this many units a task's distribution is drawn as points, one per unit
STRIP_MAX = 40
#: a unit that used less than this share of the CPUs its task reserved is flagged
CPU_IDLE_SHARE = 0.25
_W, _H = 150, 14

CSS = """
.res{border-collapse:collapse;margin:.3em 0 .8em}
.res th,.res td{padding:.15em .6em .15em 0;text-align:left;vertical-align:middle;white-space:nowrap}
.res th{font-weight:600;border-bottom:1px solid #ccd}
.res td{border-top:1px solid #eef0f3;font:12px monospace}
.res td.n{text-align:right}
.res svg{display:block}
.res small{display:block;font-size:11px;color:#555}
.res td.w{white-space:normal;max-width:22em}
.res .bx{fill:#c9d8f0;stroke:#4a7fd1}
.res .wh,.res .md{stroke:#4a7fd1;stroke-width:1.5}
.res .md{stroke:#1d3f7a;stroke-width:2}
.res .pt{fill:#4a7fd1;fill-opacity:.55}
.res .ax{stroke:#e4e8ee}
.res .over{color:#b0281a;font-weight:600}
.heavy{display:inline-block;vertical-align:top;margin-right:2.5em}
"""


@dataclass(frozen=True, slots=True)
class _Unit:
    """One unit as the section reads it: its row's index, name and figures."""

    index: int
    name: str
    duration: float | None
    usage: UnitUsage

    @property
    def io(self) -> int | None:
        read, write = self.usage.read_bytes, self.usage.write_bytes
        return None if read is None and write is None else (read or 0) + (write or 0)


def _units(rows: Sequence[Row]) -> dict[str, list[_Unit]]:
    """Each task's measured units (a mapped task's instances), in plan order."""
    found: dict[str, list[_Unit]] = {}
    for i, r in enumerate(rows):
        if r.mapped and r.key is None:
            found.setdefault(r.task, [])
            continue
        if r.usage is None:
            found.setdefault(r.task, [])
            continue
        name = escape(r.task) if r.key is None else f"{escape(r.task)}[{escape(r.key)}]"
        found.setdefault(r.task, []).append(_Unit(i, name, r.duration, r.usage))
    return found


def _ranked(units: list[_Unit]) -> tuple[list[_Unit], list[_Unit]]:
    """The :data:`HEAVIEST` units by peak RSS and by CPU (ties: plan order)."""
    by_rss = sorted(
        (u for u in units if u.usage.max_rss_kib is not None),
        key=lambda u: (-(u.usage.max_rss_kib or 0), u.index),
    )
    by_cpu = sorted(
        (u for u in units if u.usage.cpu_s is not None),
        key=lambda u: (-(u.usage.cpu_s or 0.0), u.index),
    )
    return by_rss[:HEAVIEST], by_cpu[:HEAVIEST]


def heaviest(rows: Sequence[Row]) -> set[int]:
    """The row indexes of the units the section links to (its heaviest)."""
    by_rss, by_cpu = _ranked([u for us in _units(rows).values() for u in us])
    return {u.index for u in by_rss} | {u.index for u in by_cpu}


def _quartiles(values: list[float]) -> tuple[float, float, float, float, float]:
    v = sorted(values)
    n = len(v)

    def at(q: float) -> float:
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    return v[0], at(0.25), at(0.5), at(0.75), v[-1]


def _svg(values: list[float], top: float) -> str:
    """``values`` on 0..``top``: points (few units) or a box plot (many)."""
    if not values:
        return ""

    def x(v: float) -> str:  # 4 px inside each edge: a point at 0 or at the top shows whole
        return f"{4 + (_W - 8) * (v / top if top > 0 else 0):.1f}"

    mid = _H / 2
    parts = [
        f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img">'
        f'<line class="ax" x1="4" x2="{_W - 4}" y1="{mid}" y2="{mid}"/>'
    ]
    if len(values) <= STRIP_MAX:
        parts += [f'<circle class="pt" cx="{x(v)}" cy="{mid}" r="3"/>' for v in values]
    else:
        lo, q1, med, q3, hi = _quartiles(values)
        parts.append(f'<line class="wh" x1="{x(lo)}" x2="{x(hi)}" y1="{mid}" y2="{mid}"/>')
        width = max(float(x(q3)) - float(x(q1)), 1.0)
        parts.append(f'<rect class="bx" x="{x(q1)}" y="2" width="{width:.1f}" height="{_H - 4}"/>')
        parts.append(f'<line class="md" x1="{x(med)}" x2="{x(med)}" y1="1" y2="{_H - 1}"/>')
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class _Figure:
    title: str
    value: Callable[[_Unit], float | None]
    text: Callable[[float], str]
    #: its name for a folded task's columns (crucible.run.report._fold)
    folded: str


_FIGURES = (
    _Figure("duration", lambda u: u.duration, cpu_text, "duration"),
    _Figure("%CPU", lambda u: u.usage.cpu_pct, pct_text, "cpu_pct"),
    _Figure(
        "peak RSS",
        lambda u: None if u.usage.max_rss_kib is None else float(u.usage.max_rss_kib),
        rss_text,
        "max_rss_kib",
    ),
    _Figure("I/O (read+write)", lambda u: None if u.io is None else float(u.io), size_text, "io"),
)


def _values(fig: _Figure, units: list[_Unit], more: Folded | None) -> list[float]:
    """A figure over a task's measured units: its rows and its folded instances."""
    values = [v for u in units if (v := fig.value(u)) is not None]
    if more is not None:
        values += more.figure(fig.folded, measured=True)
    return values


def _folded(rows: Sequence[Row]) -> dict[str, Folded]:
    return {r.task: r.folded for r in rows if r.key is None and r.folded is not None}


def _median(values: list[float]) -> float:
    return _quartiles(values)[2]


def _allocated(
    units: list[_Unit], asked: dict[str, int], more: Folded | None = None
) -> tuple[str, str]:
    """The "% allocated" cell and the flags cell of a task that declares resources."""
    cells, flags = [], []
    memory = asked.get("memory")
    if memory:
        used = [u.usage.max_rss_kib * 1024 for u in units if u.usage.max_rss_kib is not None]
        if more is not None:
            used += [int(kib) * 1024 for kib in more.figure("max_rss_kib", measured=True)]
        if used:
            median = 100 * _median([float(b) for b in used]) / memory
            cells.append(
                f"memory {size_text(memory)}: median {median:.0f}%, max {100 * max(used) / memory:.0f}%"
            )
        # a bound (at or below the spawner's own RSS) says nothing about going over
        over = sum(
            1
            for u in units
            if u.usage.max_rss_kib is not None
            and not u.usage.rss_bound
            and u.usage.max_rss_kib * 1024 > memory
        )
        if more is not None:
            over += more.over_memory(memory / 1024)
        if over:
            flags.append(f"{over} over memory")
    cpus = asked.get("cpus")
    if cpus:
        pcts = [u.usage.cpu_pct for u in units if u.usage.cpu_pct is not None]
        if more is not None:
            pcts += more.figure("cpu_pct", measured=True)
        if pcts:
            cells.append(f"cpus {cpus}: median {_median(pcts) / cpus:.0f}%")
        idle = sum(1 for p in pcts if p < 100 * cpus * CPU_IDLE_SHARE)
        if idle:
            flags.append(f"{idle} used &lt;{CPU_IDLE_SHARE:.0%} of CPUs")
    return "; ".join(cells), ", ".join(flags)


def _heavy_table(
    title: str, rows: list[_Unit], text: Callable[[_Unit], str], anchors: dict[int, str]
) -> str:
    if not rows:
        return ""
    parts = [f'<div class="heavy"><h3>{html.escape(title)}</h3><table class="res">']
    for u in rows:
        name = html.escape(clip(u.name, 60))
        link = f'<a href="#{anchors[u.index]}">{name}</a>' if u.index in anchors else name
        parts.append(f'<tr><td>{link}</td><td class="n">{html.escape(text(u))}</td></tr>')
    parts.append("</table></div>")
    return "".join(parts)


def render_section(
    rows: Sequence[Row], asked: dict[str, dict[str, int]], anchors: dict[int, str]
) -> str:
    """The section's HTML ("" when no unit was measured). ``asked``: each task's
    declared resources; ``anchors``: row index -> the id of its timeline row."""
    tasks = _units(rows)
    folded = _folded(rows)
    measured = [u for us in tasks.values() for u in us]
    if not measured and not any(f.measured() for f in folded.values()):
        return ""
    tops = []
    for fig in _FIGURES:
        values = [v for u in measured if (v := fig.value(u)) is not None]
        values += [v for f in folded.values() for v in f.figure(fig.folded, measured=True)]
        tops.append(max(values, default=0.0))
    any_asked = any(asked.get(t) for t in tasks)
    head = "".join(
        f"<th>{html.escape(fig.title)} <small>(0\u2013{html.escape(fig.text(top))})</small></th>"
        for fig, top in zip(_FIGURES, tops, strict=True)
    )
    parts = [
        '<h2 id="resources">Resources</h2>',
        '<table class="res"><tr><th>task</th><th>units</th>',
        head,
        "<th>requested: % allocated</th><th>flags</th>" if any_asked else "",
        "</tr>",
    ]
    for task, units in tasks.items():
        more = folded.get(task)
        count = len(units) + (more.measured() if more is not None else 0)
        cells = [f"<tr><td>{html.escape(clip(escape(task), 40))}</td>"]
        if not count:  # every task has its line: this one ran nothing measured
            span = len(_FIGURES) + (2 if any_asked else 0)
            cells.append(f'<td class="n">0</td><td colspan="{span}">no attempt measured</td></tr>')
            parts.append("".join(cells))
            continue
        cells.append(f'<td class="n">{count}</td>')
        for fig, top in zip(_FIGURES, tops, strict=True):
            values = _values(fig, units, more)
            said = "-"
            if values:
                said = f"median {fig.text(_median(values))} \u00b7 max {fig.text(max(values))}"
            cells.append(f"<td>{_svg(values, top)}<small>{html.escape(said)}</small></td>")
        if any_asked:
            allocated, flags = _allocated(units, asked.get(task, {}), more)
            cells.append(f'<td class="w">{html.escape(allocated)}</td><td class=over>{flags}</td>')
        cells.append("</tr>")
        parts.append("".join(cells))
    parts.append("</table>")
    by_rss, by_cpu = _ranked(measured)
    parts.append(
        _heavy_table(
            f"Heaviest by peak RSS ({len(by_rss)})",
            by_rss,
            lambda u: rss_text(u.usage.max_rss_kib, u.usage.rss_bound),
            anchors,
        )
    )
    parts.append(
        _heavy_table(
            f"Heaviest by CPU ({len(by_cpu)})",
            by_cpu,
            lambda u: f"{cpu_text(u.usage.cpu_s)} ({pct_text(u.usage.cpu_pct)})",
            anchors,
        )
    )
    return "".join(parts)
