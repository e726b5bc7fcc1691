"""RFC 0024's required recording cases from real runs (issue 28 items 3-5): each is
produced by dispatching an accounted pack through the installed ``crucible-dispatch``,
exported with ``crucible-prove --state`` and read by ``crucible-verify`` — never a
hand-written operation log (docs/spec/export.md, admission-proof.md §11).

Every byte boundary is constructed only after measuring (RFC 0024): a calm run with
the same number of digits in ``max_bytes`` gives the export's size T, then the case
runs with a bound placed against T. ``SOURCE_DATE_EPOCH`` pins every ``at``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DISPATCH, PROVE, VERIFY = (str(BIN / f"crucible-{n}") for n in ("dispatch", "prove", "verify"))
EPOCH = "1790000000"  # SOURCE_DATE_EPOCH of every run here
#: a max_bytes with as many digits as every bound placed against a measured size below
#: (workflow.json carries the bound, so its digit count is part of every size)
ROOMY = 99999

_ROOT_RUN = """
python3 - <<'PY'
import json, os
p = json.load(open(os.path.join(os.environ["CRUCIBLE_INPUTS_DIR"], "params")))
json.dump({"orgs": p["items"]}, open(os.environ["CRUCIBLE_OUTPUT"], "w"))
PY
"""
#: a mapped task driven by its item: `size` bytes of notes, `fail_first` fails the
#: first attempt (a mark in the workspace), `same` emits equal contents, and a
#: SLEEP_<id> variable delays it (completion order without touching the record);
#: the second consumer `sites` always emits 16 bytes of notes; SIZE_<id> overrides
#: the size (a later session's retry with a smaller output)
_MAPPED_RUN = """
python3 - <<'PY'
import json, os, sys, time
item = json.load(open(os.path.join(os.environ["CRUCIBLE_INPUTS_DIR"], "item")))
time.sleep(float(os.environ.get("SLEEP_" + item["id"], "0")))
if item.get("fail_first") and not os.path.exists("tried"):
    open("tried", "w").close()
    sys.exit("first attempt fails on purpose")
