"""The loop's reserved inputs through a real crucible-dispatch run (issue 18
item 3): each revision's proposer starts from the kept revision's file under
inputs/@kept/, the history budget's drop is stated in the index, and the task
after the loop reads the kept revision. Needs the loop engine (branch `loop`);
skipped until it is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("crucible.run.loop._engine")

BIN = Path(sys.executable).parent

PACK = """edition = 4

[workflow]
name = "kept-files"

[[workflow.task]]
name = "propose"
emits = { x = "integer" }
emits_files = ["draft.txt"]
run = '''
n=$(cat "$CRUCIBLE_INPUTS_DIR/revision")
if [ -f inputs/@kept/propose/draft.txt ]; then prev=$(cat inputs/@kept/propose/draft.txt); else prev=none; fi
echo "rev $n from $prev" > draft.txt
cp "$CRUCIBLE_INPUTS_DIR/index.json" "../index-$n.json"
printf '{"x": %s}' "$n" > "$CRUCIBLE_OUTPUT"
'''

[[workflow.task]]
name = "evaluate"
kind = "evaluate"
needs = ["propose"]
inputs = { x = "propose.x" }
emits = { score = "number" }
run = '''
x=$(cat "$CRUCIBLE_INPUTS_DIR/x")
printf '{"score": %s, "verdict": "pass"}' $(( (x * 7) % 5 )) > "$CRUCIBLE_OUTPUT"
'''

[[workflow.task]]
name = "report"
needs = ["propose"]
run = 'cp inputs/propose/draft.txt ../after.txt; cp inputs/@values/index.json ../after-index.json'

[loop]
body = ["propose", "evaluate"]
score = "evaluate"
metric = "score"
max_revisions = 8
history_bytes = 400
"""


def _entries(path: Path) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in json.loads(path.read_text())["inputs"]}


def test_kept_files_and_the_history_drop_through_a_run(tmp_path: Path) -> None:
    (tmp_path / "pack.toml").write_text(PACK)
    state = tmp_path / "state"
    proc = subprocess.run(
        # kept: the revisions' inputs are read below (a passed one gives its
        # captured files to the store and its workspace back: inputs.md 4)
        [str(BIN / "crucible-dispatch"), str(tmp_path / "pack.toml"), "--state", str(state),
         "--keep-workspaces"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((state / "loop.json").read_text())
    # scores 2, 4, 1, 3, 0, 2, 4, 1: revision 2 is kept from then on (4 is not beaten)
    assert [r["kept"] for r in doc["revisions"]] == [True, True] + [False] * 6
    work = state / "work" / "propose"
    drafts = [(work / f"%40rev{n}" / "draft.txt").read_text() for n in range(1, 9)]
    assert drafts[0] == "rev 1 from none\n"
    assert drafts[1] == "rev 2 from rev 1 from none\n"
    assert all(
        d == f"rev {n} from rev 2 from rev 1 from none\n" for n, d in enumerate(drafts[2:], 3)
    )
    meta = json.loads((state / "reserved" / "meta.json").read_text())["history"]
    for n in range(1, 9):
        by = _entries(work / f"index-{n}.json")
        files = by["kept"].get("kept_files")
        assert files == (
            None
            if n == 1
            else [
                {
                    "key": f"@rev{1 if n == 2 else 2}",
                    "path": "inputs/@kept/propose",
                    "producer": "propose",
                    "size": 16 if n == 2 else 27,
                }
            ]
        )
        history = json.loads((work / f"%40rev{n}" / "inputs" / "@values" / "history").read_text())
        assert by["history"]["dropped"] + len(history) == n - 1  # every earlier revision, stated
        assert len(json.dumps(history, separators=(",", ":"))) <= 400
    assert _entries(work / "index-8.json")["history"]["dropped"] > 0
    # after the loop: the kept revision's file, and the final history's drop
    assert (state / "work" / "after.txt").read_text() == "rev 2 from rev 1 from none\n"
    after = _entries(state / "work" / "after-index.json")
    assert after["history"]["dropped"] == meta["dropped"] and meta["total"] == 8
