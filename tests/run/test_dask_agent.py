"""An agent unit on a Dask worker is spawned like a local one: its prompt on
stdin and its stdout captured as ``response`` (docs/spec/run.md "Agents",
"Executors"). The worker's runner overrides the local spawn and wait, so a
change of their signatures must reach it (it once did not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.run.dasktests import LOCAL, dispatch
from tests.run.dispatchtests import write_pack

pytest.importorskip("distributed")


def test_an_agent_on_a_worker_reads_its_prompt_on_stdin_and_answers_on_stdout(
    tmp_path: Path,
) -> None:
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/bin/sh\ncat > stdin.txt\nprintf 'the answer'\n")
    agent.chmod(0o755)
    pack = write_pack(
        tmp_path,
        """
        edition = 3
        [workflow]
        name = "d"
        [[workflow.task]]
        name = "a"
        kind = "agent"
        prompt = "Say hello."
        emits = { response = "string" }
        """,
    )
    state = tmp_path / "s"
    proc = dispatch(pack, state, *LOCAL, "--agent-cmd", str(agent))
    assert proc.returncode == 0, proc.stderr
    assert b"Say hello." in (state / "work" / "a" / "stdin.txt").read_bytes()
    record = json.loads((state / "results" / "a.json").read_text())
    assert record["output"] == {"response": "the answer"}