size = 16 if os.environ.get("STAGE") == "sites" else item.get("size", 16)
size = int(os.environ.get("SIZE_" + item["id"], size))
out = {"notes": "n" * size} if item.get("same") else {"id": item["id"], "notes": "n" * size}
json.dump(out, open(os.environ["CRUCIBLE_OUTPUT"], "w"))
PY
"""


#: the SLEEP_<id>/SIZE_<id> variables the mapped tasks may read (declared: only those
#: reach them)
SLEEPS = [f"SLEEP_{i}" for i in ("a", "b", "s0", "s1", "s2", "s3")] + ["SIZE_b"]


def pack_text(max_bytes: int, consumers: tuple[str, ...] = ("people",)) -> str:
    lines = [
        "edition = 4",
        "[workflow]",
        'name = "case"',
        "[workflow.params.items]",
        'type = "array"',
        "default = []",
        "[workflow.limits]",
        f"max_bytes = {max_bytes}",
        "max_files = 512",
        "max_instances = 64",
        "max_attempts = 4",
        "max_records = 256",
        "max_case_bytes = 4096",
        "max_payload_bytes = 65536",
        "[[workflow.task]]",
        'name = "org"',
        'emits = { orgs = "array" }',
        f"run = '''{_ROOT_RUN}'''",
    ]
    for name in consumers:
        lines += [
            "[[workflow.task]]",
            f'name = "{name}"',
            'needs = ["org"]',
            'map = "org.orgs"',
            'key = "id"',
            f"env = {json.dumps(SLEEPS)}",
            'emits = { notes = "string" }',
            f"run = '''\nSTAGE={name} {_MAPPED_RUN.lstrip()}'''",
        ]
    return "\n".join(lines) + "\n"


class Case:
    """One pack in ``root``; every run dispatches it into a fresh state dir."""

    def __init__(self, root: Path, max_bytes: int, consumers: tuple[str, ...] = ("people",)):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.pack = root / "pack.toml"
        self.pack.write_text(pack_text(max_bytes, consumers))
        self.n = 0

    def state(self) -> Path:
        self.n += 1
        return self.root / f"state-{self.n}"


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "SOURCE_DATE_EPOCH": EPOCH, "LOGNAME": "tester", **extra}


def dispatch(
    pack: Path | str, state: Path, *args: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "-j", "2", *args],
        cwd=REPO,
        env=env(**(extra or {})),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def items(*specs: dict[str, Any]) -> str:
    return "items=" + json.dumps(list(specs))


def export(state: Path, out: Path) -> tuple[int, int]:
    """Export; (bytes, files) of the bundle as crucible-prove measured them."""
    proc = subprocess.run(
        [PROVE, "--state", str(state), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = re.search(r": \d+ epochs, (\d+) bytes in (\d+) files", proc.stderr)
    assert found, proc.stderr
    return int(found[1]), int(found[2])


def verify(bundle: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [VERIFY, str(bundle), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout) if proc.stdout else {}
    return proc.returncode, report, proc.stderr


def reads(bundle: Path, completion: str) -> dict[str, Any]:
    code, report, err = verify(bundle)
    assert code == 0 and report["verdict"] == "reading", (report, err)
    assert report["reading"]["completion"] == completion, report
    return report


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def supplied(bundle: Path) -> tuple[int, int]:
    files = [p for p in bundle.rglob("*") if p.is_file() and p.name != "partial.json"]
    return sum(p.stat().st_size for p in files), len(files)


def epochs(bundle: Path) -> list[dict[str, Any]]:
    proof = canon.loads((bundle / "admission-proof.json").read_bytes())
    return [e for block in proof["epochBlocks"] for e in block]


def instance(bundle: Path, iid: str) -> dict[str, Any]:
    ex = canon.loads((bundle / "execution.json").read_bytes())
    found = [i for i in ex["instances"] if i["id"] == iid]
    assert found, [i["id"] for i in ex["instances"]]
    return found[0]  # type: ignore[no-any-return]


def measured(
    case_dir: Path, specs: list[dict[str, Any]], consumers: tuple[str, ...] = ("people",)
) -> int:
    """T: the export size of a calm run of these items under a roomy bound."""
    calm = Case(case_dir, ROOMY, consumers)
    state = calm.state()
    proc = dispatch(calm.pack, state, "-p", items(*specs))
    assert proc.returncode == 0, proc.stderr
    size, _ = export(state, case_dir / "calm.bundle")
    reads(case_dir / "calm.bundle", "complete")
    assert 10000 <= size < ROOMY  # same digit count as ROOMY, so bounds near T keep sizes
    return size


# -- boundaries: admission at exactly max_bytes, refusal at max_bytes + 1 ------------

SIBLINGS = [{"id": "a", "size": 400}, {"id": "b", "size": 400}]


def test_admitted_at_exactly_max_bytes_refused_one_byte_below(tmp_path: Path) -> None:
    t = measured(tmp_path / "m", SIBLINGS)
    exact = Case(tmp_path / "exact", t)
    state = exact.state()
    assert dispatch(exact.pack, state, "-p", items(*SIBLINGS)).returncode == 0
    assert export(state, tmp_path / "exact.bundle") == supplied(tmp_path / "exact.bundle")
    assert supplied(tmp_path / "exact.bundle")[0] == t  # no finalization file was added
    reads(tmp_path / "exact.bundle", "complete")
    # one byte less: b's output (the last decision) would exceed max_bytes by 1
    tight = Case(tmp_path / "tight", t - 1)
    state = tight.state()
    proc = dispatch(tight.pack, state, "-p", items(*SIBLINGS))
    assert proc.returncode == 1, proc.stderr
    bundle = tmp_path / "tight.bundle"
    export(state, bundle)
    reads(bundle, "partial")  # b failed: an active instance not completed
    b = instance(bundle, "people.b")
    assert (b["state"], b["failure"]) == ("failed", "limit-exceeded")
    assert instance(bundle, "people.a")["state"] == "completed"
    assert not (bundle / "outputs" / "people" / "people.b").exists()


# -- opposite sibling completion orders ----------------------------------------------


def test_opposite_completion_orders_give_identical_bundles(tmp_path: Path) -> None:
    t = measured(tmp_path / "m", SIBLINGS)
    case = Case(tmp_path / "c", t - 1)  # room for a's output, not for b's after it
    bundles = []
    for first, late in (("a", "b"), ("b", "a")):
        state = case.state()
        proc = dispatch(case.pack, state, "-p", items(*SIBLINGS), extra={f"SLEEP_{late}": "1.5"})
        assert proc.returncode == 1, proc.stderr
        out = tmp_path / f"{first}-first.bundle"
        export(state, out)
        reads(out, "partial")
        bundles.append(out)
    assert tree(bundles[0]) == tree(bundles[1])
    # canonical group order: a admitted, b refused, whichever finished first
    assert instance(bundles[0], "people.a")["state"] == "completed"
    assert instance(bundles[0], "people.b")["failure"] == "limit-exceeded"


# -- long and short prospective ids: the org-people example ---------------------------


def test_org_people_short_ids_fit_descriptive_ids_are_refused(tmp_path: Path) -> None:
    pack = "examples/org-people/pack.toml"
    short = tmp_path / "short"
    assert dispatch(pack, short).returncode == 0
    size, files = export(short, tmp_path / "short.bundle")
    # the pack's header: 14,932 bytes with a four-letter actor (root); ours is "tester"
    assert (size, files) == (14932 + len("tester") - len("root"), 46)
    reads(tmp_path / "short.bundle", "complete")
    long = tmp_path / "long"
    proc = dispatch(pack, long, "-p", "ids=descriptive")
    assert proc.returncode == 1, proc.stderr
    bundle = tmp_path / "long.bundle"
    export(long, bundle)
    reads(bundle, "partial")
    # the selection reserved the ids the run actually proposed, and the same research
    # under them crosses max_bytes: the fourth output is refused (by 552 bytes)
    sel = [e for e in epochs(bundle) if e["kind"] == "selection"]
    ids = sel[0]["childIds"]
    assert len(ids) == 4 and all(i.startswith("people.org-000") for i in ids)
    assert [instance(bundle, i)["state"] for i in ids] == ["completed"] * 3 + ["failed"]
    assert instance(bundle, ids[3])["failure"] == "limit-exceeded"
    note = canon.loads((long / "results" / "people.json").read_bytes())["note"]
    # 552 with a four-letter actor (the pack's header); the actor is in every candidate
    assert f"refused: would exceed max_bytes by {552 + len('tester') - len('root')}" in note


def test_refused_selection_keeps_its_prospective_ids(tmp_path: Path) -> None:
    state = tmp_path / "many"
    proc = dispatch("examples/org-people/pack.toml", state, "-p", "count=20")
    assert proc.returncode == 1, proc.stderr
    bundle = tmp_path / "many.bundle"
    export(state, bundle)
    reads(bundle, "partial")
    selection = canon.loads((bundle / "selections" / "org" / "1.json").read_bytes())
    assert selection["refusal"] == "limit-exceeded"
    sel = [e for e in epochs(bundle) if e["kind"] == "selection"]
    assert sel[0]["childIds"] == [f"people.o{i}" for i in range(1, 21)]
    # no child started: no people instance, no people output
    ex = canon.loads((bundle / "execution.json").read_bytes())
    assert [i["id"] for i in ex["instances"]] == ["org"]
    assert not (bundle / "outputs" / "people").exists()


# -- later unrelated artifacts -----------------------------------------------------


def test_later_unrelated_artifacts_leave_an_earlier_refusal_proved(tmp_path: Path) -> None:
    """b refused in the first group; a's later retry (an unrelated epoch) adds its
    artifacts after it: the reader still re-derives b's refusal at b's own prefix."""
    specs = [{"id": "a", "size": 50, "fail_first": True}, {"id": "b", "size": 6000}]
    # measure: a's failed attempt then b's accepted output, b's the last decision
    roomy = Case(tmp_path / "m", ROOMY)
    measuring = roomy.state()
    assert dispatch(roomy.pack, measuring, "-p", items(*specs)).returncode == 1
    t, _ = export(measuring, tmp_path / "m.bundle")
    assert 10000 <= t < ROOMY
    case = Case(tmp_path / "c", t - 1)  # b's output no longer fits after a's failure
    state = case.state()
    proc = dispatch(case.pack, state, "-p", items(*specs))
    assert proc.returncode == 1, proc.stderr
    export(state, tmp_path / "first.bundle")
    assert instance(tmp_path / "first.bundle", "people.b")["failure"] == "limit-exceeded"
    # a's retry (and b's own, with a smaller output) add artifacts after b's refusal
    retry = dispatch(
        case.pack, state, "--resume", "--retry-failed", "-p", items(*specs), extra={"SIZE_b": "16"}
    )
    assert retry.returncode == 0, retry.stderr
    bundle = tmp_path / "later.bundle"
    export(state, bundle)
    first = epochs(tmp_path / "first.bundle")
    later = epochs(bundle)
    assert later[: len(first)] == first  # b's refusal epoch unchanged
    retried = [e["begin"] for e in later[len(first) :] if e["kind"] == "retry"]
    assert [(r["instance"], r["number"]) for r in retried] == [("people.a", 2), ("people.b", 2)]
    # the reader re-derives b's refusal at its own prefix, whatever came later
    reads(bundle, "complete")
    b = instance(bundle, "people.b")
    assert [(a["state"], a["failure"]) for a in b["attempts"]] == [
        ("failed", "limit-exceeded"),
        ("completed", None),
    ]


def test_two_consumers_a_refusal_then_later_sibling_stage_outputs(tmp_path: Path) -> None:
    """Later unrelated artifacts in the same epoch: org's selection reserves people.*
    and sites.*; people.b's output is refused (a cutoff for people only), and sites'
    outputs, later in canonical order, are admitted after it."""
    specs = [{"id": "a", "size": 100}, {"id": "b", "size": 8000}]
    both = ("people", "sites")
    t = measured(tmp_path / "m", specs, both)
    case = Case(tmp_path / "c", t - 4000, both)
    state = case.state()
    proc = dispatch(case.pack, state, "-p", items(*specs))
    assert proc.returncode == 1, proc.stderr
    bundle = tmp_path / "c.bundle"
    export(state, bundle)
    reads(bundle, "partial")
    assert instance(bundle, "people.b")["failure"] == "limit-exceeded"
    # sites' outputs came later in the same epoch (canonical order) and were admitted
    assert instance(bundle, "sites.a")["state"] == "completed"
    assert (bundle / "outputs" / "sites" / "sites.a").is_dir()


# -- equal contents at separate paths --------------------------------------------------


def test_equal_contents_at_separate_paths_each_count(tmp_path: Path) -> None:
    specs = [{"id": "c1", "same": True, "size": 1500}, {"id": "c2", "same": True, "size": 1500}]
    t = measured(tmp_path / "m", specs)
    bundle = tmp_path / "m" / "calm.bundle"
    one = sorted((bundle / "outputs" / "people" / "people.c1").rglob("*.payload.json"))
    two = sorted((bundle / "outputs" / "people" / "people.c2").rglob("*.payload.json"))
    assert one and [p.read_bytes() for p in one] == [p.read_bytes() for p in two]
    assert supplied(bundle)[0] == t  # both copies are in the measured size
    # a bound that only a digest-keyed store would meet: the second copy is refused
    case = Case(tmp_path / "c", t - 1)
    state = case.state()
    assert dispatch(case.pack, state, "-p", items(*specs)).returncode == 1
    export(state, tmp_path / "c.bundle")
    reads(tmp_path / "c.bundle", "partial")
    assert instance(tmp_path / "c.bundle", "people.c2")["failure"] == "limit-exceeded"


# -- a forged refusal and a tampered output: verify refuses with its code -------------


def _calm_bundle(tmp_path: Path) -> Path:
    case = Case(tmp_path / "c", ROOMY)
    state = case.state()
    assert dispatch(case.pack, state, "-p", items(*SIBLINGS)).returncode == 0
    bundle = tmp_path / "calm.bundle"
    export(state, bundle)
    reads(bundle, "complete")
    return bundle


def test_forged_refusal_when_the_candidate_fits_is_refused(tmp_path: Path) -> None:
    """RFC 0024: b's candidate fit; a fails first and is retried later, and the run
    ends at exactly max_bytes, so b's outputs plus a's later bytes fill the bound.
    Forging b's refusal into the exported bundle is refused by the reader, which
    measures b's candidate at b's own prefix, not against a's later bytes."""
    specs = [{"id": "a", "size": 400, "fail_first": True}, {"id": "b", "size": 400}]

    def run(case: Case) -> Path:
        state = case.state()
        assert dispatch(case.pack, state, "-p", items(*specs)).returncode == 1
        again = dispatch(case.pack, state, "--resume", "--retry-failed", "-p", items(*specs))
        assert again.returncode == 0, again.stderr
        return state

    measuring = run(Case(tmp_path / "m", ROOMY))
    t, _ = export(measuring, tmp_path / "m.bundle")
    assert 10000 <= t < ROOMY
    state = run(Case(tmp_path / "c", t))  # admitted at exactly max_bytes
    bundle = tmp_path / "fits.bundle"
    assert export(state, bundle)[0] == t
    reads(bundle, "complete")
    # edit the exported bundle: mark b failed/limit-exceeded and drop its outputs
    ex = canon.loads((bundle / "execution.json").read_bytes())
    for inst in ex["instances"]:
        if inst["id"] == "people.b":
            inst["state"], inst["failure"] = "failed", "limit-exceeded"
            inst["attempts"][-1]["state"] = "failed"
            inst["attempts"][-1]["failure"] = "limit-exceeded"
    (bundle / "execution.json").write_bytes(canon.dumps(ex))
    sets = canon.loads((bundle / "sets" / "people.json").read_bytes())
    sets["records"] = [r for r in sets["records"] if r["instance"] != "people.b"]
    (bundle / "sets" / "people.json").write_bytes(canon.dumps(sets))
    shutil.rmtree(bundle / "outputs" / "people" / "people.b")
    code, report, err = verify(bundle)
    assert code == 1 and report["verdict"] == "finding", report
    problem = report["problem"]
    assert (problem["code"], problem["phase"]) == ("output-mismatch", 4)
    # at b's observation: the second result of the group that started a and b
    assert (problem["epoch"], problem["observation"]) == (4, 2)
    assert "finding: output-mismatch (phase 4, epoch 4, observation 2" in err


