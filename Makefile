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
	touch $@

install: $(STAMP)

demo: install
	$(BIN)/crucible-validate examples/starlark/pack.toml
	$(BIN)/crucible-compile examples/starlark/pack.toml -o demo-plan.json
	$(BIN)/crucible-compile examples/starlark/pack.toml --digest
	$(BIN)/crucible-compile examples/starlark/pack.toml --graph mermaid

test: install
	$(BIN)/pytest

bench: install
	$(BIN)/nox -s bench

lint: install
	$(BIN)/nox -s lint

clean:
	rm -rf $(VENV) .nox .pytest_cache .mypy_cache .ruff_cache build *.egg-info demo-state demo-plan.json
