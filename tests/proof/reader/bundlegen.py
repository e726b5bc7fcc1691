"""A small, deliberately naive bundle generator written from docs/spec/ alone.

It is the verify engineer's own reading of workflow.md / admission-proof.md, kept
independent of the writer (tools/proof/writer is never read): it rebuilds every
control file from scratch and hashes whole prefixes, with no incremental tricks,
so it is a second construction the reader's incremental one must agree with.
Decisions (admit/refuse, accept/refuse) are given by the test, not derived: the
reader's job is to check them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crucible.core import canon, digest

PINS = (
    "runDigest",
    "preparationDigest",
    "auditDigest",
    "evaluationErrorDigest",
    "auditSignaturesDigest",
)
FILES = {
    "runDigest": "run.json",
    "preparationDigest": "preparation.json",
    "auditDigest": "audit.json",
    "evaluationErrorDigest": "evaluation-error.json",
    "auditSignaturesDigest": "audit.sig",
}
AT = "2026-10-17T09:00:00Z"

DEFAULT_LIMITS = {
    "maxBytes": 10_000_000,
    "maxFiles": 100_000,
    "maxInstances": 10_000,
    "maxAttempts": 4,
    "maxRecords": 100_000,
    "maxCaseBytes": 4096,
    "maxPayloadBytes": 4096,
}


def stage(
    name: str,
    frm: str | None = None,
    fields: list[str] | None = None,
    pointer: str = "/items",
    cardinality: str = "many",
    admit: int | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "input": {"fromStage": frm, "fields": fields, "admitMaxBytes": admit},
        "output": {"pointer": pointer, "cardinality": cardinality},
    }


class Gen:
    def __init__(
        self,
        stages: list[dict[str, Any]],
        limits: dict[str, int] | None = None,
        execution: str = "exec-1",
        root: str = "root",
        root_case: Any = None,
    ) -> None:
        self.wf: dict[str, Any] = {
            "workflowVersion": 2,
            "name": "wf",
            "limits": {**DEFAULT_LIMITS, **(limits or {})},
            "stages": stages,
        }
        self.stage_names = [s["name"] for s in stages]
        self.files: dict[str, bytes] = {}
        self.files["workflow.json"] = canon.dumps(self.wf)
        for s in stages:
            self.files[f"frozen/{s['name']}.json"] = canon.dumps(s)
        case = canon.dumps(root_case if root_case is not None else {"q": "acme"})
        self.files["root-case.json"] = case
        self.files[f"instances/{root}/case.json"] = case
        frozen = [{"stage": s["name"], "digest": digest.of_bytes(canon.dumps(s))} for s in stages]
        self.frozen = frozen
        self.root_id = root
        self.proof: dict[str, Any] = {
            "admissionProofVersion": 1,
            "workflowDigest": digest.of_bytes(self.files["workflow.json"]),
            "execution": execution,
            "rootCaseDigest": digest.of_bytes(case),
            "frozenDigest": digest.of_json(frozen),
            "rootInstance": root,
            "epochBlocks": [],
        }
        self.epochs: list[dict[str, Any]] = []
        self.instances: list[dict[str, Any]] = []  # active, in reservation order (sorted at write)
        self.sets: dict[str, list[dict[str, Any]]] = {n: [] for n in self.stage_names}
        self.set_state = {n: "blocked" for n in self.stage_names}
        self.selection: dict[str, Any] = dict.fromkeys(self.stage_names)
        self.revisions = dict.fromkeys(self.stage_names, 0)
        self.extra: dict[str, bytes] = {}
        self._epoch({"kind": "root"})
        self.instances.append(
            {
                "id": root,
                "stage": self.stage_names[0],
                "parent": None,
                "selection": None,
                "caseDigest": digest.of_bytes(case),
                "state": "interrupted",
                "failure": None,
                "attempts": [],
            }
        )
        self.set_state[self.stage_names[0]] = "closed"
        self.reservations: dict[int, list[str]] = {1: [root]}

    # proof -----------------------------------------------------------------
    def proof_bytes(self, epochs: list[dict[str, Any]]) -> bytes:
        blocks = [epochs[i : i + 4096] for i in range(0, len(epochs), 4096)]
        return canon.dumps({**self.proof, "epochBlocks": blocks})

    def _epoch(self, body: dict[str, Any]) -> dict[str, Any]:
        e = {
            "number": len(self.epochs) + 1,
            "previousProofDigest": digest.of_bytes(self.proof_bytes(self.epochs)),
            **body,
        }
        self.epochs.append(e)
        return e

    def inst(self, iid: str) -> dict[str, Any]:
        return next(i for i in self.instances if i["id"] == iid)

    def consumers(self, u: str) -> list[str]:
        return [s["name"] for s in self.wf["stages"] if s["input"]["fromStage"] == u]

    def descendants(self, u: str) -> list[str]:
        out: list[str] = []
        todo = [u]
        while todo:
            for c in self.consumers(todo.pop()):
                out.append(c)
                todo.append(c)
        return out

    # operations ------------------------------------------------------------
    def select(
        self,
        u: str,
        selected: list[tuple[str, int]],
        child_ids: list[str] | None,
        refused: bool = False,
        fork: bool = False,
    ) -> int:
        if fork:
            for d in self.descendants(u):
                self.instances = [i for i in self.instances if i["stage"] != d]
                self.sets[d] = []
                self.set_state[d] = "blocked"
                self.selection[d] = None
        rev = self.revisions[u] + 1
        self.revisions[u] = rev
        core = {
            "selectionVersion": 1,
            "stage": u,
            "revision": rev,
            "review": {"actor": "rev", "at": AT},
            "offeredDigest": digest.of_json(self.sets[u]),
            "selected": [{"instance": i, "output": o} for i, o in selected],
        }
        e = self._epoch(
            {
                "kind": "fork" if fork else "selection",
                "stage": u,
                "revision": rev,
                "selectionCoreDigest": digest.of_json(core),
                "childIds": child_ids,
            }
        )
        path = f"selections/{u}/{rev}.json"
        if refused:
            self.files[path] = canon.dumps({**core, "refusal": "limit-exceeded"})
            if fork:
                self.selection[u] = None
            return int(e["number"])
        self.files[path] = canon.dumps(core)
        assert child_ids is not None
        ids = iter(child_ids)
        made: list[dict[str, Any]] = []
        for c in self.consumers(u):
            cdef = next(s for s in self.wf["stages"] if s["name"] == c)
            for i, o in selected:
                rec = next(r for r in self.sets[u] if r["instance"] == i and r["output"] == o)
                payload = canon.loads(
                    self.files[f"outputs/{u}/{i}/{rec['attempt']}/{o}.payload.json"]
                )
                cid = next(ids)
                fields = cdef["input"]["fields"]
                inst: dict[str, Any] = {
                    "id": cid,
                    "stage": c,
                    "parent": {"instance": i, "output": o},
                    "selection": {"stage": u, "revision": rev},
                    "caseDigest": None,
                    "state": "interrupted",
                    "failure": None,
                    "attempts": [],
                }
                if fields is not None and not all(f in payload for f in fields):
                    inst["state"], inst["failure"] = "failed", "projection-invalid"
                else:
                    projected = payload if fields is None else {f: payload[f] for f in fields}
                    case = canon.dumps(
                        {
                            "caseVersion": 1,
                            "stage": c,
                            "instance": cid,
                            "parent": {"instance": i, "output": o},
                            "input": projected,
                        }
                    )
                    self.files[f"instances/{cid}/case.json"] = case
                    inst["caseDigest"] = digest.of_bytes(case)
                    admit = cdef["input"]["admitMaxBytes"]
                    if admit is not None and len(canon.dumps(projected)) > admit:
                        inst["state"], inst["failure"] = "failed", "admission-refused"
                made.append(inst)
        self.instances.extend(made)
        for c in self.consumers(u):
            self.set_state[c] = "closed"
        self.selection[u] = {"revision": rev, "digest": digest.of_bytes(self.files[path])}
        self.reservations[e["number"]] = [m["id"] for m in made]
        return int(e["number"])

    def group(
        self,
        reservation: int,
        starts: list[str],
        cancelled: Sequence[str] = (),
        deferred: list[str] | None = None,
    ) -> int:  # type: ignore[assignment]
        order = [i for i in self.reservations[reservation]]
        eligible = [
            i
            for i in order
            if any(x["id"] == i for x in self.instances)
            and self.inst(i)["state"] == "interrupted"
            and not self.inst(i)["attempts"]
        ]
        if deferred is None:
            deferred = [i for i in eligible if i not in starts and i not in cancelled]
        e = self._epoch(
            {
                "kind": "group",
                "reservation": reservation,
                "starts": [{"instance": i, "number": 1, "retry": None} for i in starts],
                "deferred": deferred,
                "cancelled": [{"instance": i, "actor": "op", "at": AT} for i in cancelled],
                "results": [],
            }
        )
        for i in starts:
            self.inst(i)["attempts"].append(self._stub(1, None))
        for i in cancelled:
            self.inst(i)["state"] = "cancelled"
        return int(e["number"])

    def retry(self, iid: str) -> int:
        inst = self.inst(iid)
        n = len(inst["attempts"]) + 1
        self._epoch(
            {
                "kind": "retry",
                "begin": {"instance": iid, "number": n, "retry": {"actor": "op", "at": AT}},
                "results": [],
            }
        )
        inst["attempts"].append(self._stub(n, {"actor": "op", "at": AT}))
        return n

    @staticmethod
    def _stub(n: int, retry: Any) -> dict[str, Any]:
        return {
            "number": n,
            "state": "interrupted",
            "failure": None,
            "retry": retry,
            **dict.fromkeys(PINS),
        }

    def observe(
        self,
        iid: str,
        state: str = "evaluated",
        failure: str | None = None,
        audit: Any = None,
        files: dict[str, bytes] | None = None,
        accept: bool = True,
        finished: str | None = AT,
    ) -> None:
        inst = self.inst(iid)
        att = inst["attempts"][-1]
        n = att["number"]
        if files is None:
            files = {}
            if state == "evaluated":
                files = {
                    "runDigest": canon.dumps(
                        {"exportVersion": 3, "finishedAt": finished, "id": iid, "n": n}
                    ),
                    "preparationDigest": canon.dumps({"prep": iid, "n": n}),
                    "auditDigest": canon.dumps(audit if audit is not None else {"items": []}),
                }
            elif failure in ("preparation-failed", "admission-refused"):
                files = {
                    "runDigest": canon.dumps(
                        {"exportVersion": 2, "finishedAt": finished, "id": iid}
                    )
                }
            elif failure == "evaluation-error":
                files = {
                    "runDigest": canon.dumps(
                        {"exportVersion": 3, "finishedAt": finished, "id": iid}
                    ),
                    "preparationDigest": canon.dumps({"prep": iid}),
                    "evaluationErrorDigest": canon.dumps({"error": "boom"}),
                }
        obs = {
            "instance": iid,
            "number": n,
            "state": state,
            "failure": failure,
            **{p: (digest.of_bytes(files[p]) if p in files else None) for p in PINS},
        }
        for p, data in files.items():
            self.files[f"instances/{iid}/attempts/{n}/{FILES[p]}"] = data
        self.epochs[-1]["results"].append(obs)
        for p in PINS:
            att[p] = obs[p]
        if state == "evaluated":
            sdef = next(s for s in self.wf["stages"] if s["name"] == inst["stage"])
            value = canon.loads(files["auditDigest"])
            for tok in sdef["output"]["pointer"].split("/")[1:]:
                value = value[tok] if isinstance(value, dict) else value[int(tok)]
            records = [value] if sdef["output"]["cardinality"] == "one" else value
            if not accept:
                att["state"], att["failure"] = "failed", "limit-exceeded"
            else:
                att["state"] = "completed" if records else "completed-zero"
                for k, rec in enumerate(records):
                    payload = canon.dumps(rec)
                    base = f"outputs/{inst['stage']}/{iid}/{n}/{k}"
                    env = canon.dumps(
                        {
                            "envelopeVersion": 1,
                            "stage": inst["stage"],
                            "instance": iid,
                            "attempt": n,
                            "output": k,
                            "payloadDigest": digest.of_bytes(payload),
                            "parent": inst["parent"],
                        }
                    )
                    self.files[base + ".payload.json"] = payload
                    self.files[base + ".envelope.json"] = env
                    self.sets[inst["stage"]].append(
                        {
                            "instance": iid,
                            "attempt": n,
                            "output": k,
                            "payloadDigest": digest.of_bytes(payload),
                            "envelopeDigest": digest.of_bytes(env),
                        }
                    )
        elif state == "suppressed":
            att["state"], att["failure"] = "failed", "limit-exceeded"
        else:
            att["state"], att["failure"] = state, failure
        inst["state"], inst["failure"] = att["state"], att["failure"]

    # output ----------------------------------------------------------------
    def exported(self) -> dict[str, bytes]:
        proof = self.proof_bytes(self.epochs)
        pd = digest.of_bytes(proof)
        order = {n: i for i, n in enumerate(self.stage_names)}
        insts = sorted(self.instances, key=lambda i: order[i["stage"]])  # stable: reservation order
        ex = {
            "executionVersion": 2,
            "execution": self.proof["execution"],
            "workflowDigest": self.proof["workflowDigest"],
            "admissionProofDigest": pd,
            "frozen": self.frozen,
            "stages": [
                {"stage": n, "set": self.set_state[n], "selection": self.selection[n]}
                for n in self.stage_names
            ],
            "instances": insts,
        }
        out = dict(self.files)
        out["admission-proof.json"] = proof
        out["admission-proof.digest"] = (pd + "\n").encode()
        out["execution.json"] = canon.dumps(ex)
        for n in self.stage_names:
            out[f"sets/{n}.json"] = canon.dumps(
                {"setVersion": 1, "stage": n, "records": self.sets[n]}
            )
        out.update(self.extra)
        return out

    def write(self, root: Path) -> Path:
        for rel, data in self.exported().items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        return root


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def size_of(files: dict[str, bytes]) -> int:
    return sum(len(b) for b in files.values())


def org_people(people_audit: bool = True) -> Gen:
    """root org stage (two orgs) -> people (projected by name), each completed."""
    g = Gen(
        [
            stage("org", pointer="/orgs"),
            stage("people", "org", ["name"], pointer="/person", cardinality="one"),
        ],
        root="org-root",
    )
    g.group(1, ["org-root"])
    g.observe(
        "org-root", audit={"orgs": [{"name": "Acme", "size": 3}, {"name": "Globex", "size": 9}]}
    )
    r = g.select("org", [("org-root", 1), ("org-root", 0)], ["p-globex", "p-acme"])
    if people_audit:
        g.group(r, ["p-globex", "p-acme"])
        g.observe("p-globex", audit={"person": {"name": "Hank"}})
        g.observe("p-acme", audit={"person": {"name": "Wile"}})
    return g


def rich() -> Gen:
    """Three stages; projection-invalid and admission-refused slots; defer, cancel,
    a signature sidecar, an acquisition failure and its retry, a zero-record output."""
    g = Gen(
        [
            stage("org", pointer="/orgs"),
            stage("people", "org", ["name"], pointer="/person", cardinality="one", admit=40),
            stage("notes", "org", None, pointer="/notes"),
        ],
        root="org-root",
    )
    g.group(1, ["org-root"])
    g.observe(
        "org-root",
        audit={
            "orgs": [{"name": "Acme"}, {"name": "Globex"}, {"title": "NoName"}, {"name": "L" * 60}]
        },
    )
    r = g.select(
        "org",
        [("org-root", 0), ("org-root", 1), ("org-root", 2), ("org-root", 3)],
        ["p-acme", "p-globex", "p-noname", "p-long", "n-acme", "n-globex", "n-noname", "n-long"],
    )
    g.group(r, ["p-acme", "p-globex", "n-acme"], cancelled=["n-noname"])
    files = {
        "runDigest": canon.dumps({"exportVersion": 3, "finishedAt": AT, "i": "p-acme"}),
        "preparationDigest": canon.dumps({"prep": "p-acme"}),
        "auditDigest": canon.dumps({"person": {"name": "Wile"}}),
        "auditSignaturesDigest": b"sig-of-p-acme-attempt-1\n",
    }
    g.observe("p-acme", files=files)
    g.observe("p-globex", state="failed", failure="acquisition-failed")
    g.observe("n-acme", audit={"notes": []})
    g.retry("p-globex")
    files = {
        "runDigest": canon.dumps({"exportVersion": 3, "finishedAt": AT, "i": "p-globex"}),
        "preparationDigest": canon.dumps({"prep": "p-globex"}),
        "auditDigest": canon.dumps({"person": {"name": "Hank"}}),
        "auditSignaturesDigest": b"sig-of-p-globex-attempt-2\n",
    }
    g.observe("p-globex", files=files)
    return g
