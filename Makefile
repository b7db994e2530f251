# The two commands of the README. Both set up the venv first: $(VENV), .venv unless VENV=<dir> is given
# (scripts/setup.sh, idempotent, builds the one PATH points at).
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup pipeline test lint
setup:
	COMMRL_VENV=$(abspath $(VENV)) bash scripts/setup.sh

# --rerun-incomplete: a job an interrupted run left behind is run again (training resumes from its
# checkpoints, a sweep from its storage) instead of stopping with IncompleteFilesException.
pipeline: setup
	commrl forkserver run -- snakemake --cores 2 --rerun-incomplete

test: setup
	pytest -m "not slow" -n 2 --dist loadfile

lint: setup
	ruff check src tests benchmarks workflow scripts
