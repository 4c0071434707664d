# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv on first use; onnxruntime-gpu is chosen where an NVIDIA GPU
# answers `nvidia-smi`, onnxruntime (CPU) otherwise.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ORT_EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(ORT_EXTRA)

WEB := seqexport/web
WEB_DEPS := $(WEB)/node_modules/.package-lock.json
SITE ?= site
BUNDLED := $(notdir $(patsubst %/config.json,%,$(wildcard models/pretrained/*/config.json)))

.PHONY: setup demo test lint clean web-deps

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(ORT_EXTRA),dev,plot,serve,openvino]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# onnxruntime-web, @huggingface/tokenizers and @huggingface/jinja for `seqexport web` and tests/test_web.py, from the
# committed lock. Without npm the browser tests skip (CI sets SEQEXPORT_REQUIRE_BROWSER=1: fail).
web-deps: $(WEB_DEPS)

$(WEB_DEPS): $(WEB)/package.json $(WEB)/package-lock.json
	@if command -v npm >/dev/null; then cd $(WEB) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: seqexport web and the browser tests need Node.js (npm)"; fi

# the exports, their parity and held-out decodes; then a site for the bundled models demo exported
demo: $(STAMP) web-deps
	$(BIN)/seqexport demo
	$(BIN)/seqexport web $$(for m in $(BUNDLED); do [ -f exported/$$m/manifest.json ] && echo exported/$$m; done) \
	  --out $(SITE) --overwrite \
	  --example "5 March 2021" --example "Friday, March 5th 2021" --example "05/03/87" --example "Mar 6, 21"

# --dist loadscope: a module's tests on one worker, so a module's fixtures (exports, servers,
# peers' builds) are made once, not once per worker: 12% less CPU over the suite (2026-12-06)
test: $(STAMP) web-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadscope

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) exported/*/ .pytest_cache $(WEB)/node_modules $(SITE)
