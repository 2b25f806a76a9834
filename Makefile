# One target per job. `make demo` and `make test` set up .venv/ on first use.
PY      := .venv/bin/python
# the one place the torch version is named (pyproject.toml only says torch>=2.4)
TORCH_VERSION := 2.13.0
VENV_OK := .venv/.installed

# Python keeps what it compiles: with PYTHONDONTWRITEBYTECODE in the environment, each of the
# tests' attnlm processes compiled the package again and each pytest worker rewrote every test
# file's asserts (15 s a worker); the caches are the ignored __pycache__ folders
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test test-docs test-full test-fast lint format bench bench-quick fuzz clean

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
# runs, within 10 minutes on 2 cores: two pytest workers (pytest-xdist), each taking whole
# files, keep both cores busy while the other waits on a subprocess; the ones marked slow (long
# trainings, kill tests of the demo, the 135M model's chats, builds of the C step for other
# CPUs) are left to test-full and .ci/run; the 15 slowest are listed at the end, so a test
# that grows shows
# the two workers share two cores: the OpenMP threads of the C step and of PyTorch wait for
# each other asleep rather than spinning, so a worker's spin does not steal the other's core
test test-full: export OMP_WAIT_POLICY := PASSIVE
test: $(VENV_OK) lint
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow" --durations=15

# every command block of README.md and docs/*.md, slow ones included, run as a user would
test-docs: $(VENV_OK)
	$(PY) -m pytest -q -m docs

# everything: `make test` plus every test and doc block marked slow (about 12 minutes more)
test-full: $(VENV_OK) lint
	$(PY) -m pytest -q -n 2 --dist loadfile

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

# every fuzz target (fuzz/fuzz_*.py: the GGUF reader, the tokenizer readers, the chat template
# renderer) for FUZZ_SECONDS each, coverage-guided by atheris from the committed corpus
# (fuzz/corpus/TARGET); new inputs go to build/fuzz/TARGET, a crash's input to build/fuzz/crashes
# (docs/reliability.md, "Fuzzing")
FUZZ_SECONDS ?= 60
fuzz: $(VENV_OK)
	$(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install -q -e '.[fuzz]'
	mkdir -p build/fuzz/crashes
	for f in fuzz/fuzz_*.py; do t=$$(basename $$f .py); t=$${t#fuzz_}; mkdir -p build/fuzz/$$t; \
	  echo "== $$t: $(FUZZ_SECONDS) s (log: build/fuzz/$$t.log)"; \
	  timeout $$(($(FUZZ_SECONDS) + 300)) $(PY) $$f build/fuzz/$$t fuzz/corpus/$$t \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=3072 \
	    -artifact_prefix=build/fuzz/crashes/$$t- > build/fuzz/$$t.log 2>&1; rc=$$?; \
	  grep -E "^#[0-9]+" build/fuzz/$$t.log | tail -n 1; \
	  if [ $$rc != 0 ]; then tail -n 30 build/fuzz/$$t.log; exit 1; fi; done

clean:
	rm -rf .venv build dist src/*.egg-info .pytest_cache .ruff_cache
