# One target per job. `make demo` and `make test` set up .venv/ on first use.
PY      := .venv/bin/python
# the one place the torch version is named (pyproject.toml only says torch>=2.4)
TORCH_VERSION := 2.13.0
VENV_OK := .venv/.installed

.PHONY: setup demo test test-docs test-full test-fast lint format bench bench-quick clean

$(VENV_OK): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the CPU wheel on this machine, no CUDA download
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(VENV_OK)

setup: $(VENV_OK)

demo: $(VENV_OK)
	$(PY) -m attnlm demo

# every test and doc block that runs in seconds (tests/docs: ~2 CPU minutes of them), what CI
# runs, within 10 minutes on 2 cores; the ones marked slow (long trainings, kill tests of the
# demo, the 135M model's chats) are left to test-full
test: $(VENV_OK) lint
	$(PY) -m pytest -q -m "not slow"

# every command block of README.md and docs/*.md, slow ones included, run as a user would
test-docs: $(VENV_OK)
	$(PY) -m pytest -q -m docs

# everything: `make test` plus every test and doc block marked slow (about 12 minutes more)
test-full: $(VENV_OK) lint
	$(PY) -m pytest -q

test-fast: $(VENV_OK)
	$(PY) -m pytest -q -m "not slow" -x

lint: $(VENV_OK)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: $(VENV_OK)
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

# every benchmark at its recorded size (long: hours on a small machine; figures: docs/benchmarks.md)
bench: $(VENV_OK)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

# every benchmark at small sizes (a few minutes): checks the scripts run; peers that are not
# installed are skipped with a line saying so
bench-quick: $(VENV_OK)
	for b in benchmarks/bench_*.py; do echo "== $$b"; \
	  ATTNLM_BENCH_QUICK=1 timeout 600 $(PY) $$b --quick || exit 1; done

clean:
	rm -rf .venv build dist src/*.egg-info .pytest_cache .ruff_cache
