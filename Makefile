# Set-up is part of every target: a fresh clone needs only Python 3.11 (uv comes from PyPI).
PYTHON ?= python3
UV_VERSION := 0.13.8
UV := .tools/bin/uv
export CORPUS_HOME ?= $(CURDIR)/.corpus
# The instance is ./dagster.yaml (storage in ./.dagster): DAGSTER_HOME is the folder it is in.
export DAGSTER_HOME ?= $(CURDIR)

.PHONY: demo test test-slow test-soak lint ui clean chromium bytecode

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# The torch group (the CPU build, for the DataLoader test) is a local file on the machines this
# project runs CI on; where it is absent the group is left out and that one test says why.
TORCH_WHEEL := /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
UV_GROUPS := $(if $(wildcard $(TORCH_WHEEL)),--group torch)

# --compile-bytecode: every process (the CLI, Dagster, each pool worker) would otherwise compile
# Dagster and its dependencies from source where bytecode is not written (PYTHONDONTWRITEBYTECODE
# is set on CI machines): about 6 s per process start.
.venv/.synced: $(UV) pyproject.toml uv.lock Makefile
	$(UV) sync --frozen --compile-bytecode --python $(PYTHON) $(UV_GROUPS)
	touch $@

## Build, validate, approve and activate a demo snapshot; prints the snapshotId and generation.
demo: .venv/.synced
	$(UV) run --frozen --no-sync corpus-assets demo

# Debian's chromium for the real-browser UI test (Playwright drives it; it cannot download
# browsers here). Installed when missing and we are root; otherwise the test says why it skips
# (and fails under CI, where CI is set).
CHROMIUM := /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { [ "$$(id -u)" = 0 ] \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
	  || echo "chromium missing: 'sudo apt-get install chromium' (the browser test skips locally, fails under CI)"; }

# The three test tiers partition the suite: every test runs in exactly one of them
# (test_repository.py checks it). FAST_TIER is also pyproject's default, so a bare `pytest` runs
# the fast tier; CI (.ci/run) runs the fast and the slow tier; the soaks (marker `slow`: sweeps
# and 200-trial races, tens of minutes) run on demand.
FAST_TIER := not slow and not heavy and not browser and not faults
SLOW_TIER := not slow and (heavy or browser or faults)
SOAK_TIER := slow
PYTEST := $(UV) run --frozen --no-sync pytest -n auto --maxprocesses=4 --durations=25

# The project's own modules compiled as --compile-bytecode compiles the venv's: the editable
# install is not, and where PYTHONDONTWRITEBYTECODE is set every CLI, Dagster and pool process a
# test starts compiled them again (the fast tier spent about a tenth of its CPU time on it).
# compileall rewrites only what changed since.
bytecode: .venv/.synced
	$(UV) run --frozen --no-sync python -m compileall -q -j0 corpus_assets corpus_assets_tests bench

## Run ruff, the import-layering contracts and the fast test tier (PostgreSQL tests need 127.0.0.1:5432).
test: .venv/.synced chromium bytecode
	$(UV) run --frozen --no-sync ruff check corpus_assets corpus_assets_tests bench
	$(UV) run --frozen --no-sync lint-imports
	$(PYTEST) -m "$(FAST_TIER)"

## Run the slow test tier: real-browser UI, fault cases, crash and kill tests, clusters, soaks.
test-slow: .venv/.synced chromium bytecode
	$(PYTEST) -m "$(SLOW_TIER)"

## Run the soaks: the full SIGKILL sweep, 200-trial gate races, Ray waits (not in CI).
test-soak: .venv/.synced bytecode
	$(PYTEST) -m "$(SOAK_TIER)"

lint: .venv/.synced
	$(UV) run --frozen --no-sync ruff check corpus_assets corpus_assets_tests bench
	$(UV) run --frozen --no-sync lint-imports
	$(UV) run --frozen --no-sync ruff format --check corpus_assets corpus_assets_tests bench

## The Dagster UI on the same data home and instance as the CLI.
ui: .venv/.synced
	$(UV) run --frozen --no-sync dagster dev -w workspace.yaml

clean:
	rm -rf .corpus .dagster logs .logs_queue .nux
