# The two commands of the quick start are `make serve` and `make test`; both are idempotent.
# On a GPU host: `make serve TORCH_INDEX=https://download.pytorch.org/whl/cu128` installs the CUDA build.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
INSTALLED := $(VENV)/.installed-$(TORCH_VERSION)$(if $(TORCH_INDEX),-cuda,-default)

.PHONY: install models system-deps serve test lint clean

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

models: install
	$(BIN)/voicepipe models fetch

system-deps:
	scripts/install-system-deps.sh

serve: install models
	$(BIN)/voicepipe serve

lint: install
	$(BIN)/ruff check voicepipe tests scripts

test: install models system-deps lint
	$(BIN)/pytest

clean:
	rm -rf $(VENV) models/*/ .pytest_cache
