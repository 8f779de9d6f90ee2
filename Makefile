# The two commands of README.md, and their parts.
.PHONY: setup setup-test demo serve test

setup:
	bash scripts/setup.sh

setup-test:
	bash scripts/setup.sh test

# LoRA-finetune the built-in demo model on the built-in demo dataset (a short run:
# the tiny model learns the Alpaca response format within a few dozen steps).
demo: setup
	.venv/bin/bitlora train --out demo-out --max-steps 30 --micro-batch-size 4 --grad-accum 1 --lr 2e-3

serve: setup
	.venv/bin/bitlora serve

test: setup-test
	.venv/bin/python -m pytest
