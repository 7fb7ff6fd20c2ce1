# rope-extend: `make test` and `make demo` work on a fresh machine (they create the virtualenvs).
# Torch is pinned to the CPU wheel here only; pyproject.toml keeps an open range for users' CUDA builds.
PYTHON ?= python3
VENV ?= .venv
VENV4 ?= .venv4
TORCH ?= torch==2.13.0
TRANSFORMERS5 ?= transformers>=5,<6
TRANSFORMERS4 ?= transformers>=4.45,<5
PIP_FLAGS ?= -q --disable-pip-version-check
PYTEST_FLAGS ?= -q -p no:cacheprovider

.PHONY: install install4 llamacpp test test5 test4 demo bench lint clean

install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH)"
	$(VENV)/bin/pip install $(PIP_FLAGS) -e ".[dev,eval]" "$(TRANSFORMERS5)" "$(TORCH)"
	touch $@

# A second environment on the latest transformers 4.x for the portability and parity tests.
install4: $(VENV4)/.installed
$(VENV4)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV4)
	$(VENV4)/bin/pip install $(PIP_FLAGS) "$(TORCH)"
	$(VENV4)/bin/pip install $(PIP_FLAGS) -e ".[dev]" "$(TRANSFORMERS4)" "huggingface_hub<1.0" "$(TORCH)"
	touch $@

# The real llama.cpp the GGUF parity tests run (built once into ~/.cache/rope-extend, 15-25 min on 2 cores, with
# progress lines; later runs reuse it). The tests' fixture builds it too if this step was skipped.
llamacpp: install
	$(VENV)/bin/python -m rope_extend.llamacpp

# The README's test command: the whole suite on transformers 5.x, then the portability/parity tests on 4.x.
test: install install4 llamacpp
	ROPE_EXTEND_OTHER_PYTHON=$(CURDIR)/$(VENV4)/bin/python $(VENV)/bin/python -m pytest $(PYTEST_FLAGS)
	ROPE_EXTEND_OTHER_PYTHON=$(CURDIR)/$(VENV)/bin/python $(VENV4)/bin/python -m pytest $(PYTEST_FLAGS) -m portability

demo: install
	$(VENV)/bin/python -m rope_extend.demo

bench: install
	$(VENV)/bin/python bench/run_all.py

lint: install
	$(VENV)/bin/ruff check rope_extend tests bench

clean:
	rm -rf $(VENV) $(VENV4) build *.egg-info .pytest_cache
