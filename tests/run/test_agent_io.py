"""An agent's standard streams (issue 18 item 7; docs/spec/run.md, "Agents"):
the prompt on stdin as well as in CRUCIBLE_PROMPT_FILE / CRUCIBLE_PROMPT, and
stdout captured as the result field ``response`` when no CRUCIBLE_OUTPUT is
written."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from crucible.run.executors._agent_io import RESPONSE_MAX
from tests.run.dispatchtests import DISPATCH, result, run

Pack = Callable[..., Path]


def _agent(tmp_path: Path, body: str, name: str = "agent.sh") -> Path:
    script = tmp_path / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def _one_agent(pack: Pack, emits: str = "", prompt: str = "Say hello.", edition: int = 3) -> Path:
    return pack(
        f'[[workflow.task]]\nname = "a"\nkind = "agent"\nprompt = "{prompt}"\n{emits}',
        edition=edition,
    )


def test_prompt_arrives_on_stdin_and_in_file_and_env(pack: Pack, tmp_path: Path) -> None:
    agent = _agent(
        tmp_path,
        "cat > stdin.txt\n"
        'cp "$CRUCIBLE_PROMPT_FILE" file.txt\n'
        'printf %s "$CRUCIBLE_PROMPT" > env.txt\n'
        'echo "{}" > "$CRUCIBLE_OUTPUT"\n',
    )
    state = tmp_path / "s"
    assert run(_one_agent(pack), state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    work = state / "work" / "a"
    stdin = (work / "stdin.txt").read_bytes()
    assert b"Say hello." in stdin
    assert stdin == (work / "file.txt").read_bytes() == (work / "env.txt").read_bytes()


def test_commands_keep_stdin_empty(pack: Pack, tmp_path: Path) -> None:
    plan = pack('[[workflow.task]]\nname = "c"\nrun = "cat > stdin.txt; test ! -s stdin.txt"\n')
    state = tmp_path / "s"
    assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
    assert (state / "work" / "c" / "stdin.txt").read_bytes() == b""


def test_stdout_becomes_response_undeclared_and_still_reaches_log(
    pack: Pack, tmp_path: Path
) -> None:
    agent = _agent(tmp_path, "printf 'the answer\\n'\necho 'a warning' >&2\n")
    state = tmp_path / "s"
    assert run(_one_agent(pack), state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["status"] == "passed", rec
    # stdout only: stderr is not part of the response
    assert rec["output"] == {"response": "the answer\n"}
    log = (state / "logs" / "a.log").read_text()
    assert "the answer" in log and "a warning" in log


def test_declared_response_is_staged_to_a_consumer(pack: Pack, tmp_path: Path) -> None:
    agent = _agent(tmp_path, "cat\n")  # echoes its prompt: a stdin-to-stdout agent
    plan = pack(
        '[[workflow.task]]\nname = "a"\nkind = "agent"\nprompt = "Echo me."\n'
        'emits = { response = "string" }\n\n'
        '[[workflow.task]]\nname = "b"\nneeds = ["a"]\ninputs = { r = "a.response" }\n'
        'run = "cp $CRUCIBLE_INPUTS_DIR/r got.json"\n'
    )
    state = tmp_path / "s"
    assert run(plan, state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    got = json.loads((state / "work" / "b" / "got.json").read_text())
    assert "Echo me." in got
    assert got == (state / "prompts" / "a.txt").read_text()


def test_agent_that_writes_output_keeps_it(pack: Pack, tmp_path: Path) -> None:
    agent = _agent(tmp_path, 'echo chatter\necho \'{"n": 3}\' > "$CRUCIBLE_OUTPUT"\n')
    state = tmp_path / "s"
    plan = _one_agent(pack, 'emits = { n = "integer" }\n')
    assert run(plan, state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["output"] == {"n": 3}
    assert "chatter" in (state / "logs" / "a.log").read_text()


def test_missing_declared_field_still_fails_with_response(pack: Pack, tmp_path: Path) -> None:
    agent = _agent(tmp_path, "echo hi\n")
    state = tmp_path / "s"
    plan = _one_agent(pack, 'emits = { n = "integer" }\n')
    assert run(plan, state, agent_cmd=str(agent)).exit_code == 1  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["status"] == "failed"
    assert "'n' is missing" in rec["note"], rec["note"]


def test_failed_agent_gets_no_response(pack: Pack, tmp_path: Path) -> None:
    agent = _agent(tmp_path, "echo partial\nexit 3\n")
    state = tmp_path / "s"
    assert run(_one_agent(pack), state, agent_cmd=str(agent)).exit_code == 1  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["status"] == "failed", rec
    assert "response" not in rec.get("output", {}), rec


def test_declared_response_over_emit_cap_is_measured_failure(pack: Pack, tmp_path: Path) -> None:
    agent = _agent(tmp_path, "head -c 5000 /dev/zero | tr '\\0' x\n")
    state = tmp_path / "s"
    plan = _one_agent(pack, 'emits = { response = "string" }\n')
    assert run(plan, state, agent_cmd=str(agent), emit_cap=1000).exit_code == 1  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["status"] == "failed" and rec["retryable"] is False
    assert "over the emit cap" in rec["note"] and "'response'" in rec["note"]


def test_stdout_over_response_bound_fails_measured(pack: Pack, tmp_path: Path) -> None:
    over = RESPONSE_MAX + 70000
    agent = _agent(tmp_path, f"head -c {over} /dev/zero | tr '\\0' y\n")
    state = tmp_path / "s"
    assert run(_one_agent(pack), state, agent_cmd=str(agent)).exit_code == 1  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["status"] == "failed" and rec["retryable"] is False
    assert f"over {RESPONSE_MAX} bytes" in rec["note"], rec["note"]
    # every byte still reached the log
    assert (state / "logs" / "a.log").stat().st_size > over


def test_invalid_utf8_stdout_is_replaced(pack: Pack, tmp_path: Path) -> None:
    agent = _agent(tmp_path, "printf 'ok\\377\\n'\n")
    state = tmp_path / "s"
    assert run(_one_agent(pack), state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["output"] == {"response": "ok\ufffd\n"}


def test_huge_prompt_on_stdin_does_not_deadlock(pack: Pack, tmp_path: Path) -> None:
    # Over any pipe buffer (64 KiB; 1 MiB at most by default): the agent reads
    # all of stdin only after writing a lot of stdout, and echoes it back.
    big = "P" * (3 * 1024 * 1024)
    agent = _agent(
        tmp_path,
        "head -c 300000 /dev/zero | tr '\\0' z >&2\n"
        "wc -c | tr -d ' ' > n.txt\n"
        'cat "$CRUCIBLE_PROMPT_FILE"\n',
    )
    state = tmp_path / "s"
    plan = _one_agent(pack, "timeout = 60\n", prompt=big)
    assert run(plan, state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    n = int((state / "work" / "a" / "n.txt").read_text())
    assert n == (state / "prompts" / "a.txt").stat().st_size > len(big)
    rec = result(state, "a")
    assert rec is not None and big in rec["output"]["response"]


def test_agent_that_never_reads_stdin_is_fine(pack: Pack, tmp_path: Path) -> None:
    big = "Q" * (2 * 1024 * 1024)
    agent = _agent(tmp_path, 'echo \'{"ok": true}\' > "$CRUCIBLE_OUTPUT"\n')
    state = tmp_path / "s"
    plan = _one_agent(pack, 'timeout = 60\nemits = { ok = "boolean" }\n', prompt=big)
    assert run(plan, state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["status"] == "passed" and rec["output"] == {"ok": True}


def test_stdin_is_prompt_in_edition_1_too(pack: Pack, tmp_path: Path) -> None:
    # A spawn fix for every edition: no plan bytes change (seed, "Local agent argv").
    agent = _agent(tmp_path, "cat\n")
    state = tmp_path / "s"
    plan = _one_agent(pack, edition=1)
    assert run(plan, state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and "Say hello." in rec["output"]["response"]


def test_cli_agent_cmd_reading_stdin_unchanged(pack: Pack, tmp_path: Path) -> None:
    # The real CLI, with a command that (like `claude -p` or `llm`) takes its
    # prompt on stdin and prints its answer: used unchanged as --agent-cmd.
    plan = _one_agent(pack, 'emits = { response = "string" }\n', prompt="What is 6*7?")
    state = tmp_path / "s"
    cmd = "tr a-z A-Z"
    proc = subprocess.run(
        [DISPATCH, str(plan), "--state", str(state), "--agent-cmd", cmd],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rec = result(state, "a")
    assert rec is not None and "WHAT IS 6*7?" in rec["output"]["response"]


@pytest.mark.parametrize("edition", [1, 3])
def test_quiet_agent_gets_empty_response(pack: Pack, tmp_path: Path, edition: int) -> None:
    agent = _agent(tmp_path, "true\n")
    state = tmp_path / "s"
    assert run(_one_agent(pack, edition=edition), state, agent_cmd=str(agent)).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state, "a")
    assert rec is not None and rec["output"] == {"response": ""}
