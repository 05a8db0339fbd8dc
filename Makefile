# Two commands for a fresh machine: `make demo` and `make test` (each sets up first if needed).
SHELL := /bin/bash
ENV := source na_env.sh &&
PYTEST_ARGS ?=

.PHONY: setup demo test lint lock clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(ENV) bash scripts/demo.sh

test: setup
	@$(ENV) ruff check src tests scripts conftest.py
	@$(ENV) python -m pytest $(PYTEST_ARGS)

lint: setup
	@$(ENV) ruff check src tests scripts conftest.py

# Regenerate constraints.txt from the current venv after changing requirements.txt.
lock: setup
	@{ echo "# Exact versions of every package in .venv (pip freeze of a fresh setup). Regenerate with: make lock"; \
	  .venv/bin/pip freeze --all --exclude-editable | grep -v '^pip=='; } > constraints.txt

clean:
	rm -rf build install log results na_env.sh
