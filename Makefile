# ckptflow — two commands on a fresh machine: `make demo` and `make test`.
# Everything the tests and the demo need is installed here (CI runs on a fresh clone as root).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ckptflow-installed
SERVERS_ROOT := .ckptflow/test-servers
PYTEST_ARGS ?=

.PHONY: setup test test-fast demo lint bench servers-up servers-down clean

setup: $(STAMP)

# torch==2.13.0 is pinned in pyproject.toml, so it is resolved in the same pip command as everything
# that depends on it (transformers): pip takes the CPU build from local disk and never a newer torch.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "ckptflow needs Python 3.11 (set PYTHON=...)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@$(BIN)/python -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'
	@touch $@

lint: setup
	$(BIN)/ruff check src tests bench scripts demo
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint

# Starts SeaweedFS (real S3) and s3rver (a server that ignores If-None-Match) on 127.0.0.1, runs the
# whole suite, and stops both servers by PID whatever pytest's outcome; exits with pytest's status.
test: setup lint
	@set -u; \
	trap '$(BIN)/python tests/helpers/servers.py down --root $(SERVERS_ROOT)' EXIT; \
	$(BIN)/python tests/helpers/servers.py up --root $(SERVERS_ROOT) || exit $$?; \
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The suite without slow tests, for quick iteration.
test-fast: PYTEST_ARGS = -m "not slow"
test-fast: test

demo: setup
	$(BIN)/python -c 'import ckptflow' && bash demo/demo.sh

# Benchmarks print ratios against a peer measured in the same run (not timed tests). The transfer ones
# use a private SeaweedFS (demo ports) so they never disturb a running test server, with fresh data each
# time: SeaweedFS keeps the space of deleted objects until it compacts, and volumes that outgrow the
# page cache are served from disk, which made the figures drift from one run to the next.
bench: setup
	@set -u; \
	$(BIN)/python tests/helpers/servers.py down --root .ckptflow/bench-servers >/dev/null; rm -rf .ckptflow/bench-servers; \
	trap '$(BIN)/python tests/helpers/servers.py down --root .ckptflow/bench-servers; rm -rf .ckptflow/bench-servers' EXIT; \
	$(BIN)/python tests/helpers/servers.py up --only seaweedfs --profile demo --root .ckptflow/bench-servers >/dev/null || exit $$?; \
	for b in transfer publish fetch; do \
	  test -f bench/$$b.py || continue; \
	  echo "== bench/$$b.py" >&2; \
	  $(BIN)/python bench/$$b.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json || exit $$?; \
	done

servers-up: setup
	$(BIN)/python tests/helpers/servers.py up --root $(SERVERS_ROOT)

servers-down:
	$(BIN)/python tests/helpers/servers.py down --root $(SERVERS_ROOT)

clean: servers-down
	rm -rf .ckptflow .pytest_cache .ruff_cache
