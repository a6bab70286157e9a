# Sourced by the scripts: where the cache, the shared folder and the cargo target folder are.
# The cargo target folder lives in the cache, outside the clone, so CI and every checkout reuse one build.
export QUANTFARM_CACHE=${QUANTFARM_CACHE:-$HOME/.cache/quantfarm}
export QUANTFARM_SHARED=${QUANTFARM_SHARED:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/shared}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$QUANTFARM_CACHE/cargo-target}
mkdir -p "$QUANTFARM_CACHE"
# bindgen (llama-cpp-sys-2's build) loads libclang; these machines lack it, scripts/install-libclang puts it here.
export LIBCLANG_PATH=${LIBCLANG_PATH:-$QUANTFARM_CACHE/libclang-18.1.1}
# That libclang comes without clang's own headers (stdbool.h, stddef.h); the C compiler's serve bindgen as well.
if [[ -z ${BINDGEN_EXTRA_CLANG_ARGS:-} ]] && command -v gcc >/dev/null; then
    export BINDGEN_EXTRA_CLANG_ARGS="-isystem $(gcc -print-file-name=include)"
fi
# llama-cpp-sys-2 turns GGML_NATIVE off unless rustc targets the native CPU; tell ggml which x86 kernels this CPU
# runs instead (the same ones llama.cpp's own GGML_NATIVE build picks), so the runtime is as fast as llama-perplexity.
if [[ -r /proc/cpuinfo ]]; then
    cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 sse4_2:SSE42 avx512f:AVX512 avx512_bf16:AVX512_BF16 \
                avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx_vnni:AVX_VNNI; do
        [[ $cpu_flags == *" ${pair%%:*} "* ]] && export "GGML_${pair#*:}=ON"
    done
    unset cpu_flags pair
fi
# ggml's own tools are built with -march=native (GGML_NATIVE), which also tunes the schedule for this CPU; the flags
# above only pick the instruction set. llama-cpp-sys-2 forwards CMAKE_* variables to CMake, and the release flags come
# after the crate's -march=x86-64 on the compile line, so the last -march wins. x86-64 Linux only: that is where the
# crate forces the generic baseline. build.rs does not rerun when these change: `cargo clean -p llama-cpp-sys-2`
# (needed once on an AMX machine whose build predates the AMX exclusion below).
if [[ $(uname -s) == Linux && $(uname -m) == x86_64 ]]; then
    native="-O3 -DNDEBUG -march=native"
    # Without AMX on CPUs that have it (Sapphire Rapids and later): -march=native turns on ggml's AMX matmul, and in
    # this build it crashes (SIGSEGV in ggml_backend_amx_mul_mat at the first decode, seen on such a machine with
    # llama-cpp-sys-2 0.1.161). AVX-512 stays on; the KLD tests compare with the peer tools within bands.
    # QUANTFARM_NO_AMX: the flags that turn it off, set only on such a CPU (scripts/install-peers builds the peer
    # tools with them too).
    if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
        export QUANTFARM_NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        native="$native $QUANTFARM_NO_AMX"
    fi
    export CMAKE_C_FLAGS_RELEASE=${CMAKE_C_FLAGS_RELEASE:-$native}
    export CMAKE_CXX_FLAGS_RELEASE=${CMAKE_CXX_FLAGS_RELEASE:-$native}
    unset native
fi
# CMake for llama-cpp-sys-2's build, where the machine has none: scripts/install-build-tools puts it in this venv.
export QUANTFARM_BUILD_TOOLS=$QUANTFARM_CACHE/build-tools
if ! command -v cmake >/dev/null; then
    export PATH=$PATH:$QUANTFARM_BUILD_TOOLS/bin
fi
