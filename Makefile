# The two commands of README.md, and their parts.
.PHONY: setup setup-test serve test

setup:
	bash scripts/setup.sh

setup-test:
	bash scripts/setup.sh test

serve: setup
	.venv/bin/bitlora serve

test: setup-test
	.venv/bin/python -m pytest