def test_tampered_output_file_is_refused(tmp_path: Path) -> None:
    bundle = _calm_bundle(tmp_path)
    payload = sorted((bundle / "outputs" / "people" / "people.a").rglob("*.payload.json"))[0]
    payload.write_bytes(payload.read_bytes().replace(b"nnnn", b"nnnm", 1))
    code, report, err = verify(bundle)
    assert code == 1 and report["verdict"] == "finding", report
    assert report["problem"]["code"] == "output-mismatch"
    assert (
        report["problem"]["path"] == payload.relative_to(bundle).as_posix()
        or report["problem"]["path"] is None
    )
    assert f"finding: {report['problem']['code']}" in err


def test_expect_pins_the_workflow_digest(tmp_path: Path) -> None:
    bundle = _calm_bundle(tmp_path)
    state = tmp_path / "c" / "state-1"
    pinned = "sha256:" + hashlib.sha256((state / "workflow.json").read_bytes()).hexdigest()
    assert verify(bundle, "--expect", pinned)[0] == 0
    code, report, _ = verify(bundle, "--expect", "sha256:" + "1" * 64)
    assert code == 1 and report["problem"]["code"] == "digest-mismatch"


# -- the retried sibling: the sibling-retry example's tour ----------------------------


def test_sibling_retry_tour(tmp_path: Path) -> None:
    pack = "examples/sibling-retry/pack.toml"
    state = tmp_path / "sr"
    first = dispatch(pack, state, "-p", "mode=retry")
    assert first.returncode == 1, first.stderr
    export(state, tmp_path / "first.bundle")
    reads(tmp_path / "first.bundle", "partial")
    assert instance(tmp_path / "first.bundle", "work.b")["failure"] == "limit-exceeded"
    second = dispatch(pack, state, "--resume", "--retry-failed", extra={"SIBLING_B_BYTES": "100"})
    assert second.returncode == 0, second.stderr
    bundle = tmp_path / "second.bundle"
    export(state, bundle)
    reads(bundle, "complete")
    # a retried explicitly in its own epoch first, then b in its own
    retries = [e["begin"] for e in epochs(bundle) if e["kind"] == "retry"]
    assert [r["instance"] for r in retries] == ["work.a", "work.b"]
    assert {r["retry"]["actor"] for r in retries} == {"tester"}
    # the first export's proof is a prefix of the second's: b's refusal unchanged,
    # b failed until its own retry
    first_epochs = epochs(tmp_path / "first.bundle")
    assert epochs(bundle)[: len(first_epochs)] == first_epochs
    assert instance(bundle, "work.b")["state"] == "completed"
    assert [a["state"] for a in instance(bundle, "work.b")["attempts"]] == [
        "failed",
        "completed",
    ]


