# g4 build. `make` builds build/libg4.a and build/g4; `make test` runs every test, optimised and
# then under AddressSanitizer + UBSan ($(BUILD)-san/; long generation tests shortened 4x there);
# `make test-fast` runs only the optimised pass.
BUILD    ?= build
CC       ?= cc
# -ffp-contract=off: the exactness contract forbids the compiler fusing a*b+c differently in two
# code paths of one reduction. No -ffast-math anywhere.
OPT      ?= -O2 -g
CFLAGS   := $(OPT) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -ffp-contract=off -fno-fast-math \
            -pthread -MMD -MP -Iinclude -Isrc $(shell pkg-config --cflags libcjson 2>/dev/null) $(EXTRA_CFLAGS)
LDLIBS   := $(shell pkg-config --libs libcjson 2>/dev/null || echo -lcjson) -lm -pthread
SANFLAGS  = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

# CUDA: when nvcc is found (PATH or /usr/local/cuda), src/cuda/*.cu go into libg4.a (G4_HAVE_CUDA)
# and the CUDA runtime is linked statically, so every binary still runs where there is no GPU or
# driver (a CUDA session then fails with "no CUDA device/driver"). NVCC= (empty) builds without.
# -fmad=false: as -ffp-contract=off on the CPU, no multiply-add is fused unless written as fmaf.
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CU_SRC   := $(sort $(wildcard src/cuda/*.cu))
NVFLAGS  := -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -fmad=false -Werror all-warnings \
            -Xcompiler -Wall,-Wextra,-Werror -Iinclude -Isrc $(shell pkg-config --cflags libcjson 2>/dev/null) $(EXTRA_NVFLAGS)
CFLAGS   += -DG4_HAVE_CUDA
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
GPU_SRC  := $(sort $(wildcard tests/gpu/*.c))
GPU_PROTO:= $(BUILD)/bench/gpu_lean_decode $(BUILD)/bench/gpu_pdl_chain
endif
# the persistent kernel: one object per instantiation (src/cuda/inst/kernel.cu -DG4C_INST=i, i <
# G4C_N_INST in src/cuda/internal.h), so `make -j` compiles them in parallel (the largest first)
CU_INST  := $(if $(NVCC),$(foreach i,12 10 8 4 11 7 6 9 1 5 2 3 0,$(BUILD)/src/cuda/inst/kernel_$(i).o))
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.o) $(CU_INST)
GPU_BIN  := $(GPU_SRC:tests/gpu/%.c=$(BUILD)/tests/gpu/%)

# EXCLUDE: sources to leave out (e.g. work in progress), as paths relative to the root
LIB_SRC  := $(filter-out $(EXCLUDE),$(sort $(wildcard src/util/*.c src/formats/*.c src/model/*.c src/runtime/*.c src/cpu/*.c src/text/*.c)))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
BENCH_SRC:= $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN:= $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

all: $(BUILD)/g4 $(TEST_BIN) $(BENCH_BIN) $(GPU_BIN) $(GPU_PROTO)

$(BUILD)/libg4.a: $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(BUILD)/g4: $(CLI_OBJ) $(BUILD)/libg4.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libg4.a $(LDLIBS) -ledit

$(BUILD)/tests/%: tests/%.c $(BUILD)/libg4.a tests/test_util.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libg4.a $(LDLIBS) -lcmocka

$(BUILD)/bench/%: bench/%.c $(BUILD)/libg4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libg4.a $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -MF $(@:.o=.d) -c -o $@ $<

$(CU_INST): $(BUILD)/src/cuda/inst/kernel_%.o: src/cuda/inst/kernel.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -DG4C_INST=$* -MMD -MP -MF $(@:.o=.d) -c -o $@ $<

# the lean decode prototype: standalone CUDA (no engine code), built so that CI keeps it compiling;
# scripts/gpu_lean.sh builds and runs it on a GPU machine
$(BUILD)/bench/gpu_lean_decode: bench/gpu_lean_decode.cu bench/gpu_proto.cuh
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $<

# the per-stage-kernel decode prototype (PDL chain in a CUDA graph): standalone like the one above;
# scripts/gpu_pdl.sh builds and runs it on a GPU machine
$(BUILD)/bench/gpu_pdl_chain: bench/gpu_pdl_chain.cu bench/gpu_proto.cuh
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $<

# GPU tests (tests/gpu/, run by scripts/gpu_suite.sh on a machine with a GPU; never by `make test`)
$(BUILD)/tests/gpu/%: tests/gpu/%.c $(BUILD)/libg4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libg4.a $(LDLIBS)

# The README's test command: the whole suite, optimised and then under ASan + UBSan.
# (the build itself runs one job per CPU: the kernel instantiations are the long pole; the two
# passes run one after the other)
NPROC    := $(shell nproc 2>/dev/null || echo 2)
test:
	$(MAKE) test-fast
	$(MAKE) sanitize

test-fast:
	$(MAKE) -j$(NPROC) all
	bash tests/run.sh $(BUILD)

sanitize:
	G4_TEST_SCALE=4 $(MAKE) BUILD=$(BUILD)-san OPT="$(SANFLAGS)" test-fast

clean:
	rm -rf build build-san

# the CUDA compiler's flags (empty without nvcc): scripts/cuda_codegen.sh compiles with exactly these
print-nvflags:
	@echo $(NVFLAGS)

.PHONY: all test test-fast sanitize clean print-nvflags
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(CU_OBJ:.o=.d)
