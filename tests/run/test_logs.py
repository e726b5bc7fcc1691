"""Task logs: a task's stdout+stderr reach STATE/logs/ through its worker's pipe."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from tests.run.dispatchtests import events, result, run

Pack = Callable[..., Path]
HEADER = re.compile(r"^(== crucible: attempt \d+) task .*$", re.M)


def read_log(path: Path) -> str:
    """A log with each attempt's header cut to ``== crucible: attempt N`` (the
    rest of the header is checked in test_log_header_names_the_attempt)."""
    return HEADER.sub(r"\1", path.read_text())


def test_output_is_logged_per_attempt_and_quiet_attempts_leave_no_file(
    pack: Pack, tmp_path: Path
) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "quiet"
run = 'printf "{}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "chatty"
retries = 2
run = '''
echo "out $CRUCIBLE_ATTEMPT"; echo "err $CRUCIBLE_ATTEMPT" >&2
test "$CRUCIBLE_ATTEMPT" -ge 2 || exit 1
printf '{}' > "$CRUCIBLE_OUTPUT"
'''

[[workflow.task]]
name = "quiet-then-loud"
retries = 1
run = '''
if [ "$CRUCIBLE_ATTEMPT" = 1 ]; then exit 1; fi
printf 'second\\n'; printf '{}' > "$CRUCIBLE_OUTPUT"
'''
"""
    )
    state = tmp_path / "s"
    assert run(plan, state, jobs=2).exit_code == 0  # type: ignore[attr-defined]
    logs = state / "logs"
    assert not (logs / "quiet.log").exists()
    assert read_log(logs / "chatty.log") == (
        "== crucible: attempt 1\nout 1\nerr 1\n== crucible: attempt 2\nout 2\nerr 2\n"
    )
    # the quiet first attempt left no header; the second attempt's output has its own
    assert read_log(logs / "quiet-then-loud.log") == "== crucible: attempt 2\nsecond\n"
    assert all("log_error" not in e for e in events(state))


def test_output_larger_than_a_pipe_and_a_background_writer(pack: Pack, tmp_path: Path) -> None:
    """A task writing far more than a pipe holds never blocks; whatever it left in
    its group is killed when it exits, and what that wrote before is kept."""
    plan = pack(
        """
[[workflow.task]]
name = "big"
run = '''
head -c 1000000 /dev/zero | tr '\\0' 'x'; echo
(echo bg-started; sleep 30; echo never) &
sleep 0.2
printf '{}' > "$CRUCIBLE_OUTPUT"
'''
"""
    )
    state = tmp_path / "s"
    started = time.monotonic()
    assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
    assert time.monotonic() - started < 20  # the sleeping background job did not hold it
    text = read_log(state / "logs" / "big.log")
    assert text.startswith("== crucible: attempt 1\n" + "x" * 1000000 + "\n")
    assert "bg-started" in text and "never" not in text


def test_instance_logs_and_an_unwritable_log(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "items"
emits = { items = "object" }
run = '''printf '{"items": {"a/b": 1, "c": 2}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["items"]
map = "items.items"
run = '''echo "item $CRUCIBLE_KEY"; printf '{}' > "$CRUCIBLE_OUTPUT"'''
"""
    )
    state = tmp_path / "s"
    assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
    from crucible.stage import escape_key

    for key in ("a/b", "c"):
        log = state / "logs" / "each" / f"{escape_key(key)}.log"
        assert read_log(log) == f"== crucible: attempt 1\nitem {key}\n"

    # A log that cannot be written (here: logs/ is a file, which no user, root
    # included, can create a directory in) is reported in the attempt's event,
    # and the task still settles on its own terms.
    state2 = tmp_path / "s2"
    state2.mkdir()
    (state2 / "logs").write_text("not a directory")
    assert run(plan, state2).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state2, "each")
    assert rec is not None and rec["status"] == "passed"
    errors = [e["log_error"] for e in events(state2) if "log_error" in e]
    assert len(errors) == 2 and all("cannot write" in e for e in errors), errors


def test_log_header_names_the_attempt(pack: Pack, tmp_path: Path) -> None:
    """Every attempt's header names task, key, attempt, start time and argv, so
    ``cat logs/*.log`` is readable on its own."""
    plan = pack(
        """
[[workflow.task]]
name = "items"
emits = { items = "array" }
run = '''printf '{"items": ["x"]}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["items"]
map = "items.items"
run = ["sh", "-c", "echo hello"]
"""
    )
    state = tmp_path / "s"
    before = time.strftime("%Y-%m-%dT", time.gmtime())
    assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
    first, second = (state / "logs" / "each" / "0.log").read_text().splitlines()
    assert second == "hello"
    match = re.fullmatch(
        r'== crucible: attempt 1 task "each" key "0" started (\S+) argv (.*)', first
    )
    assert match is not None, first
    assert match.group(1).startswith(before) and match.group(1).endswith("Z")
    assert json.loads(match.group(2)) == ["sh", "-c", "echo hello"]
