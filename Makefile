# slurm_robust: the two commands are `make demo` and `make test` (both do all set-up).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/slurm-robust
# The CPU build of torch that pip finds on this machine's disk; installed first so the
# package's own torch range is met without downloading a CUDA build of several GB.
TORCH_PIN ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup venv packages spank demo test test-unit lint bench clean cluster-up cluster-down

setup: venv packages spank

$(PY):
	python3 -m venv $(VENV)

venv: $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e '.[test,lightning,hf]'

packages: venv
	$(CLI) cluster packages

spank: packages
	$(MAKE) -C spank

demo: setup
	$(PY) examples/demo.py

# Unit and integration tests; each pytest process starts a mini-cluster of its own
# (tests/conftest.py) and stops it at the end (the trap stops them even when pytest
# fails). TEST_WORKERS=2 runs two pytest-xdist processes, a test module each at a time, each
# with its own namespaced cluster; the default, 0, is one process (docs/DEVELOPING.md says
# why). pytest ends with a timing summary (tests/timing.py); the last line adds the set-up.
# Budget: 25 min.
TEST_WORKERS ?= 0
test:
	@start=$$(date +%s); $(MAKE) --no-print-directory setup || exit $$?; \
	trap 'for d in .minicluster .minicluster-*/; do \
	  [ -d "$$d" ] && $(CLI) cluster down --dir "$$d" >/dev/null 2>&1; done; true' EXIT; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s in all, set-up included (budget 1500 s)"; \
	exit $$rc

test-unit: venv
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check slurm_robust ckpt analysis prolog epilog tests examples

cluster-up: setup
	$(CLI) cluster up

cluster-down:
	$(CLI) cluster down

clean:
	-$(MAKE) -C spank clean
	rm -rf build *.egg-info .pytest_cache .ruff_cache
