# gpuswapd build: `make run` starts a demo, `make test` installs deps, builds and tests.

CC      ?= cc
BUILD   ?= build
PREFIX  ?= /usr/local
DESTDIR ?=
PY      := /usr/bin/python3

# CUDA is auto-detected (nvcc on PATH or under /usr/local/cuda); CUDA=0 disables it.
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
ifeq ($(strip $(NVCC)),)
CUDA ?= 0
else
CUDA ?= 1
endif

# CUDA backend: compiled with nvcc into the same library. cudart is linked
# statically and libcublas is dlopen'ed at run time, so binaries start on
# machines without a GPU driver or CUDA libraries (the backend then reports
# itself unavailable and its tests skip).
CUDA_SRC := $(wildcard daemon/backend/cuda/*.cu)
ifeq ($(CUDA)$(if $(CUDA_SRC),1,0),11)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_OBJ := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC))
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
NVCCFLAGS := -std=c++17 -O2 -g $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror,-fPIC -Werror all-warnings \
             -I$(BUILD)/cuda-inc -DGPUSWAPD_CUDA
CUDA_DEFS := -DGPUSWAPD_CUDA
CUDA_LIBS := $(CUDA_HOME)/lib64/libcudart_static.a -ldl -lrt -lstdc++
else
CUDA_OBJ :=
CUDA_DEFS :=
CUDA_LIBS :=
endif

PKGS := libevent libevent_pthreads jansson yaml-0.1 libsystemd libpcre2-8 libcrypto
DEB_PKGS := libevent-dev libjansson-dev libyaml-dev libcriterion-dev libsystemd-dev libpcre2-dev libssl-dev libseccomp-dev pkg-config \
            python3-numpy python3-yaml python3-jinja2 curl prometheus gnuplot-nox clang libclang-rt-14-dev valgrind haproxy nodejs npm \
            clang-format cppcheck patchelf xz-utils
# commands the tests and benchmarks run (promtool: metrics validation; gnuplot: bench plots;
# clang: libFuzzer targets; valgrind: make test-valgrind; haproxy: the fleet test; node, npm: the OpenAI SDK test,
# Debian's nodejs and npm unless a node and npm are already there (NodeSource's nodejs conflicts with npm);
# clang-format, cppcheck: make check / make format; patchelf, xz: make gpu-bundle)
DEB_CMDS := curl promtool gnuplot clang valgrind haproxy node npm clang-format cppcheck patchelf xz

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

OPT ?= -O2
SAN ?=
ifeq ($(SAN),1)
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
endif
# SAN=fuzz (with CC=clang): libFuzzer instrumentation, for `make fuzz` in build-fuzz/.
ifeq ($(SAN),fuzz)
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
endif

CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g $(OPT) -pthread -MMD -MP \
              -iquote daemon -iquote tests/tools/lib -iquote proto -iquote config \
              -iquote clients $(PKG_CFLAGS) $(SANFLAGS) \
              $(CUDA_DEFS) $(CFLAGS)
LDLIBS_ALL := $(PKG_LIBS) $(CUDA_LIBS) -lm -pthread $(LDLIBS)
LDFLAGS_ALL := $(SANFLAGS) $(LDFLAGS)

# Everything but main.c goes into one library, libgpuswapd.a, that the daemon, tools and tests
# link. Its layers (each includes only those before it; make check): daemon/base, daemon/kernels,
# daemon/backend (CUDA in daemon/backend/cuda), daemon/engine, proto/ and config/, then the
# worker (daemon/worker) and the one-shot modes (daemon/oneshot), then the front end (daemon/front).
ENGINE_SRC := $(wildcard daemon/base/*.c) $(wildcard daemon/kernels/*.c) $(wildcard daemon/backend/*.c) \
              $(wildcard daemon/engine/*.c) $(wildcard proto/*.c) $(wildcard config/*.c) \
              $(wildcard daemon/worker/*.c) $(wildcard daemon/oneshot/*.c) \
              $(filter-out daemon/front/main.c,$(wildcard daemon/front/*.c))
DAEMON_SRC := daemon/front/main.c
TOOL_SRC   := $(wildcard tests/tools/*.c)
# syscage (the systemd unit's W^X and system-call filter around a test run) needs libseccomp-dev;
# without it the other tools still build and gpu-check's unit stage says it ran unwrapped.
SECCOMP_LIBS := $(shell pkg-config --libs libseccomp 2>/dev/null)
ifeq ($(strip $(SECCOMP_LIBS)),)
TOOL_SRC   := $(filter-out tests/tools/syscage.c,$(TOOL_SRC))
endif
TLIB_SRC   := $(wildcard tests/tools/lib/*.c)
UNIT_SRC   := $(wildcard tests/unit/*.c)
BENCH_SRC  := $(wildcard tests/bench/*.c)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))


ENGINE_LIB := $(BUILD)/libgpuswapd.a
TOOLS_LIB  := $(BUILD)/libtesttools.a
GPUSWAPD   := $(BUILD)/gpuswapd
TOOLS      := $(patsubst tests/tools/%.c,$(BUILD)/%,$(TOOL_SRC))
UNIT_BIN   := $(BUILD)/unit_tests
BENCH_BIN  := $(patsubst tests/bench/%.c,$(BUILD)/%,$(BENCH_SRC))
SIM_SRC    := $(wildcard tests/bench/sim/*.c)
TRACESIM   := $(BUILD)/tracesim

.SECONDARY:

.PHONY: all deps check format options test test-unit test-unit-caged test-integration test-asan run bench bench-long bench-overload fuzz gpu-check gpu-bundle install clean

all: $(GPUSWAPD) $(TOOLS) $(BUILD)/gpuswap

# ---------------------------------------------------------------- deps
# Installs Debian packages only when something is missing.
deps:
	@missing=0; \
	for p in $(PKGS) criterion libseccomp; do pkg-config --exists $$p 2>/dev/null || missing=1; done; \
	$(PY) -c 'import numpy, yaml, jinja2' 2>/dev/null || missing=1; \
	for c in $(DEB_CMDS); do command -v $$c >/dev/null 2>&1 || [ -x /usr/sbin/$$c ] || missing=1; done; \
	if [ $$missing = 1 ]; then \
	  pkgs='$(DEB_PKGS)'; \
	  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then \
	    pkgs='$(filter-out nodejs npm,$(DEB_PKGS))'; fi; \
	  echo "deps: installing $$pkgs"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$pkgs >/dev/null || exit 1; \
	else echo "deps: all present"; fi
	@# the OpenAI Node SDK, zod and ajv for the integration tests and make bench, pinned by
	@# tests/node/package-lock.json (skipped without node); again whenever the lock file is newer
	@# (dash's test -nt is false when the second file is missing: a fresh clone checks for it)
	@if command -v npm >/dev/null 2>&1 && { [ ! -f tests/node/node_modules/.package-lock.json ] || \
	  [ tests/node/package-lock.json -nt tests/node/node_modules/.package-lock.json ]; }; then \
	  echo "deps: npm ci in tests/node"; npm ci --prefix tests/node --no-audit --no-fund >/dev/null || exit 1; fi

# ---------------------------------------------------------------- build
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

# nvcc has no -iquote, and -Idaemon would put daemon/'s own headers on the <...> path and within
# reach of the backend layer: it sees the layer folders only, through links ("kernels/quant.h" as
# the C compiler reads it with -iquote daemon).
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@) $(BUILD)/cuda-inc
	@for l in base kernels backend engine; do ln -sfn $(CURDIR)/daemon/$$l $(BUILD)/cuda-inc/$$l; done
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
# the .cu files include the folder's .cuh files and, through cuda_int.cuh, these C headers (nvcc
# writes no dependency files here: a slot added to backend.h must rebuild the vtable in cuda.cu)
ifneq ($(CUDA_OBJ),)
$(CUDA_OBJ): $(wildcard daemon/backend/cuda/*.cuh) daemon/backend/backend.h daemon/kernels/tensor.h \
             daemon/kernels/quant.h daemon/kernels/wtype.h
endif

$(ENGINE_LIB): $(call obj,$(ENGINE_SRC)) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(TOOLS_LIB): $(call obj,$(TLIB_SRC))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(GPUSWAPD): $(call obj,$(DAEMON_SRC)) $(ENGINE_LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/gpuswap: $(call obj,$(wildcard clients/*.c)) $(ENGINE_LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/%: $(BUILD)/obj/tests/tools/%.o $(TOOLS_LIB) $(ENGINE_LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/syscage: $(BUILD)/obj/tests/tools/syscage.o
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(SECCOMP_LIBS) $(LDLIBS_ALL)

$(BUILD)/bench_%: $(BUILD)/obj/tests/bench/bench_%.o $(TOOLS_LIB) $(ENGINE_LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

# A libFuzzer binary (SAN=fuzz builds only): the target with its LLVMFuzzerTestOneInput.
$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(TOOLS_LIB) $(ENGINE_LIB)
	$(CC) $(CFLAGS_ALL) -DFUZZ_LIBFUZZER -fsanitize=fuzzer $(LDFLAGS_ALL) -o $@ $< $(TOOLS_LIB) $(ENGINE_LIB) $(LDLIBS_ALL)

$(TRACESIM): $(call obj,$(SIM_SRC)) $(call obj,$(wildcard clients/fleet*.c)) $(ENGINE_LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LDLIBS_ALL)

$(UNIT_BIN): $(call obj,$(UNIT_SRC)) $(call obj,$(FUZZ_SRC)) $(call obj,$(wildcard clients/fleet*.c)) $(TOOLS_LIB) $(ENGINE_LIB)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ -lcriterion $(LDLIBS_ALL)

# ---------------------------------------------------------------- source rules
# `make check`: includes follow the layer order (base -> kernels -> backend -> engine -> proto,
# config -> worker, oneshot -> front), CUDA only under daemon/backend/cuda/, clang-format clean
# (.clang-format), no function nothing calls beyond tests/tools/check-unused.txt, Markdown tables
# with a header row, no production file over 1,200 lines nor function over 120, README's option
# table as the schema prints it, no cycle among folders by includes nor among files by the symbols
# of their objects beyond tests/tools/check-cycles.txt (tests/tools/check.sh says which rule and
# where). It builds the production objects and gpuswapd first: the file rule reads the objects
# with nm, the options rule runs `gpuswapd options`.
# `make format` rewrites every C, header and CUDA file git knows in the house style.
CHECK_OBJ := $(call obj,$(ENGINE_SRC) $(DAEMON_SRC) $(wildcard clients/*.c)) $(CUDA_OBJ)
check: $(CHECK_OBJ) $(GPUSWAPD)
	BUILD=$(BUILD) CHECK_CUDA=$(if $(CUDA_OBJ),1,0) bash tests/tools/check.sh

# the README's option table from the schema (config/cfg_schema.c; make check compares them)
options: $(GPUSWAPD)
	$(PY) tests/tools/options-table.py $(GPUSWAPD) README.md --write

format:
	git ls-files -z -- '*.c' '*.h' '*.cu' '*.cuh' | xargs -0 -r clang-format -i

# ---------------------------------------------------------------- tests
test: deps
	$(MAKE) check
	$(MAKE) all $(UNIT_BIN) $(TRACESIM)
	$(MAKE) gpu-bundle-if-cuda
	$(MAKE) test-unit test-integration

test-unit: $(UNIT_BIN) $(TOOLS)
	GPUSWAPD_BUILD=$(BUILD) bash tests/unit/run.sh $(UNIT_BIN)

# The unit tests with each Criterion worker under the systemd unit's MemoryDenyWriteExecute= and
# SystemCallFilter= (tests/tools/syscage.c, tests/unit/test_cage.c); gpu-check runs the CUDA ones so.
# No leak check there (SAN=1): LeakSanitizer needs ptrace, which the filter refuses; test-asan has it.
test-unit-caged: $(UNIT_BIN) $(TOOLS)
	ASAN_OPTIONS="$${ASAN_OPTIONS:+$$ASAN_OPTIONS:}detect_leaks=0" GPUSWAPD_BUILD=$(BUILD) \
	  GPUSWAPD_UNIT_WRAP="$(BUILD)/syscage -v --in-workers --" bash tests/unit/run.sh $(UNIT_BIN)

test-integration: all $(TRACESIM)
	GPUSWAPD_BUILD=$(BUILD) bash tests/integration/run.sh

test-asan: deps
	$(MAKE) gpu-bundle-if-cuda
	$(MAKE) BUILD=build-asan SAN=1 all build-asan/unit_tests
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
	  $(MAKE) BUILD=build-asan SAN=1 test-unit test-integration

# The integration suite with the daemons of gsd.Daemon (and gsd.generate_cli) under valgrind
# memcheck: an error or a definite leak fails the test; timeouts are stretched (gsd.TIMEOUT_FACTOR).
.PHONY: test-valgrind
test-valgrind: deps
	$(MAKE) all $(TRACESIM)
	GPUSWAPD_BUILD=$(BUILD) GPUSWAPD_VALGRIND=1 bash tests/integration/run.sh

# libFuzzer targets tests/fuzz/fuzz_*.c, built with clang in build-fuzz/ and run FUZZ_TIME seconds
# each (FUZZ_TARGETS=gguf ... picks some) on a copy of their corpus; crash inputs are left in
# build-fuzz/crashes/<name>/. `make test` replays the corpora and regressions (fuzz_regress/*).
FUZZ_TIME    ?= 60
FUZZ_NAMES   := $(patsubst tests/fuzz/fuzz_%.c,%,$(FUZZ_SRC))
FUZZ_TARGETS ?= $(FUZZ_NAMES)
FUZZ_CC      ?= clang
fuzz:
	$(MAKE) BUILD=build-fuzz CC=$(FUZZ_CC) CUDA=0 SAN=fuzz $(patsubst %,build-fuzz/fuzz_%,$(FUZZ_TARGETS))
	bash tests/fuzz/run.sh build-fuzz $(FUZZ_TIME) $(FUZZ_TARGETS)

# ---------------------------------------------------------------- run / bench
run: all
	bash tests/tools/demo.sh $(BUILD)

bench: $(GPUSWAPD) $(TOOLS) $(BENCH_BIN) $(TRACESIM)
	LLAMA_CPP=$(LLAMA_CPP) LLAMA_CPP_OLD=$(LLAMA_CPP_OLD) bash tests/bench/run.sh $(BUILD)
	bash tests/bench/run_moe.sh $(BUILD) $(BUILD)/bench
	bash tests/bench/run_lora.sh $(BUILD) $(BUILD)/bench
	bash tests/bench/run_sim.sh $(BUILD) $(BUILD)/bench
	bash tests/bench/run_sched.sh $(BUILD) $(BUILD)/bench
	bash tests/bench/run_lora_sim.sh $(BUILD) $(BUILD)/bench
	LLAMA_SERVER=$(LLAMA_SERVER) LLAMA_SERVER_OLD=$(LLAMA_SERVER_OLD) bash tests/bench/run_prefix.sh $(BUILD) $(BUILD)/bench
	$(PY) tests/bench/conv_swap.py $(BUILD) $(BUILD)/bench $(BUILD)/bench/llama134m-q8_0-ctx4096.gguf
	bash tests/bench/run_schemas.sh $(BUILD) $(BUILD)/bench

# issue 43's long contexts: prefill and decode from 2k, 8k and 32k cached positions (F16 KV on both
# sides) beside llama.cpp's llama-bench -d (LLAMA_CPP current; c392e50's has no -d, so its server
# LLAMA_SERVER_OLD stands in);
# two threads, 3 rounds; the 32k rows take most of the time (about an hour on 2 cores with a peer)
BENCH_LONG_DEPTHS ?= 2048 8192 32768
BENCH_LONG_TYPES  ?= q8_0 q4_k_m
bench-long: $(BUILD)/bench_engine $(BUILD)/mkmodel
	for d in $(BENCH_LONG_DEPTHS); do BENCH_DEPTH=$$d BENCH_THREADS=$${BENCH_THREADS:-2} \
	    BENCH_ROUNDS=$${BENCH_ROUNDS:-3} LLAMA_CPP=$(LLAMA_CPP) LLAMA_CPP_OLD=$(LLAMA_CPP_OLD) \
	    LLAMA_SERVER_OLD=$(LLAMA_SERVER_OLD) \
	    bash tests/bench/run_engine.sh $(BUILD) $(BENCH_LONG_TYPES) || exit 1; done

# issue 44's overload rows (docs/overload.md): N* models per GPU at 0.08-0.2 req/s each with a 2 s
# first-token deadline, the default beside lru-batch and lru-batch-drop; tracesim only, ~10 min on 2 cores
bench-overload: $(TRACESIM)
	bash tests/bench/run_overload.sh $(BUILD) $(BUILD)/bench

# GPU (README "GPU check"). Here: make gpu-bundle packs the binaries gpu-check runs and the shared
# libraries they need (DT_RPATH $ORIGIN/lib, no LD_LIBRARY_PATH) into $(GPU_ARCHIVE), refused when it
# and the working tree pass $(GPU_CARRY_MAX_MIB) MiB. There: carry $(GPU_CARRY), unpack, and run
# tests/tools/gpu-check.sh --call 1, then --call 2 (the exact commands are in the README).
# make gpu-check on a GPU machine runs every stage on the bundle, or on a build when it can make one.
GPU_FROM    ?= build
GPU_BUILD   ?= build-gpu
GPU_CARRY   ?= build-carry
GPU_ARCHIVE ?= $(GPU_CARRY)/gpu-bundle.tar.xz
GPU_BINS    := gpuswapd unit_tests bench_paging mkmodel beinfo $(if $(SECCOMP_LIBS),syscage)
GPU_CARRY_MAX_MIB := 60
gpu-check:
	@if [ -x $(GPU_BUILD)/unit_tests ] && [ -x $(GPU_BUILD)/beinfo ]; then b=$(GPU_BUILD); \
	elif [ -f $(GPU_ARCHIVE) ]; then tar -xJf $(GPU_ARCHIVE) || exit 1; b=$(GPU_BUILD); \
	elif [ -n "$(NVCC)" ] && pkg-config --exists $(PKGS) criterion 2>/dev/null; then \
	  $(MAKE) all $(UNIT_BIN) $(BUILD)/bench_paging $(BUILD)/beinfo $(TRACESIM) || exit 1; b=$(BUILD); \
	else echo "gpu-check: nothing to run: no bundle ($(GPU_BUILD)/ or $(GPU_ARCHIVE)), and no build can be made" \
	  "here ($(if $(NVCC),nvcc found,no nvcc); libraries: $$(pkg-config --exists $(PKGS) criterion 2>/dev/null && echo found || \
	  echo 'missing, from: libevent jansson libyaml libsystemd pcre2 libcrypto criterion'))." \
	  "Run make gpu-bundle on a machine that builds the project and carry $(GPU_CARRY)/ here, or install" \
	  "the libraries (make deps) and nvcc." >&2; exit 2; fi; \
	BUILD=$$b bash tests/tools/gpu-check.sh --call all

# make test and test-asan: the bundle the dry run (tests/integration/test_gpu_dryrun.sh) carries
.PHONY: gpu-bundle-if-cuda
gpu-bundle-if-cuda:
	@if [ -n "$(NVCC)" ]; then $(MAKE) --no-print-directory gpu-bundle; else echo "gpu-bundle: skipped, no nvcc"; fi

gpu-bundle:
	@[ -n "$(NVCC)" ] || { echo "gpu-bundle: no nvcc: a bundle without the cuda backend would check nothing" >&2; exit 1; }
	$(MAKE) BUILD=$(GPU_FROM) SAN= CUDA=1 $(GPU_ARCHIVE)

$(GPU_ARCHIVE): $(patsubst %,$(GPU_FROM)/%,$(GPU_BINS)) tests/tools/gpu-bundle.sh
	NVCC=$(NVCC) bash tests/tools/gpu-bundle.sh $(GPU_FROM) $(GPU_BUILD) $@ $(GPU_CARRY_MAX_MIB) $(GPU_BINS)

# ---------------------------------------------------------------- install
# `make install [PREFIX=/usr/local] [DESTDIR=...]`. Units go to $(PREFIX)/lib/systemd/system,
# which systemd reads for PREFIX /usr/local and /usr (`systemd-analyze unit-paths`); other
# prefixes set UNITDIR=/etc/systemd/system. sysusers.d and tmpfiles.d entries go to /usr/lib,
# which systemd reads whatever the prefix. The config is installed only when none is there.
# Without DESTDIR, as root, install also creates the user and directories and reloads systemd.
BINDIR      ?= $(PREFIX)/bin
SYSCONFDIR  ?= /etc
DOCDIR      ?= $(PREFIX)/share/doc/gpuswapd
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= /usr/lib/sysusers.d
TMPFILESDIR ?= /usr/lib/tmpfiles.d
UNIT_SUBST  := -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g'

.PHONY: uninstall

install: $(GPUSWAPD)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
	  $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSCONFDIR)/gpuswapd
	install -m 0755 $(GPUSWAPD) $(DESTDIR)$(BINDIR)/gpuswapd
	if [ -x $(BUILD)/gpuswap ]; then install -m 0755 $(BUILD)/gpuswap $(DESTDIR)$(BINDIR)/gpuswap; fi
	sed $(UNIT_SUBST) systemd/gpuswapd.service.in > $(DESTDIR)$(UNITDIR)/gpuswapd.service.tmp
	chmod 0644 $(DESTDIR)$(UNITDIR)/gpuswapd.service.tmp
	mv -f $(DESTDIR)$(UNITDIR)/gpuswapd.service.tmp $(DESTDIR)$(UNITDIR)/gpuswapd.service
	install -m 0644 systemd/gpuswapd.socket systemd/gpuswapd-admin.socket $(DESTDIR)$(UNITDIR)/
	install -m 0644 systemd/gpuswapd.sysusers $(DESTDIR)$(SYSUSERSDIR)/gpuswapd.conf
	install -m 0644 systemd/gpuswapd.tmpfiles $(DESTDIR)$(TMPFILESDIR)/gpuswapd.conf
	install -m 0644 README.md proto/PROTOCOL.md $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(DOCDIR)/docs
	install -m 0644 docs/*.md $(DESTDIR)$(DOCDIR)/docs/
	install -m 0644 config/gpuswapd.yaml $(DESTDIR)$(DOCDIR)/gpuswapd.yaml.example
	if [ -e $(DESTDIR)$(SYSCONFDIR)/gpuswapd/gpuswapd.yaml ]; then \
	  echo "install: keeping $(DESTDIR)$(SYSCONFDIR)/gpuswapd/gpuswapd.yaml (example in $(DOCDIR))"; \
	else install -m 0644 config/gpuswapd.yaml $(DESTDIR)$(SYSCONFDIR)/gpuswapd/gpuswapd.yaml; fi
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then \
	  if command -v systemd-sysusers >/dev/null; then \
	    echo "systemd-sysusers $(SYSUSERSDIR)/gpuswapd.conf"; systemd-sysusers $(SYSUSERSDIR)/gpuswapd.conf; fi; \
	  if command -v systemd-tmpfiles >/dev/null; then \
	    echo "systemd-tmpfiles --create $(TMPFILESDIR)/gpuswapd.conf"; systemd-tmpfiles --create $(TMPFILESDIR)/gpuswapd.conf; fi; \
	  if [ -d /run/systemd/system ]; then echo "systemctl daemon-reload"; systemctl daemon-reload; fi; \
	fi

# Removes what install put, except the config in $(SYSCONFDIR)/gpuswapd and the user.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/gpuswapd $(DESTDIR)$(BINDIR)/gpuswap
	rm -f $(DESTDIR)$(UNITDIR)/gpuswapd.service $(DESTDIR)$(UNITDIR)/gpuswapd.socket \
	  $(DESTDIR)$(UNITDIR)/gpuswapd-admin.socket
	rm -f $(DESTDIR)$(SYSUSERSDIR)/gpuswapd.conf $(DESTDIR)$(TMPFILESDIR)/gpuswapd.conf
	rm -f $(DESTDIR)$(DOCDIR)/README.md $(DESTDIR)$(DOCDIR)/PROTOCOL.md $(DESTDIR)$(DOCDIR)/gpuswapd.yaml.example
	rm -f $(addprefix $(DESTDIR)$(DOCDIR)/,$(wildcard docs/*.md))
	rmdir $(DESTDIR)$(DOCDIR)/docs $(DESTDIR)$(DOCDIR) 2>/dev/null || true
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && [ -d /run/systemd/system ]; then \
	  echo "systemctl daemon-reload"; systemctl daemon-reload; fi

clean:
	rm -rf build build-asan build-gpu build-carry

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
