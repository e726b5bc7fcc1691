# The two commands a new user needs: `make demo` (set up + run an example pack
# end to end) and `make test`. Everything installs into ./.venv from this repo.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@# an editable install is not byte-compiled, and PYTHONDONTWRITEBYTECODE
	@# would make every command recompile its modules at each start
	$(BIN)/python -m compileall -q tools
	touch $@

install: $(STAMP)

demo: install
	rm -rf demo-state demo-bundle
	@echo "== validate, compile, graph: examples/fanout"
	$(BIN)/crucible-validate examples/fanout/pack.toml
	$(BIN)/crucible-compile examples/fanout/pack.toml -o demo-plan.json
	$(BIN)/crucible-compile --digest examples/fanout/pack.toml
	$(BIN)/crucible-compile --graph mermaid examples/fanout/pack.toml
	@echo "== dispatch: fan-out, fold, settled join, epilogue"
	$(BIN)/crucible-dispatch demo-plan.json --state demo-state/fanout -j 2
	$(BIN)/crucible-dispatch report demo-state/fanout
	$(BIN)/crucible-dispatch report demo-state/fanout --html demo-state/fanout/timeline.html
	@echo "== dispatch: a fan-out over a fan-out's outputs, results computed from several tasks"
	$(BIN)/crucible-dispatch examples/aggregate/pack.toml --state demo-state/aggregate -j 2 --outputs -
	@echo "== ledger: a durable step, then its replay"
	mkdir -p demo-state/ledger
	$(BIN)/crucible-ledger run --dir demo-state/ledger --scope demo --key pack=fanout -- sh -c 'sleep 1; echo expensive result'
	$(BIN)/crucible-ledger run --dir demo-state/ledger --scope demo --key pack=fanout -- sh -c 'sleep 1; echo expensive result'
	@echo "== prove a recorded operation log, verify the bundle offline"
	$(BIN)/crucible-prove --workflow tests/vectors/proof/complete/workflow.json --operations tests/vectors/proof/complete/operations.ndjson --artifacts tests/vectors/proof/complete/artifacts --out demo-bundle
	$(BIN)/crucible-verify demo-bundle
	@echo "== an accounted run and its proof: examples/org-people"
	$(BIN)/crucible-dispatch examples/org-people/pack.toml --state demo-state/org-people
	$(BIN)/crucible-prove --state demo-state/org-people --out demo-state/org-people.bundle
	$(BIN)/crucible-verify demo-state/org-people.bundle
	@echo "demo done: see demo-state/fanout/timeline.html"

test: install
	$(BIN)/pytest

bench: install
	$(BIN)/nox -s bench

lint: install
	$(BIN)/nox -s lint

clean:
	rm -rf $(VENV) .nox .pytest_cache .mypy_cache .ruff_cache build *.egg-info demo-state demo-plan.json demo-bundle demo-bundle.custody
