# vllm-sizer: `make run` (the demo on emulated vLLM replicas) and `make test` (the whole suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: run test test-fast test-vllm validate-vllm lint layers docs bench venv prometheus kubectl clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# The model's compiled kernel, into its on-disk cache (model/queueing/kernel/jit.py): the
	# first command run after this one starts warm.
	$(PY) -m model.calibration.warmup
	rm -f $(VENV)/.installed-*
	touch $@

# Debian's Prometheus server, used by the integration tests (started by the tests on loopback).
prometheus:
	@command -v prometheus >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# `kubectl kustomize` renders the config/k8s packages in the manifest tests (the machine's apt
# sources carry kubectl; the tests fail loudly without it rather than skip).
kubectl:
	@command -v kubectl >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends kubectl >/dev/null; }

run: venv
	$(VENV)/bin/vllm-sizer demo

test: venv prometheus kubectl
	$(VENV)/bin/ruff check model exporter tests bench tools
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not vllm" -q
	site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir "$$site"; status=$$?; rm -rf "$$site"; exit $$status

# The generated documentation pages (reference from the code, results tables from
# bench/results/*.json); `tests/docs/` fails when they are out of date.
docs: venv
	$(PY) -m tools.docs_gen

test-fast: venv
	$(PY) -m pytest -m "not vllm and not integration" -q

lint: venv
	$(VENV)/bin/ruff check model exporter tests bench tools
	$(VENV)/bin/mypy

# The layer graph of model/ and exporter/: layer order, every module with its size and imports
# (tools/layout.py; `$(PY) -m tools.layout --markdown` rewrites docs/development/layout.md).
layers: venv
	$(PY) -m tools.layout

# Speed and accuracy figures, printed and written to bench/results/*.json (about 12 min on 2 cores; workload_realism.py and closed_loop.py take 4-5 min each).
bench: venv
	$(PY) bench/model_speed.py
	$(PY) bench/tuner_speed.py
	$(PY) bench/daemon_scale.py
	$(PY) bench/paper_table1.py
	$(PY) bench/model_vs_sim.py
	$(PY) bench/percentiles.py --jobs 2
	$(PY) bench/workload_realism.py
	$(PY) bench/closed_loop.py
	$(PY) bench/replay_trace.py
	$(PY) bench/short_windows.py
	$(PY) bench/tuner_robustness.py

# A real vLLM (CPU build) on loopback; its virtualenv, model and logs are cached in
# bench/real_vllm/cache/ (first run: about 2 min to install, 3.4 GB).
test-vllm: venv
	$(PY) -m bench.real_vllm.prepare
	$(PY) -m pytest -m vllm tests/vllm -q

# The sweep on a real vLLM, then the fit and its report in bench/results/, then the daemon live
# on it through Prometheus (23-40 min on 2 cores, by their load).
validate-vllm: venv prometheus
	$(PY) -m bench.real_vllm.prepare
	$(PY) -m bench.real_vllm.sweep
	$(PY) -m bench.real_vllm.report
	$(PY) -m bench.real_vllm.live

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# The container image built without a Docker daemon (Debian's buildah) and smoke-tested: user,
# /healthz, HEALTHCHECK, no test packages, the first cycle within 5 s on this CPU and on a stand-in
# for another, size (.ci/image-check; work dir IMAGE_WORKDIR; IMAGE_REUSE=1 skips the build).
.PHONY: image
image:
	bash .ci/image-check
