# elastrain: `make demo` and `make test` work on a fresh machine (they install first).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint unit integration bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[examples,dev]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/elastrain demo --json artifacts/demo.json

lint: install
	$(VENV)/bin/ruff check elastrain tests examples bench
	$(VENV)/bin/ruff format --check elastrain tests examples bench
	$(VENV)/bin/mypy elastrain

unit: install
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

test: lint
	$(PY) -m pytest -q -p no:cacheprovider tests

bench: install
	$(PY) bench/vs_torchrun.py --json artifacts/bench.json

clean:
	rm -rf $(VENV) artifacts build *.egg-info
