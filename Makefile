# strata: plain Makefile. `make` builds build/strata; `make test` runs the
# default suite (a few minutes on 2 cores); `make help` lists every target.
#
# Layout: src/ is the library (libstrata.a), apps/cli the `strata` binary,
# tests/ the unit tests and test scripts, bench/ the benchmarks.
# Files named *_avx2.c are the only ones compiled with -mavx2 -mfma -mf16c;
# they are called only after run-time CPU detection (src/util/cpu.c).

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
PYTHON  ?= /usr/bin/python3
SAN     ?=
WERROR  ?=
CFLAGS_BASE := -std=c11 $(OPT) -g -Wall -Wextra -Wpointer-arith -Wvla $(WERROR) \
               -D_GNU_SOURCE -Isrc -Iapps/cli -Iapps/eval -MMD -MP -pthread $(SAN)
AVX2_FLAGS  := -mavx2 -mfma -mf16c
LDLIBS  := -lpcre2-8 -luring -lcjson -lmicrohttpd -lm -lpthread
LDFLAGS += $(SAN) -pthread

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/backend/cuda/*' | sort)
CLI_SRC  := $(sort $(wildcard apps/cli/*.c apps/eval/*.c apps/server/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TOOL_SRC := $(sort $(wildcard tests/tools/*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TOOL_BIN := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
LIB      := $(BUILD)/libstrata.a
BIN      := $(BUILD)/strata

.PHONY: all cpu test unit asan fuzz bench clean help check-includes format deps demo cuda
all: $(BIN) $(TEST_BIN) $(TOOL_BIN)
cpu: all

# Debian packages needed to build and test (no-op when present).
deps:
	@sh tools/install-deps.sh

# The README's first command: build, then generate with the shipped trained
# model (models/strata-ops-moe.gguf, see models/README.md) on a ChatML prompt
# with tool schemas (models/demo-prompt.txt): it answers with a tool call.
DEMO_MODEL ?= models/strata-ops-moe.gguf
DEMO_PROMPT_FILE ?= models/demo-prompt.txt
demo: deps
	@$(MAKE) --no-print-directory $(BIN)
	$(BIN) run -m $(DEMO_MODEL) -f $(DEMO_PROMPT_FILE) -n 64 --temp 0

help:
	@echo "make            build build/strata, unit tests and test tools"
	@echo "make demo       install deps, build, run the shipped trained model on a tool-calling prompt"
	@echo "make deps       install the Debian packages the build and tests need"
	@echo "make test       build and run the default test suite (prints 'N passed, N failed')"
	@echo "make unit       run only the C unit tests"
	@echo "make asan       build under AddressSanitizer+UBSan into build/asan and run the suite"
	@echo "make fuzz       build libFuzzer targets with clang and run each FUZZ_SECONDS (default 60)"
	@echo "make bench      build the benchmarks in bench/"
	@echo "make cuda       build the CUDA backend (nvcc) and build/tests/test_cuda{,_emu}; docs/CUDA.md"
	@echo "make check-includes  front ends include only the public headers"
	@echo "make clean      remove build/"

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(LIB) tests/testhelp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Itests -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS)

$(BUILD)/tests/%: tests/tools/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Itests -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) $(CFLAGS) -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS)

# The default suite: unit tests, CLI/error tests, golden tokenizer ids and the
# float64 oracle. tests/run.sh prints the closing "N passed, N failed" line.
test: deps
	@$(MAKE) --no-print-directory all check-includes
	@BUILD=$(BUILD) PYTHON=$(PYTHON) sh tests/run.sh

unit: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) sh tests/run.sh unit

asan:
	$(MAKE) BUILD=build/asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" test

FUZZ_SECONDS ?= 60
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_LIB_SRC := $(filter-out src/util/cpu.c,$(LIB_SRC)) src/util/cpu.c
fuzz:
	@mkdir -p build/fuzz
	@for f in $(FUZZ_SRC); do \
	  n=$$(basename $$f .c); \
	  echo "building $$n"; \
	  clang -std=c11 -O1 -g -D_GNU_SOURCE -Isrc -pthread -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	    -mavx2 -mfma -mf16c -o build/fuzz/$$n $$f $(LIB_SRC) $(LDLIBS) || exit 1; \
	done
	@for f in $(FUZZ_SRC); do \
	  n=$$(basename $$f .c); mkdir -p build/fuzz/corpus-$$n; \
	  seeds=tests/fuzz/seeds-$$n; [ -d $$seeds ] || seeds=; \
	  echo "running $$n for $(FUZZ_SECONDS) s"; \
	  build/fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 \
	    build/fuzz/corpus-$$n $$seeds >build/fuzz/$$n.log 2>&1; rc=$$?; \
	  tail -n 3 build/fuzz/$$n.log; \
	  if [ $$rc -ne 0 ]; then echo "$$n FAILED (exit $$rc): see build/fuzz/$$n.log"; exit 1; fi; \
	done

bench: $(BENCH_BIN) $(BIN)

# Front ends (apps/, bench/) may include only the public headers. Headers
# named without a folder ("cli.h") are the front ends' own. Sources only:
# bench/cuda/wip's patches quote the library's own lines.
PUBLIC_HEADERS := engine.h util/err.h gguf/gguf.h tokenizer/tokenizer.h model/inspect.h \
                  quant/quantize_model.h mkmodel/mkmodel.h quant/qtype.h quant/quant.h util/cpu.h \
                  expert/sidecar.h expert/profile.h backend/cuda/cuda_iface.h
check-includes:
	@bad=$$(grep -rhoE --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
	  '#include "[^"]+"' apps bench 2>/dev/null | sed 's/#include "//;s/"//' | sort -u | \
	  grep -vxF $(foreach h,$(PUBLIC_HEADERS),-e $(h)) | grep '/' || true); \
	if [ -n "$$bad" ]; then echo "check-includes: front ends include private headers: $$bad"; exit 1; fi

format:
	clang-format -i $(LIB_SRC) $(CLI_SRC) $(TEST_SRC)

clean:
	rm -rf build

# ==== CUDA backend (issue 9; docs/CUDA.md) ====
# `make cuda` needs nvcc (CUDA 13); `make`, `make test` never do. The .cu
# files are C-style CUDA with extern "C" entry points (cuda_backend.h);
# sm_90 code plus compute_90 PTX. test_cuda skips cleanly without a GPU;
# test_cuda_emu runs the kernels' per-item math on the CPU. tests/run.sh
# runs both whenever they have been built.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# -fmad=false: no multiply-add contraction. ptxas may fuse a mul.f32 and an
# add.f32 into one FFMA or not depending on its register budget, so two
# kernels meant to be bit-identical (split Q8_0 rows and Q8_0, the matmul
# and the matvec) could round differently; the CPU path (x86-64 baseline)
# never fuses either. Where a fused multiply-add is meant, the code says
# fmaf.
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo -fmad=false -Xcompiler -Wall,-Wextra
# CUDA_TRACE=1: the chain trace compiled in (cuda_trace_begin; bench/cuda/
# trace.sh); build it in its own BUILD folder, e.g. BUILD=build/trace.
NVCCFLAGS += $(if $(CUDA_TRACE),-DSTRATA_CUDA_TRACE)
CUDA_LIBS ?= -L$(CUDA_HOME)/lib64 -lcudart -Wl,-rpath,$(CUDA_HOME)/lib64 -lstdc++
CUDA_SRC  := $(sort $(wildcard src/backend/cuda/*.cu))
CUDA_HDR  := $(wildcard src/backend/cuda/*.h src/backend/cuda/*.cuh)
CUDA_CSRC := $(sort $(wildcard src/backend/cuda/*.c))
CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/cuda/%.o) $(CUDA_CSRC:%.c=$(BUILD)/cuda/%.o)
CUDA_LIB  := $(BUILD)/cuda/libstrata_cuda.a

CUDA_TESTS := $(BUILD)/tests/test_cuda $(BUILD)/tests/test_cuda_emu $(BUILD)/tests/test_cuda_layer \
              $(BUILD)/tests/test_cuda_model

cuda: $(CUDA_LIB) $(CUDA_TESTS) $(BUILD)/cuda/strata

# build/cuda/strata: the CLI with the CUDA backend (--gpu, -ngl N): the same
# objects as build/strata except cli_backend.c, compiled with -DSTRATA_CUDA.
CUDA_CLI_OBJ := $(filter-out $(BUILD)/apps/cli/cli_backend.o,$(CLI_OBJ)) $(BUILD)/cuda/apps/cli/cli_backend.o
$(BUILD)/cuda/apps/cli/cli_backend.o: apps/cli/cli_backend.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -DSTRATA_CUDA -c $< -o $@
$(BUILD)/cuda/strata: $(CUDA_CLI_OBJ) $(CUDA_LIB) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(CUDA_CLI_OBJ) $(CUDA_LIB) $(LIB) $(CUDA_LIBS) $(LDLIBS)

# C host code of the backend (the GPU model forward): plain C, compiled by
# $(CC) against the C library's headers, linked into the CUDA library.
$(BUILD)/cuda/%.o: %.c $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c $< -o $@

$(BUILD)/cuda/%.o: %.cu $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_ARCH) -Isrc -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/test_cuda_layer $(BUILD)/tests/test_cuda_model: $(BUILD)/tests/%: tests/cuda/%.c $(CUDA_LIB) $(LIB) tests/testhelp.h tests/cuda/cudatest.h $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Itests -o $@ $< $(CUDA_LIB) $(LIB) $(LDFLAGS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/tests/test_cuda: tests/cuda/test_cuda.c $(CUDA_LIB) $(LIB) tests/testhelp.h tests/cuda/cudatest.h $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Itests -o $@ $< $(CUDA_LIB) $(LIB) $(LDFLAGS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/tests/test_cuda_emu: tests/cuda/test_cuda_emu.cu $(LIB) tests/testhelp.h $(CUDA_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Isrc -Itests -o $@ $< $(LIB) $(LDLIBS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
