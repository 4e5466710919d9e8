# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv when absent,
# installs the project with exact pins from constraints.txt and, as root, the Debian packages.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.aiops-installed
EXTRAS ?= serve,analytics,agent,demo,dashboards,dev
# Debian packages: a C/C++ toolchain and cmake, to compile llama-cpp-python (no wheel on PyPI);
# bcc (python3-bpfcc) and Debian's kernel headers for the eBPF collector; Prometheus, which the
# dashboard tests run every PromQL panel query against.
ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_PACKAGES := build-essential cmake python3-bpfcc linux-headers-$(ARCH) prometheus
# Where the running kernel ships no headers, bcc gets this merged tree (BCC_KERNEL_SOURCE).
KERNEL_HEADERS := .build/kernel-headers

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.aiops-installed

.PHONY: demo test bench lint install vllm-env sysdeps ebpf-setup ebpf-headers docs clean

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

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip==$$(grep -oP '^pip==\K.*' constraints.txt || echo 25.3)"
	# llama-cpp-python compiles from source the first time (several minutes on 2 cores).
	$(BIN)/python -m pip install -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

# bcc comes from Debian (its Python module is tied to the distribution's libbcc): link that
# module into the virtualenv, and prepare kernel headers when the running kernel has none.
ebpf-setup: $(STAMP)
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

# vLLM (CPU build, ~3.5 GB with CPU torch) in its own virtualenv; Serve runs the vLLM
# model's replicas with this interpreter (the spec's `python`).
vllm-env: sysdeps $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade "pip==$$(grep -oP '^pip==\K.*' constraints.txt || echo 25.3)"
	$(VLLM_VENV)/bin/python -m pip install -c constraints-vllm.txt -e '.[replica,vllm]'
	# PyPI's torchvision/torchaudio/torchcodec crash beside CPU torch, and vLLM runs without them.
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

test: install vllm-env
	@# As root the eBPF and Prometheus tests must run (not skip): that is how CI runs.
	@if [ "$$(id -u)" = 0 ]; then export AIOPS_REQUIRE_EBPF=1 AIOPS_REQUIRE_PROMETHEUS=1; fi; \
	AIOPS_REQUIRE_VLLM=1 AIOPS_REQUIRE_COMPILED=1 $(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure"; exit 1; fi; \
	exit $$rc

demo: install
	$(BIN)/aiops demo

bench: install
	$(BIN)/python -m aiops bench all

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Regenerate the generated docs (a test checks they are current).
docs: install
	$(BIN)/aiops config docs > docs/configuration.md
	$(BIN)/aiops config schema > docs/schema.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) .aiops .build .pytest_cache .mypy_cache .ruff_cache