# -- SIGTERM, --resume, export ---------------------------------------------------------


def test_sigterm_resume_export_verifies(tmp_path: Path) -> None:
    specs = [{"id": f"s{i}"} for i in range(4)]
    case = Case(tmp_path / "c", ROOMY)
    state = case.state()
    slow = {f"SLEEP_s{i}": "3" for i in range(4)}
    proc = subprocess.Popen(
        [DISPATCH, str(case.pack), "--state", str(state), "-j", "2", "-p", items(*specs)],
        cwd=REPO,
        env=env(**slow),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ops = state / "operations.ndjson"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ops.is_file() and b'"starts":["people.' in ops.read_bytes():
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the people group never began")
    # while it runs the state is not quiet: the export is refused, nothing written
    early = subprocess.run(
        [PROVE, "--state", str(state), "--out", str(tmp_path / "early.bundle")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert early.returncode == 1 and "a dispatcher is running" in early.stderr, early.stderr
    assert not (tmp_path / "early.bundle").exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    interrupted = tmp_path / "interrupted.bundle"
    export(state, interrupted)
    label = canon.loads((interrupted / "partial.json").read_bytes())
    assert label["reason"] in ("no-finish", "open-epoch")
    reads(interrupted, "partial")
    resumed = dispatch(case.pack, state, "--resume", "-p", items(*specs))
    assert resumed.returncode == 0, resumed.stderr
    done = tmp_path / "resumed.bundle"
    export(state, done)
    assert not (done / "partial.json").exists()
    reads(done, "complete")


# -- what an export refuses, and recording unavailable --------------------------------


def test_unaccounted_run_is_refused_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "hello"
    assert dispatch("examples/hello/pack.toml", state).returncode == 0
    proc = subprocess.run(
        [PROVE, "--state", str(state), "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        f"crucible-prove: error: {state}: an unaccounted run: no operations.ndjson (its pack "
        "declares no [workflow.limits], so there is no proof to export)\n"
    )
    assert not (tmp_path / "b").exists()


def test_recording_unavailable_exports_the_last_complete_prefix(tmp_path: Path) -> None:
    """sibling-retry: b retried with the same 6000 bytes leaves no room to record its
    refusal (its new attempt's material counts): the run stops with exit 3, and so
    does the export, which still writes the last complete prefix, labelled."""
    pack = "examples/sibling-retry/pack.toml"
    state = tmp_path / "sr"
    assert dispatch(pack, state, "-p", "mode=retry").returncode == 1
    stuck = dispatch(pack, state, "--resume", "--retry-failed")
    assert stuck.returncode == 3 and "recording unavailable" in stuck.stderr, stuck.stderr
    out = tmp_path / "sr.bundle"
    proc = subprocess.run(
        [PROVE, "--state", str(state), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert "(partial: recording-unavailable)" in proc.stderr
    label = canon.loads((out / "partial.json").read_bytes())
    assert label["reason"] == "recording-unavailable" and label["operationLine"] > 0
    custody = canon.loads((tmp_path / "sr.bundle.custody" / "custody.json").read_bytes())
    assert [i["instance"] for i in custody["items"]] == ["work.b"]
    reads(out, "partial")
