# The two commands of the README. Both set up .venv first (scripts/setup.sh is idempotent).
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup pipeline test lint
setup:
	bash scripts/setup.sh

pipeline: setup
	commrl forkserver run -- snakemake --cores 2

test: setup
	pytest -m "not slow" -n 2 --dist loadfile

lint: setup
	ruff check src tests benchmarks workflow scripts
