# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv on first use; onnxruntime-gpu is chosen where an NVIDIA GPU
# answers `nvidia-smi`, onnxruntime (CPU) otherwise.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ORT_EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(ORT_EXTRA)

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(ORT_EXTRA),dev,plot,serve]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/seqexport demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) exported/*/ .pytest_cache
