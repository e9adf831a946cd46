# Two commands for a new user: `make run` (set up and serve) and `make test` (set up and test).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export OPENBLAS_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1

.PHONY: setup run test test-unit bench clean

setup: $(VENV)/.installed

# torch is pinned in pyproject.toml (2.13.0, the CPU build); a bare `torch` pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

run: setup
	$(VENV)/bin/chronicler serve

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/for_turn.py
	$(PY) bench/load.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis test-artifacts
