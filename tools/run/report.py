"""``crucible-dispatch report``: what happened in a state dir, as a table, NDJSON
rows, or a self-contained HTML timeline (one bar per task or instance).

Status comes from ``results/`` (what is settled); times, attempts and sizes come
from the session log, across every session of the run (resumes included).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from crucible.core import canon
from crucible.core.errors import InputRefused, OperationalError
from crucible.run.session import read_events

__all__ = ["Row", "collect", "render_html", "render_table", "row_json"]


@dataclass
class Row:
    task: str
    key: str | None
    status: str = "pending"
    note: str | None = None
    attempts: int = 0
    start: float | None = None
    end: float | None = None
    duration: float | None = None
    exit_code: int | None = None
    output_bytes: int | None = None
    files_bytes: int | None = None
    instances: int | None = None
    counts: dict[str, int] = field(default_factory=dict)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _load_plan(state: Path) -> dict[str, Any]:
    path = state / "plan.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputRefused("not a crucible state dir (no plan.json)", where=str(state)) from None
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None
    plan = canon.loads(data)
    if not isinstance(plan, dict) or not isinstance(plan.get("tasks"), list):
        raise InputRefused("plan.json is not a plan", where=str(path))
    return plan


def collect(state: Path, task: str | None = None) -> list[Row]:
    """Rows in plan order: one per task, and (when ``task`` names a mapped task,
    or for the timeline) one per instance."""
    from crucible import stage

    plan = _load_plan(state)
    names = [t["name"] for t in plan["tasks"]]
    if task is not None and task not in names:
        raise InputRefused(
            f"no task {task!r} in this run's plan (tasks: {', '.join(names)})", where=str(state)
        )
    rows: dict[tuple[str, str | None], Row] = {}
    order: list[tuple[str, str | None]] = []

    def row(name: str, key: str | None) -> Row:
        ident = (name, key)
        r = rows.get(ident)
        if r is None:
            r = rows[ident] = Row(name, key)
            order.append(ident)
        return r

    for name in names:
        row(name, None)
    for event in read_events(state / "session.jsonl"):
        kind = event.get("event")
        if kind not in ("task_started", "task_finished"):
            continue
        name = event.get("task")
        if not isinstance(name, str) or name not in names:
            continue
        r = row(name, event.get("key"))
        at = _epoch(event["time"])
        if kind == "task_started":
            r.attempts += 1
            r.start = at
            r.end = None
            continue
        r.status = event.get("status", r.status)
        r.note = event.get("note")
        r.exit_code = event.get("exit_code")
        r.duration = event.get("duration", r.duration)
        r.output_bytes = event.get("output_bytes", r.output_bytes)
        r.files_bytes = event.get("files_bytes", r.files_bytes)
        if "instances" in event:
            r.instances = event["instances"]
        r.end = at
        if r.start is None and r.duration is not None:
            r.start = at - r.duration
    # results/ is the authority on what is settled.
    for name, key in order:
        record = stage.load_result(state, name, key)
        r = rows[(name, key)]
        if record is not None:
            r.status = record.get("status", r.status)
            r.note = record.get("note", r.note)
    for name in names:
        instances = [rows[i] for i in order if i[0] == name and i[1] is not None]
        if instances:
            agg = rows[(name, None)]
            agg.instances = agg.instances if agg.instances is not None else len(instances)
            for inst in instances:
                agg.counts[inst.status] = agg.counts.get(inst.status, 0) + 1
            starts = [i.start for i in instances if i.start is not None]
            ends = [i.end for i in instances if i.end is not None]
            if starts:
                agg.start = min(starts)
            if ends:
                agg.end = max(ends)
            if agg.start is not None and agg.end is not None:
                agg.duration = round(agg.end - agg.start, 6)
            agg.output_bytes = sum(i.output_bytes or 0 for i in instances)
            if any(i.files_bytes is not None for i in instances):
                agg.files_bytes = sum(i.files_bytes or 0 for i in instances)
            if agg.status == "pending" and agg.counts:
                agg.status = "running" if "pending" not in agg.counts else "pending"
    if task is not None:
        return [rows[i] for i in order if i[0] == task]
    return [rows[i] for i in order]


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f}s"


def _note(r: Row) -> str:
    if r.note or r.instances is None:
        return r.note or ""
    detail = ", ".join(f"{v} {k}" for k, v in sorted(r.counts.items()))
    return f"{r.instances} instances" + (f": {detail}" if detail else "")


def render_table(rows: list[Row], out: IO[str], *, instances: bool) -> None:
    """A plain fixed-width table (mapped tasks one row each unless ``instances``)."""
    header = ("TASK", "STATUS", "ATTEMPTS", "DURATION", "OUTPUT", "FILES", "NOTE")
    lines: list[tuple[str, ...]] = []
    for r in rows:
        if r.key is not None and not instances:
            continue
        name = r.task if r.key is None else f"{r.task}[{r.key}]"
        lines.append(
            (
                name,
                r.status,
                "-" if r.instances is not None else str(r.attempts),
                _seconds(r.duration),
                _size(r.output_bytes),
                _size(r.files_bytes),
                _note(r).replace("\n", " "),
            )
        )
    widths = [
        max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
        for i, h in enumerate(header)
    ]
    for line in (header, *lines):
        out.write(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line[:-1]))
            + "  "
            + line[-1]
            + "\n"
        )


def row_json(r: Row) -> dict[str, Any]:
    data: dict[str, Any] = {
        "task": r.task,
        "key": r.key,
        "status": r.status,
        "note": r.note,
        "attempts": r.attempts,
        "duration": r.duration,
        "exit_code": r.exit_code,
        "output_bytes": r.output_bytes,
        "files_bytes": r.files_bytes,
    }
    if r.instances is not None:
        data["instances"] = r.instances
        data["instance_status"] = dict(r.counts)
    return {k: v for k, v in data.items() if v is not None}


_COLOURS = {
    "passed": "#2e9d4f",
    "failed": "#d1422f",
    "skipped": "#9a9a9a",
    "interrupted": "#e0a526",
    "pending": "#cfd8e3",
    "running": "#4a7fd1",
}


def render_html(rows: list[Row], title: str) -> str:
    """A self-contained timeline page: one bar per task or instance, coloured by
    status, positioned by start and end time (like Nextflow's timeline)."""
    bars = [
        r for r in rows if not (r.key is None and r.instances)
    ]  # instances replace their aggregate
    timed = [r for r in bars if r.start is not None]
    t0 = min((r.start for r in timed if r.start is not None), default=0.0)
    t1 = max((r.end or r.start or 0.0 for r in timed), default=t0)
    span = max(t1 - t0, 1e-6)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)} — crucible timeline</title>",
        "<style>",
        "body{font:13px system-ui,sans-serif;margin:1.5em;color:#222}",
        "h1{font-size:1.3em} .legend span{display:inline-block;margin-right:1em}",
        ".sw{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:middle}",
        ".row{display:flex;align-items:center;height:16px;margin:1px 0}",
        ".name{width:22em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;font-family:monospace}",
        ".lane{position:relative;flex:1;height:12px;background:#f3f5f8}",
        ".bar{position:absolute;top:0;height:12px;min-width:2px}",
        ".meta{width:18em;padding-left:.8em;font-family:monospace;color:#555;white-space:nowrap}",
        "</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(bars)} bars over {span:.3f} s.</p>",
        '<div class="legend">',
    ]
    for status, colour in _COLOURS.items():
        parts.append(f'<span><i class="sw" style="background:{colour}"></i>{status}</span>')
    parts.append("</div>")
    for r in bars:
        name = r.task if r.key is None else f"{r.task}[{r.key}]"
        colour = _COLOURS.get(r.status, "#666")
        tip = html.escape(f"{name}: {r.status}" + (f" — {r.note}" if r.note else ""), quote=True)
        bar = ""
        if r.start is not None:
            left = (r.start - t0) / span * 100
            width = ((r.end or r.start) - r.start) / span * 100
            bar = f'<div class="bar" style="left:{left:.3f}%;width:{width:.3f}%;background:{colour}" title="{tip}"></div>'
        parts.append(
            f'<div class="row"><div class="name" title="{tip}">{html.escape(name)}</div>'
            f'<div class="lane">{bar}</div>'
            f'<div class="meta">{html.escape(r.status)} {_seconds(r.duration)} {_size(r.output_bytes)}</div></div>'
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
