# The two commands of the README. Both set up everything they need on a fresh Debian machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test suite lint types imports provision sandbox-image app-image postgres-image test-db bench clean

# The suite runs in parallel (pytest-xdist): most tests wait on Docker, git, a browser or a
# subprocess rather than the CPU, so more workers than CPUs pays off (docs/contributing.md has the
# figures). `make test TEST_WORKERS=1` runs it in one process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL = $(if $(filter 0 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

## make run: the whole product on http://127.0.0.1:8000 (SQLite, in-process worker, demo data,
## one warm sandbox per image so a task starts without waiting for its container)
run: $(STAMP)
	@$(BIN)/forgehand sandbox build || echo "warning: no sandbox image (is Docker running?); tasks cannot run until 'forgehand sandbox build' succeeds"
	@$(BIN)/forgehand sandbox build --agents || echo "warning: no agents image (is npm installed?); claude-code tasks cannot run until 'forgehand sandbox build --agents' succeeds"
	FORGEHAND_TASK_SANDBOX_POOL=$${FORGEHAND_TASK_SANDBOX_POOL:-1} $(BIN)/forgehand serve

## make test: lint, types, import contracts and the whole test suite (real Docker included). The
## `db` tests run on SQLite (FORGEHAND_TEST_DATABASES=sqlite,postgresql for both); the
## multi-process suite runs on the PostgreSQL provisioned here (tests/docker/test_scale_out.py).
test: $(STAMP) lint types imports provision sandbox-image
	@port=$$(deploy/scripts/provision-test-host --postgres | tail -1); \
	FORGEHAND_TEST_DATABASE_URL=$${FORGEHAND_TEST_DATABASE_URL:-postgresql+asyncpg://forgehand:forgehand@127.0.0.1:$$port/forgehand_test} \
	FORGEHAND_TEST_DATABASES=$${FORGEHAND_TEST_DATABASES:-sqlite} \
	$(MAKE) --no-print-directory suite

# The modules that hold serial tests: the serial pass collects only those (collecting the whole
# suite again to deselect all but five tests costs more than the tests on a loaded runner).
SERIAL_MODULES = $(shell grep -rl --include='test_*.py' 'mark.serial' tests)

## the test suite alone, nothing provisioned or checked first (CI runs the phases one by one);
## the 30 slowest tests are printed, then where the time went (per directory, database, module)
suite: $(STAMP)
	@mkdir -p build; rc=0; \
	$(BIN)/pytest -q $(PYTEST_PARALLEL) -m "not serial" --durations=30 --junitxml=build/junit-parallel.xml || rc=$$?; \
	$(BIN)/pytest -q -m serial --durations=5 --junitxml=build/junit-serial.xml $(SERIAL_MODULES) || rc=$$?; \
	$(BIN)/python -m tests.support.suite_times build/junit-parallel.xml build/junit-serial.xml; \
	exit $$rc

# What the suite needs beyond Python and git (Docker engine, debootstrap, chromium, PostgreSQL),
# installed and started when missing (apt-get, as root or with sudo).
provision:
	deploy/scripts/provision-test-host --postgres

# The sandbox image (offline debootstrap recipe when no registry answers) and the agents image on top
# (the pinned CLIs from npm, cached in ~/.cache/forgehand/agents); cached, so a second run is quick.
sandbox-image: $(STAMP)
	$(BIN)/forgehand sandbox build
	$(BIN)/forgehand sandbox build --agents

# The application image, forgehand-app:<version>, offline: the sandbox image's Debian base plus
# forgehand and its dependencies from $(VENV) (deploy/app, docs/operator.md); cached on its recipe.
app-image: $(STAMP)
	VENV=$(VENV) deploy/scripts/build-app-image

# PostgreSQL for deploy/compose.yaml from Debian's packages on the same base (deploy/postgres).
postgres-image: $(STAMP)
	VENV=$(VENV) deploy/scripts/build-postgres-image

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

## database-touching tests only (CI runs these again with FORGEHAND_TEST_DATABASE_URL=postgresql+asyncpg://...)
test-db: $(STAMP) provision sandbox-image
	$(BIN)/pytest -q $(PYTEST_PARALLEL) -m "db and not serial"
	$(BIN)/pytest -q -m "db and serial"

bench: $(STAMP)
	$(BIN)/pytest -q -s tests/bench -p no:cacheprovider -o testpaths=tests/bench -o python_files='bench_*.py'

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
