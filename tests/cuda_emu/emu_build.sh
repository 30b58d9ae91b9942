# tests/cuda_emu/emu_build.sh - how the CPU emulator's pieces are compiled, in one place: sourced
# by tests/run.sh (the kernel tests, the multi-rank emulator tests) and by build.sh (the examples
# built against the emulator, build/examples/emu/), so both link the same objects made by the same
# commands. Needs ROOT and build.sh's settings (DT_CXX, DT_CPPFLAGS, DT_LIBS; ./build.sh env).
#   $E/obj/cuda_emu.o, $E/obj/<kernel>.o      the runtime and each kernels/*.cu (g++ -x c++)
#   $E/tsan/...                               the same with ThreadSanitizer (kernels only; the
#                                             runtime is never instrumented, see cuda_emu.cpp)
#   $E/comm/nccl_emu.o                        the fake NCCL over MPI (mpicxx)
# Flag variables are word lists, expanded unquoted on purpose.
# shellcheck shell=bash disable=SC2086
E=build/cuda_emu
EMU_CXX="$DT_CXX -std=c++17 -g1 -Wall -Wextra -Werror -Wno-unknown-pragmas"
EMU_INC="-I$ROOT -I$ROOT/tests/cuda_emu/include -I$ROOT/kernels -I$ROOT/tests -I$ROOT/tests/cuda_emu $DT_CPPFLAGS"
EMU_TSAN="-fsanitize=thread -fno-omit-frame-pointer"
EMU_MPICXX=$(command -v mpicxx || command -v mpic++ || true)

# emu_stale OUT DEP...: removes OUT when a DEP or an emulator header is newer (the caller then
# rebuilds it).
emu_stale() {
    local out=$1 f
    shift
    [ -e "$out" ] || return 0
    for f in "$@" tests/cuda_emu/include/*.h tests/cuda_emu/k_common.h; do
        [ "$f" -nt "$out" ] && { rm -f "$out"; return 0; }
    done
}

# emu_runtime OUT [tsan]: tests/cuda_emu/cuda_emu.cpp (tsan: the build whose barriers order
# ThreadSanitizer's view of the kernels' threads).
emu_runtime() {
    local tsan=
    [ "${2:-}" = tsan ] && tsan=-DDT_EMU_TSAN
    $EMU_CXX -O2 $tsan $EMU_INC -c tests/cuda_emu/cuda_emu.cpp -o "$1"
}

# emu_kernel CU OUT [tsan]: one kernels/*.cu as C++ against the fake CUDA headers. Then no
# function-local static may sit in a section of its own (.bss._ZZ...): g++ gives a template's
# statics one and drops their section attribute, so a __shared__ array of a template kernel would
# be plain memory the emulator neither poisons at block start nor lets ldmatrix or cp.async read
# (kernels/dt_cuda.cuh: a template's shared memory is DT_K_SHARED_DYNAMIC).
emu_kernel() {
    local tsan= lost
    [ "${3:-}" = tsan ] && tsan=$EMU_TSAN
    $EMU_CXX -O1 $tsan $EMU_INC -x c++ -c "$1" -o "$2" || return
    lost=$(objdump -h "$2" | awk '$2 ~ /^\.(bss|data|tbss|tdata)\._ZZ/ {print $2}' | sed 's/^\.[a-z]*\.//' | c++filt)
    [ -z "$lost" ] && return 0
    echo "$1: function-local statics outside the emulator's shared memory (a template's __shared__ array? use DT_K_SHARED_DYNAMIC):"
    echo "$lost" | sed 's/^/    /'
    rm -f "$2"
    return 1
}

# emu_nccl OUT: the fake NCCL (tests/cuda_emu/nccl_emu.cpp) for the MPI programs.
emu_nccl() {
    $EMU_MPICXX -std=c++17 -O1 -g -Wall -Wextra -Werror -I"$ROOT/tests/cuda_emu/include" \
        -c tests/cuda_emu/nccl_emu.cpp -o "$1"
}

# emu_objects: the runtime and every kernel object in $E/obj, each rebuilt when stale (one at a
# time: build.sh's use; tests/run.sh spawns the same commands in parallel itself). Output: one
# line per object built; status non-zero when one failed (its log in build/logs/emu_*.log).
emu_objects() {
    local cu o log ok=0
    mkdir -p "$E/obj" "$E/comm" build/logs
    emu_stale "$E/obj/cuda_emu.o" tests/cuda_emu/cuda_emu.cpp
    if [ ! -e "$E/obj/cuda_emu.o" ]; then
        log=build/logs/emu_runtime.log
        if emu_runtime "$E/obj/cuda_emu.o" >"$log" 2>&1; then echo "built $E/obj/cuda_emu.o"
        else echo "FAILED tests/cuda_emu/cuda_emu.cpp (log: $log)"; head -n 40 "$log"; ok=1; fi
    fi
    for cu in kernels/*.cu; do
        o=$E/obj/$(basename "${cu%.cu}").o
        emu_stale "$o" "$cu" kernels/*.h kernels/*.cuh
        [ -e "$o" ] && continue
        log=build/logs/emu_$(basename "$cu").log
        if emu_kernel "$cu" "$o" >"$log" 2>&1; then echo "built $o"
        else echo "FAILED $cu on the emulator (log: $log)"; head -n 40 "$log"; rm -f "$o"; ok=1; fi
    done
    if [ -n "$EMU_MPICXX" ]; then
        emu_stale "$E/comm/nccl_emu.o" tests/cuda_emu/nccl_emu.cpp
        if [ ! -e "$E/comm/nccl_emu.o" ]; then
            log=build/logs/emu_nccl.log
            if emu_nccl "$E/comm/nccl_emu.o" >"$log" 2>&1; then echo "built $E/comm/nccl_emu.o"
            else echo "FAILED tests/cuda_emu/nccl_emu.cpp (log: $log)"; head -n 40 "$log"; ok=1; fi
        fi
    fi
    return $ok
}

# emu_example SRC OUT: an example (it defines DT_IMPLEMENTATION itself) as C++ with -DDT_CUDA,
# linked with the runtime and every kernel object: with mpicxx, -DDT_MPI -DDT_NCCL and the fake
# NCCL when it talks MPI and mpicxx exists (run it like the CPU build, under mpirun too), else g++.
emu_example() {
    local src=$1 out=$2 cxx=$EMU_CXX defs=-DDT_CUDA extra=
    if grep -qE '#[[:space:]]*include[[:space:]]*[<"]([^">]*/)?(dt_comm\.h|mpi\.h)[">]' "$src" && [ -n "$EMU_MPICXX" ]; then
        cxx="$EMU_MPICXX -std=c++17 -g -Wall -Wextra -Werror -Wno-unknown-pragmas"
        defs+=" -DDT_MPI -DDT_NCCL"
        extra=$E/comm/nccl_emu.o
    fi
    # -Wno-missing-field-initializers: C's "= {0}" read as C++
    $cxx -O1 -Wno-missing-field-initializers $defs $EMU_INC -I"$(dirname "$src")" -x c++ "$src" -x none $extra "$E"/obj/*.o -o "$out" $DT_LIBS -lpthread
}
