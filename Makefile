# slurm_robust: the two commands are `make demo` and `make test` (both do all set-up).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/slurm-robust
# Two distributions, both editable: the library (.) and its rehearsal tooling (rehearsal/:
# the mini-cluster, fault injection, benchmarks; docs/DEVELOPING.md says why apart).
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
	$(PY) -m pip install -q -e '.[test,lightning,hf]' -e ./rehearsal

packages: venv
	$(CLI) cluster packages

spank: packages
	$(MAKE) -C spank

demo: setup
	$(PY) examples/demo.py

# The unit tests (`-m "not integration"`: no cluster, they share nothing) run in
# UNIT_WORKERS pytest-xdist processes *beside* the integration tests, at nice UNIT_NICE:
# the integration processes wait on their clusters for about a quarter of 2 cores' time,
# which the unit tests take instead of a phase of their own, and the niceness keeps them
# from slowing a cluster's job when both want the CPU (a shell starts a background command
# with SIGINT and SIGQUIT ignored, which its children would inherit: `env
# --default-signal` gives the tests the dispositions a terminal's would have). Output to
# .test-unit.log, printed once the integration tests end. The integration tests run
# in TEST_WORKERS processes, a test module each at a time; each starts a mini-cluster of
# its own (tests/conftest.py: namespaced, its own directory, ports, subnet and job ids) and
# stops it at the end (the trap stops them, and the unit run, even when pytest fails). The
# default is two processes where namespaces can be made (root, iproute2), else one
# (TEST_WORKERS=0; siblings need namespaces); two on this 2-core machine take about 23
# minutes instead of 40 (docs/DEVELOPING.md). Each pytest run ends with a timing summary
# (tests/timing.py); the last line adds them up with the set-up. Exit status 5 (nothing
# selected, e.g. PYTEST_ARGS naming only unit tests) counts as a pass. Budget: 25 min.
TEST_WORKERS ?=
UNIT_WORKERS ?= 2
UNIT_NICE ?= 10
test:
	@start=$$(date +%s); $(MAKE) --no-print-directory setup || exit $$?; \
	setup_s=$$(( $$(date +%s) - start )); \
	workers="$(TEST_WORKERS)"; if [ -z "$$workers" ]; then workers=0; \
	  [ "$$(id -u)" = 0 ] && command -v ip >/dev/null && workers=2; fi; \
	unit_pid=; \
	trap '[ -n "$$unit_pid" ] && kill $$unit_pid 2>/dev/null; \
	  for d in .minicluster .minicluster-*/; do \
	  [ -d "$$d" ] && $(CLI) cluster down --dir "$$d" >/dev/null 2>&1; done; true' EXIT; \
	nice -n $(UNIT_NICE) env --default-signal=INT,QUIT $(PY) -m pytest -n $(UNIT_WORKERS) \
	  -m "not integration" $(PYTEST_ARGS) > .test-unit.log 2>&1 & unit_pid=$$!; \
	echo "make test: the unit tests run beside the integration tests (nice $(UNIT_NICE));" \
	  "their output follows the integration tests'"; \
	$(PY) -m pytest -n $$workers --dist loadfile --no-loadscope-reorder -m integration \
	  $(PYTEST_ARGS); \
	cluster=$$?; [ $$cluster -eq 5 ] && cluster=0; \
	wait $$unit_pid; unit=$$?; unit_pid=; [ $$unit -eq 5 ] && unit=0; \
	echo "---------- the unit tests (ran beside the integration tests): .test-unit.log"; \
	cat .test-unit.log; \
	echo "make test: $$(( $$(date +%s) - start )) s in all, set-up $$setup_s s included," \
	  "$$workers integration workers, the unit tests beside them (budget 1500 s)"; \
	[ $$unit -eq 0 ] && exit $$cluster; exit $$unit

test-unit: venv
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check slurm_robust rehearsal ckpt analysis prolog epilog tests examples

cluster-up: setup
	$(CLI) cluster up

cluster-down:
	$(CLI) cluster down

clean:
	-$(MAKE) -C spank clean
	rm -rf build *.egg-info .pytest_cache .ruff_cache
