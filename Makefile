# The two commands of README.md, and their parts.
.PHONY: setup setup-lite setup-test demo serve lite test

setup:
	bash scripts/setup.sh

setup-lite:
	bash scripts/setup.sh lite

setup-test:
	bash scripts/setup.sh test

# LoRA-finetune the built-in demo model on the built-in demo dataset (a short run:
# the tiny model learns the Alpaca response format within a few dozen steps).
demo: setup
	.venv/bin/bitlora train --out demo-out --max-steps 30 --micro-batch-size 4 --grad-accum 1 --lr 2e-3

serve: setup
	.venv/bin/bitlora serve

# The JupyterLite site (build/lite) with examples/*.ipynb, served with the app:
# open http://127.0.0.1:8765/lite/
lite: setup-lite
	.venv/bin/bitlora lite
	.venv/bin/bitlora serve

test: setup-test
	.venv/bin/python -m pytest -n 2
