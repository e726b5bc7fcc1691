"""The verdict of an ``evaluate`` task (docs/spec/run.md, "Evaluate tasks").

An evaluate task is a command whose result object carries ``verdict``: the
string ``"pass"`` or ``"fail"``, optionally with a string ``reason``. The task
passes only when its command succeeded, its result was captured, and the
verdict is ``"pass"``. A ``"fail"`` verdict, a missing verdict or any other
value settles the task as failed; it is a measured outcome, never retried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["VERDICTS", "check"]

VERDICTS = ("pass", "fail")


def check(output_file: Path) -> tuple[Any, str | None]:
    """``(verdict value, None)`` when the verdict is ``"pass"``; otherwise
    ``(verdict value or None, the failure note)``."""
    # lazy: not loaded with this module; only check() needs it
    import orjson

    try:
        result = orjson.loads(output_file.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None, "evaluate: no readable result object, so no verdict"
    if not isinstance(result, dict) or "verdict" not in result:
        return None, 'evaluate: the result has no "verdict" field (expected "pass" or "fail")'
    verdict = result["verdict"]
    if verdict == "pass":
        return verdict, None
    if verdict == "fail":
        reason = result.get("reason")
        return verdict, "verdict: fail" + (
            f": {reason}" if isinstance(reason, str) and reason else ""
        )
    shown = orjson.dumps(verdict).decode()[:60]
    return verdict, f'evaluate: verdict must be "pass" or "fail", got {shown}'
