#!/usr/bin/env bash
# tests/run.sh - builds and runs every dt test this machine can run. Each check is one line,
# PASS/FAIL/SKIP <name>[: details]; the failures are listed again at the end, and the last line
# is "N passed, N failed, N skipped". Exit status: non-zero iff something failed.
#
#   tests/run.sh [WORD...]   only the groups whose name contains a WORD (test_tensor, mpi_, k_gpt (one
#                            emulator program: cuda_emu:k_gpt),
#                            compile:dt_comm, kernel:, readme, gpu_, fresh, build:)
#   tests/run.sh quick [WORD...]   while iterating (./build.sh test quick): tests/test_*.c,
#                            tests/mpi_*.c and the tutorial only, plain builds (no ASan), each multi-rank test at
#                            2 ranks (or the least it lists), the drivers told DT_TEST_QUICK=1
#                            (tests/mpi_gpt*.c: their 2-rank layouts)
# At the end: the failures again, the 10 slowest runs and the 10 slowest build steps with their
# seconds (CI's limit is 30 minutes on 2 cores: what to trim first), the total time, and as the
# very last line "N passed, N failed, N skipped".
#
# How a test program is built (tests/test_*.c, tests/mpi_*.c):
#   - the usual way: include the dt headers it uses WITHOUT defining DT_IMPLEMENTATION. It is
#     compiled alone and linked with the implementations compiled once per variant from
#     tests/dt_impl.c (all five headers): build/tests/impl/plain.o ($DT_CC $DT_CFLAGS),
#     build/tests/impl/mpi.o (mpicc -DDT_MPI, for tests/mpi_*.c and "// mpi" tests), and their
#     ASan+UBSan builds under build/tests/asan/impl/. An example's header (dlrm_data.h,
#     gpt_data.h) is not in them: define its own DT_..._IMPLEMENTATION in the test.
#   - whole: a test that defines DT_IMPLEMENTATION itself (or #includes a .c file) is compiled
#     with its own copy, as before. For a test that calls private static (dt__) functions,
#     builds in DT_STATIC mode, or switches the implementation with a macro (DT_OPT_NO_MMAP,
#     DT_TENSOR_NO_SIMD, ...).
#   Flags: $DT_CFLAGS (-g1 for -g) $DT_CPPFLAGS -I tests (-DDT_MPI with mpicc), ASan builds with $ASAN_CFLAGS.
#
# In order (whatever does not exist yet is skipped quietly):
#   compile:<header>:<check>  each dt_*.h alone (after the headers it needs) as C99 and C++11,
#                             declarations only and with its implementation, linked across units,
#                             in DT_STATIC mode, with clang, mpicc -DDT_MPI and -DDT_CUDA
#                             (tests/compile/tu.c); SKIP for the clang and CUDA ones without
#                             clang or nvcc
#   kernel:<file>.cu          nvcc -c of each kernels/*.cu into build/kernels/ (when nvcc exists), for
#                             sm_80 and sm_90, -Werror all-warnings; -Xptxas -v registers and shared
#                             memory per kernel in build/kernels/ptxas/
#   ptx:dt_mma                the tensor cores are reached: tests/cuda_emu/k_mma_kernels.cuh (users
#                             of kernels/dt_mma.cuh) builds for sm_80 and sm_90, and its PTX holds
#                             mma.sync m16n8k16 (bf16, f16), ldmatrix and ld.global.v4, as does
#                             dt_flash.cu's (B fragments by ldmatrix only), and each elementwise kernel of dt_elementwise.cu loads by 16 (or 8) bytes
#                             (tests/ptx_mma.sh; SKIP without nvcc)
#   cuda_emu                  every kernels/*.cu on the CPU emulator (tests/cuda_emu), each
#                             tests/cuda_emu/k_*.cpp in 5 thread orders and under ThreadSanitizer
#   cuda_emu_comm             tests/gpu_comm.c on the emulator with a fake NCCL over MPI, and
#                             each tests/cuda_emu/mpi_*.cpp at the np of its first line
#                             (tests/cuda_emu/nccl_emu.cpp), at each np, streams immediate and
#                             deferred; names "emu:<check> [np=N, mode]"
#   readme:snippet_N          each ```c block of README.md compiles, and runs when it is a
#                             program (tests/readme_snippets.sh says how blocks are marked)
#   tutorial                  examples/tutorial's five steps at np 1 and 2, each step's loss against
#                             the one-process run's within a derived fp32 bound (tests/tutorial.sh)
#   cuda_counters             build/examples/emu/gpt and dlrm (from ./build.sh, against the emulator)
#                             with --device cuda --profile: per step after the first, 0 device
#                             allocations and frees, host-to-device bytes = the inputs, 0 bytes
#                             down, <= 1 wait (tests/cuda_counters.sh)
#   dlrm_reference            build/examples/dlrm (from ./build.sh) against an independent NumPy
#                             DLRM / DCNv2 fed its checkpoints and batches (tests/dlrm_reference.py)
#   slow_rank                 gpt --slow-every names a rank slowed by busy loops on its core
#   launch                    examples/launch.sh (elastic restart) against a stand-in mpirun: a hung
#                             job killed after --abort-grace, restarts, exit codes (tests/launch.sh)
#   multihost                 gpt and dlrm across 2 and 3 hosts made as network namespaces, equal to
#                             np 1 (tests/multihost.sh; root only, else one SKIP line); it runs
#                             while the suite builds, and is reported here
#   gpu:...                   ./build.sh gpu where there is no GPU: bench/gpu/selftest.sh (exit 3,
#                             arguments, the summary's parsing, the shard writer) and
#                             --build-only (every GPU build, with nvcc; SKIP without it)
#   tests/test_*.c            one process, -DDT_CBLAS; run once as built and once built with
#                             ASan+UBSan (its names prefixed "asan:"). A first line "// mpi"
#                             builds it with mpicc -DDT_MPI and runs it as 1 rank under mpirun
#   tests/mpi_*.c             mpicc -DDT_MPI, run under mpirun at each N of its first line
#                             "// np: 1 2 4" (default 2); " [np=N]" is appended to its names.
#                             Then the same runs built with ASan+UBSan ("asan:"), without leak
#                             checks (Open MPI leaks by design, from plugins LSan cannot name).
#                             When the sanitizer runs are on, the plain build runs at one N
#                             only (2, or the least listed): the ASan runs repeat its checks
#                             at every N
#                             (a second line "// asan np: 4 6" runs ASan at those only, and
#                             the plain build at the rest too)
#                             A line "// tsan: N" (the threads a header starts: dt_embed's
#                             prefetch helper) adds a ThreadSanitizer build run at N ranks
#                             ("tsan:"; a report is a failure; with the sanitizer runs)
#                             First line "// mpi-driver": run directly, once; it starts
#                             $DT_MPIRUN itself (jobs it kills on purpose, say)
#                             A line "// with: FILE..." among the first three of a test adds
#                             those sources (more translation units) to its build
#   tests/gpu_*.c, gpu_*.cu   -DDT_CUDA, linked with build/kernels; SKIP without a GPU
#   fresh:...                 with DT_TEST_FRESH=1 only: tests/fresh_debian.sh, the README's two
#                             commands in fresh Debian roots (as root; else one SKIP line)
#   build:<program>           examples and benchmarks that ./build.sh test could not build
# A program that crashes, times out, exits non-zero without a FAIL line, or prints no check line
# at all counts as one failure named after it, with the end of its output.
#
# Environment: DT_TEST_TIMEOUT (seconds per run, 300), DT_TEST_ASAN=0 (no sanitizer builds),
# DT_TEST_JOBS (compilers at a time, default nproc), DT_TEST_FRESH=1 (also tests/fresh_debian.sh;
# DT_TEST_FRESH_TIMEOUT, 10800 s, for all of it). Logs: build/tests/logs/.
# Flag variables (DT_CFLAGS...) are word lists, expanded unquoted on purpose.
# shellcheck disable=SC2086,SC2153
set -uo pipefail
shopt -s nullglob
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

# The toolchain settings (flags, mpirun, nvcc) come from build.sh, the one place they are chosen.
if [ -z "${DT_CFLAGS:-}" ]; then
    settings=$(bash ./build.sh env) || { echo "tests/run.sh: ./build.sh env failed" >&2; exit 1; }
    eval "$settings"
fi

# (an environment from an older build.sh lacks the kernels' nvcc flags)
DT_NVCC_FLAGS=${DT_NVCC_FLAGS:-"-O2 -arch=${DT_CUDA_ARCH:-sm_90}"}

T=build/tests      # test programs; T/asan: sanitizer builds
L=$T/logs          # one log per build step and per run
C=build/compile    # objects and stamps of the compile checks
mkdir -p "$T/asan" "$L" "$C" "$T/tmp"
rm -f "$L/build_times" # "seconds id" of each build step run (step): the slowest ten at the end
TIMEOUT=${DT_TEST_TIMEOUT:-300}
JOBS=${DT_TEST_JOBS:-$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc 2>/dev/null || echo 2)} # (nproc reads OMP_NUM_THREADS)
ASAN=${DT_TEST_ASAN:-1}
START=$EPOCHREALTIME
# "quick" (first argument): the unit tests and the multi-rank tests at 2 ranks, plain builds only
QUICK=0
if [ "${1:-}" = quick ]; then QUICK=1 ASAN=0; shift; fi
export DT_TEST_QUICK=$QUICK # the drivers (tests/mpi_gpt*.c) run their 2-rank layouts only
FILTER=("$@")

# Tests must not fight over 2 cores (4 ranks x BLAS threads): one BLAS thread unless the caller
# chose a count. The tests pass under any (their tolerances hold for any order of the BLAS's
# sums, as for any OPENBLAS_CORETYPE).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# A run whose rank exits non-zero (every bad-input check of the drivers) made Open MPI 4's mpirun
# wait odls_base_sigkill_timeout (1 s) twice before it returned: 2.04 s against 0.04 s for
# `mpirun -np 1 false`. No dt program catches SIGTERM, so the wait bought nothing.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
# Open MPI 4 picks the ob1 messaging layer here anyway (its shared-memory and TCP transports), but
# only after it has opened and probed cm's PSM, PSM2 and libfabric: 0.2 s of every MPI program's
# start (mpirun -np 2 of MPI_Init + MPI_Finalize: 0.41 s, 0.21 s with ob1 named), paid some
# thousand times by the suite (tests/mpi_dlrm_edges.c alone: 40.9 s -> 15.8 s). Naming it skips
# the probe and changes nothing else.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}

# Every build step is redone when one of these, or its own source, is newer than its output.
INPUTS=(dt_*.h kernels/*.h kernels/*.cuh tests/dt_test.h tests/compile/tu.c tests/run.sh build.sh)

# --- reporting ---------------------------------------------------------------------------------

npass=0 nfail=0 nskip=0
FAILURES=()
RUNTIMES=() # "seconds label" of every program run, for the slowest ten at the end

# report "PASS|FAIL|SKIP name[: details]": print and count one check.
report() {
    echo "$1"
    case $1 in
        PASS*) npass=$((npass + 1)) ;;
        FAIL*) nfail=$((nfail + 1)) FAILURES+=("$1") ;;
        SKIP*) nskip=$((nskip + 1)) ;;
    esac
}

# section TITLE: a heading, with the seconds since the start (where the suite's time goes)
section() { echo "== $* [$(awk -v a="$START" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s]"; }

# show_log LOG [head]: 20 lines of a log, indented so that none reads as a check: the end of a
# program's output; the start of a compiler's (its first error); a sanitizer report from its
# start (its last lines are only the shadow-memory map).
show_log() {
    local log=$1 at
    at=$(grep -n -m1 -E 'ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:' "$log" | cut -d: -f1)
    if [ -n "$at" ]; then sed -n "${at},$((at + 24))p" "$log"
    elif [ "${2:-}" = head ]; then head -n 20 "$log"
    else tail -n 20 "$log"
    fi | sed 's/^/    | /'
}

selected() {
    local w
    if [ "$QUICK" = 1 ]; then # unit and multi-rank test programs only
        case $1 in test_* | mpi_* | build:* | tutorial) ;; *) return 1 ;; esac
    fi
    [ ${#FILTER[@]} -eq 0 ] && return 0
    for w in "${FILTER[@]}"; do [[ $1 == *"$w"* ]] && return 0; done
    return 1
}

# --- build steps (run in the background, JOBS at a time) --------------------------------------

# fresh OUT SRC...: OUT exists and is newer than each SRC and each shared input.
fresh() {
    local out=$1 f
    shift
    [ -e "$out" ] || return 1
    for f in "$@" "${INPUTS[@]}"; do [ "$f" -nt "$out" ] && return 1; done
    return 0
}

# extra_sources SRC: the files of a "// with: FILE..." line among SRC's first three (other
# translation units of the program: tests/mpi_comm_static.c holds two static copies of dt).
extra_sources() { sed -n '1,3s|^//[[:space:]]*with:||p' "$1"; }

# step ID OUT "SRC [DEP...]" CMD...: unless OUT is fresh, run CMD (log: $L/ID.log) and touch
# OUT, or delete OUT when CMD fails. Afterwards OUT exists iff the step succeeded.
step() {
    local id=$1 out=$2 src=$3
    shift 3
    fresh "$out" $src $(extra_sources "${src%% *}") && return 0
    mkdir -p "$(dirname "$out")"
    local t0=$EPOCHREALTIME
    if "$@" >"$L/$id.log" 2>&1; then touch "$out"; else rm -f "$out"; fi
    echo "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}') $id" >>"$L/build_times"
}

spawn() {
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    if [ "${MH_BG:-0}" = 1 ]; then (renice -n 10 -p $BASHPID >/dev/null 2>&1; "$@") & else "$@" & fi
}

# step_result NAME ID OUT: PASS NAME, or FAIL NAME with the end of the step's log.
step_result() {
    if [ -e "$3" ]; then report "PASS $1"; return 0; fi
    report "FAIL $1: see $L/$2.log"
    show_log "$L/$2.log" head
    return 1
}

# --- compile checks ----------------------------------------------------------------------------

CW="-Wall -Wextra -Werror"
C99="-std=c99 -pedantic $CW"
CXX="-x c++ -std=c++11 $CW"
TU=tests/compile/tu.c

# The headers a header needs before it (DESIGN.md, "Include order"). A header not listed here
# gets those of the three core ones that exist, which is harmless when it needs fewer.
needs() {
    local h
    case $1 in
        dt_tensor.h) ;;
        dt_comm.h) echo dt_tensor.h ;;
        dt_opt.h) echo dt_tensor.h dt_comm.h ;;
        dt_parallel.h | dt_embed.h) echo dt_tensor.h dt_comm.h dt_opt.h ;;
        dt_plan.h) echo dt_tensor.h dt_comm.h dt_opt.h dt_parallel.h dt_embed.h ;;
        *) for h in dt_tensor.h dt_comm.h dt_opt.h; do [ -f "$h" ] && echo "$h"; done ;;
    esac
}

# The headers to check: the known ones in include order, then any other dt_*.h.
headers() {
    local h
    for h in dt_tensor.h dt_comm.h dt_opt.h dt_parallel.h dt_embed.h dt_plan.h; do [ -f "$h" ] && echo "$h"; done
    for h in dt_*.h; do
        case $h in dt_tensor.h | dt_comm.h | dt_opt.h | dt_parallel.h | dt_embed.h | dt_plan.h) ;; *) echo "$h" ;; esac
    done
    # the examples' own headers (examples/dlrm/dlrm_data.h) are written like the library's
    for h in examples/*/*.h; do [ -f "$h" ] && echo "$h"; done
}

# -DDT_CT_Hn="..." flags that include the given headers in order.
include_flags() {
    local i=1 h
    for h in "$@"; do printf -- '-DDT_CT_H%d="%s" ' $i "$h"; i=$((i + 1)); done
}

# Declarations only: compiles, and defines no symbol (else two units that include the header clash).
ct_decl() { # OBJ COMPILER FLAGS...
    local obj=$1
    shift
    "$@" -c $TU -o "$obj" || return 1
    local defined
    defined=$(nm -g --defined-only "$obj" | awk '{print $3}')
    [ -z "$defined" ] || { echo "declarations alone define symbols: $defined"; return 1; }
}

# Implementation in a C unit, declarations used from a C++ unit that takes the address of every
# public function: proves extern "C", one definition each, and the link flags.
ct_link() { # DIR INCLUDE_FLAGS
    local dir=$1 inc=$2
    $DT_CC $C99 $DT_CPPFLAGS $inc -DDT_IMPLEMENTATION -c $TU -o "$dir/impl.o" || return 1
    nm -g --defined-only "$dir/impl.o" | awk '$2 == "T" && $3 ~ /^dt_[a-z0-9]/ {print "DT_CT_USE(" $3 ")"}' >"$dir/uses.h"
    $DT_CXX $CXX $DT_CPPFLAGS $inc -DDT_CT_MAIN -DDT_CT_USES="\"$ROOT/$dir/uses.h\"" -c $TU -o "$dir/main.o" || return 1
    $DT_CXX "$dir/impl.o" "$dir/main.o" -o "$dir/link" $DT_LIBS || return 1
    "$dir/link"
}

# DT_STATIC: a C unit and a C++ unit, each with its own static copy of the implementation, in one
# program: nothing may be exported but main.
ct_static() { # DIR INCLUDE_FLAGS
    local dir=$1 inc=$2 exported
    $DT_CC $C99 -I"$ROOT" $inc -DDT_STATIC -DDT_IMPLEMENTATION -DDT_CT_MAIN -c $TU -o "$dir/static_a.o" || return 1
    $DT_CXX $CXX -I"$ROOT" $inc -DDT_STATIC -DDT_IMPLEMENTATION -c $TU -o "$dir/static_b.o" || return 1
    exported=$(nm -g --defined-only "$dir/static_a.o" "$dir/static_b.o" | awk 'NF == 3 && $3 != "main" {print $3}')
    [ -z "$exported" ] || { echo "DT_STATIC still exports: $exported"; return 1; }
    $DT_CXX "$dir/static_a.o" "$dir/static_b.o" -o "$dir/static" -lm && "$dir/static"
}

# CHECKS rows: "name id stamp", or a "SKIP ..." line; reported in this order once all builds
# are done.
CHECKS=()
compile_check() { # HEADER_STEM CHECK FUNCTION ARGS...
    local name="compile:$1:$2" id="compile_$1_$2" stamp="$C/$1/$2.ok"
    shift 2
    CHECKS+=("$name $id $stamp")
    spawn step "$id" "$stamp" "$TU" "$@"
}

spawn_compile_checks() {
    local h p stem impl inc_all inc missing dir
    for h in $(headers) kernels/dt_kernels.h; do
        [ -f "$h" ] || continue
        stem=$(basename "${h%.h}")
        selected "compile:$stem" || continue
        dir=$C/$stem
        mkdir -p "$dir"
        if [ "$h" = kernels/dt_kernels.h ]; then
            # the C ABI of the CUDA kernels: declarations only, no implementation to include
            compile_check "$stem" c99_decl ct_decl "$dir/c99_decl.o" $DT_CC $C99 -I"$ROOT" -I"$ROOT/kernels" "-DDT_CT_H1=\"dt_kernels.h\""
            compile_check "$stem" cxx_decl ct_decl "$dir/cxx_decl.o" $DT_CXX $CXX -I"$ROOT" -I"$ROOT/kernels" "-DDT_CT_H1=\"dt_kernels.h\""
            continue
        fi
        missing=() inc_all=()
        for p in $(needs "$h"); do
            if [ -f "$p" ]; then inc_all+=("$p"); else missing+=("$p"); fi
        done
        if [ ${#missing[@]} -gt 0 ]; then
            CHECKS+=("SKIP compile:$stem: needs ${missing[*]}, which does not exist yet")
            continue
        fi
        inc_all+=("$h")
        inc=$(include_flags "${inc_all[@]}")
        impl=-D$(echo "${stem}" | tr '[:lower:]' '[:upper:]')_IMPLEMENTATION
        case $stem in dt_*) ;; *) impl=-DDT_$(echo "${stem}" | tr '[:lower:]' '[:upper:]')_IMPLEMENTATION ;; esac
        compile_check "$stem" c99_decl ct_decl "$dir/c99_decl.o" $DT_CC $C99 -I"$ROOT" $inc
        compile_check "$stem" c99_impl $DT_CC $C99 -I"$ROOT" $inc $impl -c $TU -o "$dir/c99_impl.o"
        compile_check "$stem" cxx_decl ct_decl "$dir/cxx_decl.o" $DT_CXX $CXX -I"$ROOT" $inc
        compile_check "$stem" cxx_impl $DT_CXX $CXX $DT_CPPFLAGS $inc $impl -c $TU -o "$dir/cxx_impl.o"
        compile_check "$stem" link ct_link "$dir" "$inc"
        compile_check "$stem" static ct_static "$dir" "$inc"
        # clang and nvcc are optional (build.sh does not install them): without them, their
        # checks are skipped, so that every machine counts the same checks
        if command -v clang >/dev/null; then
            compile_check "$stem" clang_c99 clang $C99 -I"$ROOT" $inc $impl -c $TU -o "$dir/clang_c99.o"
            compile_check "$stem" clang_cxx clang $CXX $DT_CPPFLAGS $inc $impl -c $TU -o "$dir/clang_cxx.o"
        else
            CHECKS+=("SKIP compile:$stem:clang_c99: clang not found (apt-get install clang)")
            CHECKS+=("SKIP compile:$stem:clang_cxx: clang not found (apt-get install clang)")
        fi
        if [ -n "$DT_MPICC" ]; then
            compile_check "$stem" mpi $DT_MPICC $C99 -I"$ROOT" $inc -DDT_MPI -DDT_IMPLEMENTATION -c $TU -o "$dir/mpi.o"
        fi
        if [ -n "$DT_NVCC" ]; then
            # CUDA's headers are not -pedantic C99 (unnamed unions), so this one goes without it
            compile_check "$stem" cuda $DT_CC -std=c99 $CW -I"$ROOT" -I"$DT_CUDA_HOME/include" $inc \
                -DDT_CUDA $DT_NCCL_DEFS -DDT_IMPLEMENTATION -c $TU -o "$dir/cuda.o"
        else
            CHECKS+=("SKIP compile:$stem:cuda: nvcc not found (the CUDA headers come with it)")
        fi
    done
}

# --- CUDA kernels ------------------------------------------------------------------------------

KERNELS=()
spawn_kernels() {
    local cu name src gpu_tests=0
    [ -n "$DT_NVCC" ] || return 0
    # the GPU tests link the kernels' archive: selecting one (tests/run.sh gpu) builds them too
    for src in tests/gpu_*.c tests/gpu_*.cu; do selected "$(basename "${src%.*}")" && gpu_tests=1; done
    for cu in kernels/*.cu; do
        name=$(basename "$cu")
        selected "kernel:$name" || [ $gpu_tests = 1 ] || continue
        KERNELS+=("$cu")
        spawn step "kernel_$name" "build/kernels/${name%.cu}.o" "$cu" build_kernel "$cu" "build/kernels/${name%.cu}.o"
    done
}

# build_kernel CU OBJ: nvcc with build.sh's flags (sm_80 and sm_90, -Werror all-warnings) and
# -Xptxas -v; the registers, shared memory and spills of each kernel and arch are kept in
# build/kernels/ptxas/<file>.log.
build_kernel() {
    local cu=$1 obj=$2 log
    log=build/kernels/ptxas/$(basename "$cu").log
    mkdir -p build/kernels/ptxas
    "$DT_NVCC" -c $DT_NVCC_FLAGS -Xptxas -v -I"$ROOT" -I"$ROOT/kernels" "$cu" -o "$obj" >"$log" 2>&1
    local rc=$?
    cat "$log"
    return $rc
}

# --- test programs -----------------------------------------------------------------------------

# np_list SRC: the rank counts of a first line "// np: 1 2 4" (empty without one).
np_list() { sed -n '1s|^//[[:space:]]*np:||p' "$1" | tr -cs '0-9' ' ' | xargs; }
# asan_np_list SRC: a second line "// asan np: 4 6" runs the ASan+UBSan build at those rank counts
# only (a suite on 2 cores cannot afford it at 8); the plain build then runs at the others.
asan_np_list() { sed -n '2s|^//[[:space:]]*asan np:||p' "$1" | tr -cs '0-9' ' ' | xargs; }
# A first line "// mpi" (or "// np: ...") marks a program built with mpicc -DDT_MPI.
wants_mpi() { head -n 1 "$1" | grep -qE '^//[[:space:]]*(mpi|np:)'; }
# "// mpi-driver": built with mpicc, run directly (it launches mpirun itself).
is_driver() { head -n 1 "$1" | grep -qE '^//[[:space:]]*mpi-driver'; }

# float-cast-overflow: gcc leaves it out of "undefined" (a float-to-int cast out of range is UB)
# shift-base recovers (a report, then on) so that tests/ubsan.supp can name stb_ds's byte hash:
# a halting check ignores suppressions. Any report still fails the run (run_prog greps for it).
SAN="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow -fsanitize-recover=shift-base -fno-omit-frame-pointer"
# The sanitizer build checks behaviour at run time: -O1 builds fast and keeps stack traces
# exact; -g1 (line tables, no variables) is all a report's trace reads, and compiles in 70% of
# -g's time (tests/test_fuzz_files_replay.c: 17.5 s against 24.5); no -Werror, as sanitizer
# builds raise their own false warnings (the normal build has it).
ASAN_CFLAGS="-std=c99 -O1 -g1 -Wall -Wextra $SAN"
# The plain test builds: build.sh's flags, with -g1 for -g for the same reason (tests/dt_impl.c:
# 12.9 s of CPU at -O2 -g, 9.8 s at -O2 -g1); the examples keep -g.
TEST_CFLAGS=$(echo " $DT_CFLAGS " | sed 's/ -g / -g1 /; s/^ //; s/ $//')

# How a test is built. The implementations (tests/dt_impl.c: DT_IMPLEMENTATION with all five
# headers) are compiled once per variant into an object: $T/impl/plain.o (DT_CC), $T/impl/mpi.o
# (mpicc -DDT_MPI), and the same under $T/asan/impl/ with ASan+UBSan. A test that does not
# define DT_IMPLEMENTATION is compiled without it and linked with its variant's object. A test
# that defines DT_IMPLEMENTATION (or #includes a .c file, which may) is compiled whole, as it
# is: the ones that call private static functions, build in DT_STATIC mode, or switch the
# implementation with a macro (DT_OPT_NO_MMAP, *_NO_SIMD).
builds_whole() {
    local f
    for f in "$1" $(extra_sources "$1"); do
        grep -qE '^[[:space:]]*#[[:space:]]*(define[[:space:]]+DT_IMPLEMENTATION([[:space:]]|$)|include[[:space:]]+"[^"]*\.c")' "$f" && return 0
    done
    return 1
}
# impl_obj MPI SAN: the object of tests/dt_impl.c a test links (SAN=1: the ASan+UBSan one).
impl_obj() {
    local dir=$T/impl
    [ "$2" = 1 ] && dir=$T/asan/impl
    if [ "$1" = 1 ]; then echo "$dir/mpi.o"; else echo "$dir/plain.o"; fi
}
# build_impl MPI OUT CFLAGS: compiles tests/dt_impl.c (MPI=1: with mpicc -DDT_MPI).
build_impl() {
    local mpi=$1 out=$2 cflags=$3 cc=$DT_CC defs=
    if [ "$mpi" = 1 ]; then cc=$DT_MPICC defs=-DDT_MPI; fi
    $cc $cflags $DT_CPPFLAGS $defs -c tests/dt_impl.c -o "$out"
}

# build_test MPI SRC OUT CFLAGS [IMPL_OBJ]: builds one test program; MPI=1: with mpicc -DDT_MPI.
build_test() {
    local mpi=$1 src=$2 out=$3 cflags=$4 obj=${5:-} cc=$DT_CC defs=
    if [ "$mpi" = 1 ]; then cc=$DT_MPICC defs=-DDT_MPI; fi
    $cc $cflags $DT_CPPFLAGS $defs -I"$ROOT/tests" "$src" $(extra_sources "$src") $obj -o "$out" $DT_LIBS
}

# tsan_np SRC: N of a line "// tsan: N" (the program's ThreadSanitizer run at N ranks), or nothing.
tsan_np() { sed -nE 's|^//[[:space:]]*tsan:[[:space:]]*([0-9]+)[[:space:]]*$|\1|p' "$1" | head -1; }
# build_tsan MPI SRC OUT: the program and tests/dt_impl.c, whole, with ThreadSanitizer (-O1).
build_tsan() {
    local mpi=$1 src=$2 out=$3 cc=$DT_CC defs=
    if [ "$mpi" = 1 ]; then cc=$DT_MPICC defs=-DDT_MPI; fi
    $cc -std=c99 -O1 -g1 -fsanitize=thread $DT_CPPFLAGS $defs -I"$ROOT/tests" "$src" $(extra_sources "$src") \
        tests/dt_impl.c -o "$out" $DT_LIBS -lpthread
}

# build_gpu_test MPI SRC OUT: -DDT_CUDA, linked with the kernels, cuBLAS and the CUDA runtime;
# MPI=1: with mpicc -DDT_MPI, and -DDT_NCCL with NCCL when it is installed. A .cu test is one
# process, built by nvcc.
build_gpu_test() {
    local mpi=$1 src=$2 out=$3 cc=$DT_CC defs=-DDT_CUDA libs="-lcublasLt -lcublas -lcudart" kernels_lib=
    [ -f build/kernels/libdt_kernels.a ] && kernels_lib=build/kernels/libdt_kernels.a
    if [[ $src == *.cu ]]; then
        "$DT_NVCC" -O2 -arch="$DT_CUDA_ARCH" $DT_CPPFLAGS -I"$ROOT/kernels" -I"$ROOT/tests" $defs "$src" \
            $kernels_lib -o "$out" -lcublasLt -lcublas $DT_LIBS
        return
    fi
    if [ "$mpi" = 1 ]; then cc=$DT_MPICC defs+=" -DDT_MPI $DT_NCCL_DEFS" libs+=" $DT_NCCL_LIBS"; fi
    $cc $DT_CFLAGS $DT_CPPFLAGS $defs -I"$DT_CUDA_HOME/include" -I"$ROOT/kernels" -I"$ROOT/tests" "$src" \
        $kernels_lib -o "$out" $DT_CUDA_LDFLAGS $libs -lstdc++ $DT_LIBS
}

# PROGRAMS rows: "kind name src mpi np-list", in the order they run. kind: test, mpi, gpu.
# np-list "-" means: run the program directly, not under mpirun.
PROGRAMS=()
add_program() { # KIND SRC
    local kind=$1 src=$2 name mpi=0 nps
    name=$(basename "${src%.*}")
    selected "$name" || return 0
    nps=$(np_list "$src")
    if [ "$kind" = mpi ] || wants_mpi "$src"; then
        mpi=1
        [ -n "$nps" ] || nps=$([ "$kind" = mpi ] && echo 2 || echo 1)
        if is_driver "$src"; then nps=-; fi
        if [ -z "$DT_MPICC" ]; then report "SKIP $name: mpicc not found"; return 0; fi
    fi
    [ -n "$nps" ] || nps=-
    if [ "$QUICK" = 1 ] && [ "$nps" != - ]; then # 2 ranks, or the least it runs at
        if [[ " $nps " == *" 2 "* ]]; then nps=2; else nps=${nps%% *}; fi
    fi
    PROGRAMS+=("$kind $name $src $mpi ${nps// /,}")
}

# test_deps SRC: SRC and the files of the checkout it includes by quotes, and theirs (tests/opt/
# mlp.h; tests/test_opt.c, which tests/test_opt_nommap.c builds on), so that a change to one of
# them rebuilds the test, not only a change to SRC or to the INPUTS.
test_deps() {
    local f inc cand seen=" $1 "
    local -a queue=("$1")
    while [ ${#queue[@]} -gt 0 ]; do
        f=${queue[0]} queue=("${queue[@]:1}")
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
            for cand in "$(dirname "$f")/$inc" "tests/$inc" "$inc"; do
                [ -f "$cand" ] || continue
                [[ $seen == *" $cand "* ]] || { seen+="$cand " queue+=("$cand"); }
                break
            done
        done
    done
    echo $seen
}

# spawn_test_builds 1: the implementation objects and the tests built whole; 2 (after those are
# done): the tests linked with an implementation object.
spawn_test_builds() {
    local phase=$1 src row kind name mpi obj san cflags out id
    if [ "$phase" = 1 ]; then
        for src in tests/test_*.c; do add_program test "$src"; done
        for src in tests/mpi_*.c; do add_program mpi "$src"; done
        [ "$QUICK" = 1 ] || for src in tests/gpu_*.c tests/gpu_*.cu; do add_program gpu "$src"; done
    fi
    for row in "${PROGRAMS[@]}"; do
        read -r kind name src mpi _ <<<"$row"
        [ "$kind" = gpu ] && continue # built after the kernels, below
        if [ "$phase" = 1 ] && [ "$ASAN" = 1 ] && [ -n "$(tsan_np "$src")" ]; then
            spawn step "tsan_$name" "$T/tsan/$name" "$(test_deps "$src") tests/dt_impl.c" build_tsan "$mpi" "$src" "$T/tsan/$name"
        fi
        for san in 0 1; do
            [ $san = 1 ] && [ "$ASAN" != 1 ] && continue
            if [ $san = 1 ]; then cflags=$ASAN_CFLAGS out=$T/asan/$name id=asan_$name
            else cflags=$TEST_CFLAGS out=$T/$name id=$name
            fi
            if builds_whole "$src"; then
                [ "$phase" = 1 ] && spawn step "$id" "$out" "$(test_deps "$src")" build_test "$mpi" "$src" "$out" "$cflags"
                continue
            fi
            obj=$(impl_obj "$mpi" $san)
            if [ "$phase" = 1 ]; then
                # once per variant (the first test that needs it spawns it)
                [[ " ${IMPL_SPAWNED[*]} " == *" $obj "* ]] && continue
                IMPL_SPAWNED+=("$obj")
                spawn step "$(impl_id "$obj")" "$obj" tests/dt_impl.c build_impl "$mpi" "$obj" "$cflags"
            else
                spawn step "$id" "$out" "$(test_deps "$src") $obj" build_test "$mpi" "$src" "$out" "$cflags" "$obj"
            fi
        done
    done
}
IMPL_SPAWNED=()
impl_id() { if [[ $1 == */asan/* ]]; then echo "impl_asan_$(basename "${1%.o}")"; else echo "impl_$(basename "${1%.o}")"; fi; }

spawn_gpu_builds() {
    local row kind name src mpi
    [ -n "$DT_NVCC" ] || return 0
    for row in "${PROGRAMS[@]}"; do
        read -r kind name src mpi _ <<<"$row"
        [ "$kind" = gpu ] && spawn step "$name" "$T/$name" "$src" build_gpu_test "$mpi" "$src" "$T/$name"
    done
}

# --- CUDA kernels on the CPU emulator (tests/cuda_emu) -----------------------------------------

# Every .cu file in kernels/ compiled by g++ against the emulator's fake CUDA headers
# (tests/cuda_emu/include/), linked with its runtime (tests/cuda_emu/cuda_emu.cpp) and with each
# tests/cuda_emu/k_*.cpp, which compares the kernels with dt_tensor.h's CPU ops. No GPU, no nvcc.
# Each program runs once in every EMU_MODES mode (" [mode]" appended to its check names; a line
# "// emu-modes: M..." in the program names fewer: the end-to-end ones run one or two), then once
# built with ThreadSanitizer, on small inputs (DT_K_SMALL=1), with the argument "tsan" (names
# prefixed "tsan:"; a TSan report is a failure, except the one k_detect.cpp plants and expects).
# The TSan run plays each CUDA thread on a host thread, in parallel order. The same without TSan
# (" [threads]", DT_EMU_THREADS=1: the emulator's lazy start, see cuda_emu.cpp) runs where TSan does
# not (k_core), and where a program's emu-modes line names it (k_mma: warp gathers and barriers);
# on every program it repeated the TSan run's kernels and inputs (56 s of the suite's CPU time).
# E, EMU_CXX, EMU_INC, EMU_TSAN, EMU_MPICXX, emu_stale and the compile commands (emu_runtime,
# emu_kernel, emu_nccl) are shared with build.sh's build/examples/emu/ (tests/cuda_emu/emu_build.sh).
source tests/cuda_emu/emu_build.sh
EMU_MODES=(parallel forward reverse random:1 random:2)
EMU_TESTS=()

# A program of the group runs when the group is selected, or a word of its name is
# (tests/run.sh k_gpt: "cuda_emu:k_gpt" alone, with the objects it links, no TSan builds when it
# has no TSan run).
# DT_EMU_ONLY="k_core k_ops": only those programs (while iterating on a few kernels).
emu_selected() {
    if [ -n "${DT_EMU_ONLY:-}" ] && [[ " $DT_EMU_ONLY " != *" $1 "* ]]; then return 1; fi
    selected "cuda_emu:$1"
}
emu_any() {
    local src
    for src in tests/cuda_emu/k_*.cpp; do emu_selected "$(basename "${src%.cpp}")" && return 0; done
    return 1
}
emu_any_tsan() {
    local src
    for src in tests/cuda_emu/k_*.cpp; do
        emu_selected "$(basename "${src%.cpp}")" && ! emu_no_tsan "$src" && return 0
    done
    return 1
}

# The runtime (never instrumented: under TSan only its barriers may order the kernel's threads)
# and every kernel file, plain and with TSan.
spawn_emu_objects() {
    local cu o tsan=0
    emu_any || selected cuda_emu_comm || return 0
    emu_any_tsan && tsan=1
    mkdir -p "$E/obj" "$E/tsan"
    emu_stale "$E/obj/cuda_emu.o" tests/cuda_emu/cuda_emu.cpp
    spawn step emu_runtime "$E/obj/cuda_emu.o" tests/cuda_emu/cuda_emu.cpp emu_runtime "$E/obj/cuda_emu.o"
    emu_stale "$E/tsan/cuda_emu.o" tests/cuda_emu/cuda_emu.cpp
    [ $tsan = 1 ] && spawn step emu_runtime_tsan "$E/tsan/cuda_emu.o" tests/cuda_emu/cuda_emu.cpp emu_runtime "$E/tsan/cuda_emu.o" tsan
    # the five implementations (tests/dt_impl.c as C++), without and with DT_CUDA, plain and TSan:
    # linked into each k_*.cpp that does not define DT_IMPLEMENTATION itself (emu_impl)
    emu_any && for o in plain cuda; do
        mkdir -p "$E/impl/tsan"
        local def=
        [ $o = cuda ] && def=-DDT_CUDA
        emu_stale "$E/impl/$o.o" tests/dt_impl.c
        spawn step "emu_impl_$o" "$E/impl/$o.o" tests/dt_impl.c $EMU_CXX -O1 $def $EMU_INC -x c++ -c tests/dt_impl.c \
            -o "$E/impl/$o.o"
        emu_stale "$E/impl/tsan/$o.o" tests/dt_impl.c
        [ $tsan = 1 ] && spawn step "emu_impl_tsan_$o" "$E/impl/tsan/$o.o" tests/dt_impl.c $EMU_CXX -O1 $EMU_TSAN $def $EMU_INC -x c++ \
            -c tests/dt_impl.c -o "$E/impl/tsan/$o.o"
    done
    for cu in kernels/*.cu; do
        o=$(basename "${cu%.cu}").o
        emu_stale "$E/obj/$o" "$cu"
        spawn step "emu_$o" "$E/obj/$o" "$cu" emu_kernel "$cu" "$E/obj/$o"
        emu_stale "$E/tsan/$o" "$cu"
        [ $tsan = 1 ] && spawn step "emu_tsan_$o" "$E/tsan/$o" "$cu" emu_kernel "$cu" "$E/tsan/$o" tsan
    done
    return 0
}

# A line "// emu-tsan: skip" in a program leaves it out of the ThreadSanitizer build and run (the
# end-to-end programs: the kernels they call have TSan runs of their own, and a model step under
# TSan costs minutes).
emu_no_tsan() { grep -qE '^//[[:space:]]*emu-tsan:[[:space:]]*skip' "$1"; }

# emu_impl SRC: the implementation object a k_*.cpp links (empty when it defines
# DT_IMPLEMENTATION itself, or includes an example's .c that does): $E/impl/cuda.o when it
# defines DT_CUDA, else $E/impl/plain.o; with "tsan", the ThreadSanitizer one.
emu_impl() {
    grep -qE '^#[[:space:]]*define[[:space:]]+DT_IMPLEMENTATION|^#[[:space:]]*include[[:space:]]+"[^"]*\.c"' "$1" && return 0
    local dir=$E/impl
    [ "${2:-}" = tsan ] && dir=$E/impl/tsan
    if grep -qE '^#[[:space:]]*define[[:space:]]+DT_CUDA' "$1"; then echo "$dir/cuda.o"; else echo "$dir/plain.o"; fi
}

# emu_deps SRC: SRC and the files of tests/cuda_emu/ it includes ("k_mma_kernels.cuh"), so that
# an edit of one rebuilds the program.
emu_deps() {
    local f deps=$1
    for f in $(sed -n 's|^#[[:space:]]*include[[:space:]]*"\([^"]*\)".*|\1|p' "$1"); do
        [ -f "tests/cuda_emu/$f" ] && deps+=" tests/cuda_emu/$f"
        case $f in examples/*) [ -f "$f" ] && deps+=" $f $(dirname "$f")/*.h" ;; esac # an example it includes
    done
    echo "$deps"
}

# After the objects: each test program, linked with all of them.
spawn_emu_tests() {
    local src name impl
    emu_any || return 0
    for src in tests/cuda_emu/k_*.cpp; do
        name=$(basename "${src%.cpp}")
        emu_selected "$name" || continue
        EMU_TESTS+=("$name")
        impl=$(emu_impl "$src")
        emu_stale "$E/$name" "$E"/obj/*.o $impl
        spawn step "emu_$name" "$E/$name" "$(emu_deps "$src")" $EMU_CXX -O1 $EMU_INC "$src" $impl "$E"/obj/*.o -o "$E/$name" $DT_LIBS \
            -lpthread
        emu_no_tsan "$src" && continue
        impl=$(emu_impl "$src" tsan)
        emu_stale "$E/tsan/$name" "$E"/tsan/*.o $impl
        spawn step "emu_tsan_$name" "$E/tsan/$name" "$(emu_deps "$src")" $EMU_CXX -O1 $EMU_TSAN $EMU_INC "$src" $impl "$E"/tsan/*.o \
            -o "$E/tsan/$name" $DT_LIBS -lpthread
    done
}

# dt_comm.h's NCCL path on the emulator (group cuda_emu_comm): tests/gpu_comm.c as C++ (mpicxx,
# -DDT_MPI -DDT_CUDA -DDT_NCCL) against the fake CUDA runtime and the fake NCCL
# (tests/cuda_emu/nccl_emu.cpp: NCCL over MPI), linked with every emulated kernel; run at each np
# of its first line with 4 emulated devices (one per rank), in both stream modes
# (DT_EMU_STREAMS=immediate and deferred: see cuda_emu.cpp). Names: "emu:<check> [np=N, mode]".
spawn_emu_comm() {
    selected cuda_emu_comm || return 0
    [ -n "$DT_MPICC" ] && [ -n "$EMU_MPICXX" ] || return 0
    mkdir -p "$E/comm"
    emu_stale "$E/comm/nccl_emu.o" tests/cuda_emu/nccl_emu.cpp
    emu_stale "$E/comm/gpu_comm" tests/cuda_emu/nccl_emu.cpp "$E"/obj/*.o
    spawn step emu_gpu_comm "$E/comm/gpu_comm" tests/gpu_comm.c build_emu_comm
}
build_emu_comm() {
    emu_nccl "$E/comm/nccl_emu.o" || return 1
    $EMU_MPICXX -std=c++17 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -O1 -x c++ -DDT_MPI -DDT_CUDA -DDT_NCCL $EMU_INC tests/gpu_comm.c -x none \
        "$E/comm/nccl_emu.o" "$E"/obj/*.o -o "$E/comm/gpu_comm" $DT_LIBS -lpthread
}
# The multi-rank CUDA tests (group cuda_emu_comm too): each tests/cuda_emu/mpi_*.cpp built with
# mpicxx -DDT_MPI against the emulator (device tensors staged through host memory by dt_comm.h's
# MPI path; no NCCL), run at each np of its first line "// np: ...", in the default thread order
# (the kernels' orders and races are the single-rank k_*.cpp's business). Names "emu:<check> [np=N]".
EMU_MPI_TESTS=()
spawn_emu_mpi() {
    local src name
    selected cuda_emu_comm || return 0
    [ -n "$DT_MPICC" ] && [ -n "$EMU_MPICXX" ] || return 0
    mkdir -p "$E/comm"
    for src in tests/cuda_emu/mpi_*.cpp; do
        name=$(basename "${src%.cpp}")
        EMU_MPI_TESTS+=("$src")
        emu_stale "$E/comm/$name" "$E"/obj/*.o
        spawn step "emu_$name" "$E/comm/$name" "$(emu_deps "$src")" $EMU_MPICXX -std=c++17 -O1 -g -Wall -Wextra -Werror \
            -Wno-unknown-pragmas -DDT_MPI $EMU_INC "$src" "$E"/obj/*.o -o "$E/comm/$name" $DT_LIBS -lpthread
    done
}
run_emu_mpi() {
    local src name np
    for src in "${EMU_MPI_TESTS[@]}"; do
        name=$(basename "${src%.cpp}")
        step_ok "cuda_emu_comm:$name" "$E/comm/$name" "emu_$name" || continue
        for np in $(np_list "$src"); do
            run_prog "$name [np=$np]" "emu:" " [np=$np]" $DT_MPIRUN -np "$np" "$E/comm/$name"
        done
    done
}

run_emu_comm() {
    local np mode
    selected cuda_emu_comm || return 0
    section "dt_comm.h's NCCL path on the CPU emulator (tests/gpu_comm.c + tests/cuda_emu/nccl_emu.cpp)"
    if [ -z "$DT_MPICC" ] || [ -z "$EMU_MPICXX" ]; then report "SKIP cuda_emu_comm: mpicc or mpicxx not found"; return; fi
    step_ok "cuda_emu_comm" "$E/comm/gpu_comm" emu_gpu_comm || return
    for np in $(np_list tests/gpu_comm.c); do
        for mode in immediate deferred; do
            run_prog "cuda_emu_comm [np=$np, $mode]" "emu:" " [np=$np, $mode]" env DT_EMU_DEVICES=4 \
                DT_EMU_STREAMS=$mode $DT_MPIRUN -np "$np" "$E/comm/gpu_comm"
        done
    done
    run_emu_mpi
}

run_emu() {
    local cu o name mode
    emu_any || return 0
    section "CUDA kernels on the CPU emulator (tests/cuda_emu: ${EMU_MODES[*]}, then ThreadSanitizer)"
    step_result "cuda_emu:build:cuda_emu.cpp" emu_runtime "$E/obj/cuda_emu.o"
    for cu in kernels/*.cu; do
        o=$(basename "${cu%.cu}").o
        step_result "cuda_emu:build:$(basename "$cu")" "emu_$o" "$E/obj/$o"
    done
    for name in "${EMU_TESTS[@]}"; do
        step_ok "cuda_emu:$name" "$E/$name" "emu_$name" || continue
        # a line "// emu-modes: M..." runs only those (the end-to-end programs: their kernels'
        # own tests run in every order, and a model step costs seconds per emulated order)
        local modes
        modes=$(sed -n 's|^//[[:space:]]*emu-modes:[[:space:]]*\([a-z:0-9 ]*\).*|\1|p' "tests/cuda_emu/$name.cpp" | head -n 1)
        if [ -z "$modes" ]; then
            modes="${EMU_MODES[*]}"
            emu_no_tsan "tests/cuda_emu/$name.cpp" && modes+=" threads"
        fi
        for mode in $modes; do
            # threads: the parallel order with a host thread per CUDA thread (DT_EMU_THREADS=1)
            # instead of fibers, as the TSan build runs them, so that path is checked without TSan
            # too; on the TSan run's small inputs (the sizes are the other modes' to check)
            if [ "$mode" = threads ]; then
                run_bg "$name [$mode]" "" " [$mode]" env DT_EMU_MODE=parallel DT_EMU_THREADS=1 DT_K_SMALL=1 "$E/$name"
            else
                run_bg "$name [$mode]" "" " [$mode]" env DT_EMU_MODE="$mode" "$E/$name"
            fi
        done
    done
    for name in "${EMU_TESTS[@]}"; do
        emu_no_tsan "tests/cuda_emu/$name.cpp" && continue
        step_ok "tsan:$name" "$E/tsan/$name" "emu_tsan_$name" || continue
        run_bg "tsan:$name" "tsan:" "" env DT_EMU_MODE=parallel DT_K_SMALL=1 \
            TSAN_OPTIONS="halt_on_error=0:exitcode=66:history_size=4" "$E/tsan/$name" tsan
    done
    run_bg_flush
}

# --- running -----------------------------------------------------------------------------------

# ASan and LSan do not work everywhere (LSan needs ptrace; some kernels' ASLR breaks ASan): try
# them once on an empty program. Sets ASAN_RUN (0: report the sanitizer runs as SKIP) and LEAKS.
ASAN_RUN=0 LEAKS=0 ASAN_WHY=
probe_sanitizers() {
    local probe=$T/asan/sanitizer_probe
    [ "$ASAN" = 1 ] || { ASAN_WHY="DT_TEST_ASAN=0"; return; }
    printf '#include <stdlib.h>\nint main(void){free(malloc(16));return 0;}\n' >"$probe.c"
    if ! $DT_CC $SAN "$probe.c" -o "$probe" >"$L/sanitizer_probe.log" 2>&1; then
        ASAN_WHY="the compiler cannot build with $SAN (see $L/sanitizer_probe.log)"
    elif ASAN_OPTIONS=detect_leaks=1 "$probe" >>"$L/sanitizer_probe.log" 2>&1; then
        ASAN_RUN=1 LEAKS=1
    elif ASAN_OPTIONS=detect_leaks=0 "$probe" >>"$L/sanitizer_probe.log" 2>&1; then
        ASAN_RUN=1
        echo "note: LeakSanitizer does not run here (no ptrace?); ASan runs without leak checks"
    else
        ASAN_WHY="ASan programs do not run on this machine (see $L/sanitizer_probe.log)"
    fi
}

# run_prog LABEL PREFIX SUFFIX CMD...: runs CMD with a timeout in a fresh scratch directory,
# prints its check lines with each name made PREFIX<name>SUFFIX, and counts one more failure,
# named LABEL, when the program crashed, timed out, exited non-zero without a FAIL line, or
# printed no check line at all.
run_prog() {
    run_exec "$1" "${@:4}"
    run_report "$1" "$2" "$3"
}

# run_log LABEL: the log of a run ("mpi_x [np=2]" -> run_mpi_x.np2.log, "asan:test_x" ->
# run_asan_test_x.log); run_exec leaves its exit status and seconds beside it (.rc, .secs).
run_log() {
    local safe=${1// \[np=/.np}
    safe=${safe//]/}
    safe=${safe//[^A-Za-z0-9_.-]/_}
    echo "$L/run_$safe.log"
}

# run_exec LABEL CMD...: runs CMD (timeout, no stdin, its own scratch DT_TEST_TMPDIR) into its log.
run_exec() {
    local label=$1
    shift
    local log tmp t0=$EPOCHREALTIME rc
    log=$(run_log "$label")
    tmp=$ROOT/$T/tmp/$(basename "${log%.log}")
    rm -rf "$tmp" && mkdir -p "$tmp"
    # The subshell (kept from exec'ing timeout by the "exit") takes bash's own "Segmentation
    # fault" notice to /dev/null: the crash is reported below, with the program's name.
    (DT_TEST_TMPDIR=$tmp timeout -k 10 "$TIMEOUT" "$@" </dev/null >"$log" 2>&1; exit $?) 2>/dev/null
    rc=$?
    echo "$rc" >"$log.rc"
    awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f\n", b - a}' >"$log.secs"
}

# Runs of one-process programs that neither time themselves nor share files go JOBS at a time
# (the emulator's runs: 2 cores halve their time); run_bg_flush reports them in start order.
BG_RUNS=()
run_bg() {
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    run_exec "$1" "${@:4}" &
    BG_RUNS+=("$1"$'\t'"$2"$'\t'"$3")
}
run_bg_flush() {
    local row label prefix suffix
    wait
    for row in "${BG_RUNS[@]}"; do
        IFS=$'\t' read -r label prefix suffix <<<"$row"
        run_report "$label" "$prefix" "$suffix"
    done
    BG_RUNS=()
}

# run_report LABEL PREFIX SUFFIX: the checks of a finished run, each name PREFIX name SUFFIX, and
# a failure of its own when it crashed, timed out, or printed no check.
run_report() {
    local label=$1 prefix=$2 suffix=$3 log rc secs
    log=$(run_log "$label")
    rc=$(cat "$log.rc" 2>/dev/null || echo 1)
    secs=$(cat "$log.secs" 2>/dev/null || echo 0)
    echo "-- $label (${secs}s)"
    RUNTIMES+=("$secs $label")

    local line kind rest name details checks=0 fails=0
    while IFS= read -r line; do
        [[ $line =~ ^(PASS|FAIL|SKIP)\ (.+)$ ]] || continue
        kind=${BASH_REMATCH[1]} rest=${BASH_REMATCH[2]}
        name=${rest%%: *}
        details=${rest:${#name}}
        [[ $name == *"[np="* ]] || name+=$suffix
        report "$kind $prefix$name$details"
        checks=$((checks + 1))
        [ "$kind" = FAIL ] && fails=$((fails + 1))
    done <"$log"

    local why=
    if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ "${secs%.*}" -ge "$TIMEOUT" ]; }; then
        why="timed out after ${TIMEOUT}s"
    elif [ "$rc" -gt 128 ]; then
        why="killed by signal $((rc - 128)) (SIG$(kill -l $((rc - 128)) 2>/dev/null))"
    elif [ "$rc" -ne 0 ] && [ $fails -eq 0 ]; then
        why="exited with status $rc without a FAIL line"
    elif [ "$rc" -eq 0 ] && [ $checks -eq 0 ]; then
        why="printed no PASS/FAIL/SKIP line"
    elif grep -qE 'ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:' "$log"; then
        # a sanitizer report is a failure of its own, even after FAIL lines (a halting UBSan stops
        # the program at the first report, so the checks after it never ran)
        why="a sanitizer report"
    fi
    if [ -n "$why" ]; then
        report "FAIL $label: $why (log: $log)"
        show_log "$log"
    fi
}

# run_program ROW: builds succeeded? then every run of one program (its variants, its rank counts).
run_program() {
    local kind name src mpi nps np exe
    read -r kind name src mpi nps <<<"$1"
    exe=$T/$name
    if [ "$kind" = gpu ]; then
        if [ -z "$DT_NVCC" ]; then report "SKIP $name: nvcc not found"; return; fi
        step_ok "$name" "$exe" || return
        if [ "$DT_HAVE_GPU" != 1 ]; then report "SKIP $name: no GPU (nvidia-smi finds none); it builds"; return; fi
    else
        step_ok "$name" "$exe" || return
    fi
    # With the sanitizer runs on, a multi-rank test runs plain at one rank count only (2, or
    # the least it lists): the ASan+UBSan build runs the same checks at every rank count, so
    # a plain run at the others would repeat them; the plain one checks the -O2 build.
    # A second line "// asan np: ..." narrows the sanitizer runs; the plain build adds the rest.
    local plain_nps=$nps asan_nps=$nps
    if [ "$kind" = mpi ] && [ "$ASAN_RUN" = 1 ] && [[ $nps == *,* ]]; then
        if [[ ,$nps, == *,2,* ]]; then plain_nps=2; else plain_nps=${nps%%,*}; fi
        local only
        only=$(asan_np_list "$src")
        if [ -n "$only" ]; then
            asan_nps=${only// /,}
            for np in ${nps//,/ }; do
                [[ ,$asan_nps,$plain_nps, == *,$np,* ]] || plain_nps=$plain_nps,$np
            done
        fi
    fi
    for np in ${plain_nps//,/ }; do
        if [ "$np" = - ]; then
            run_prog "$name" "" "" "$exe"
        elif [ "$kind" = mpi ] || [ "$(np_list "$src")" ]; then
            run_prog "$name [np=$np]" "" " [np=$np]" $DT_MPIRUN -np "$np" "$exe"
        else
            run_prog "$name" "" "" $DT_MPIRUN -np "$np" "$exe"
        fi
    done
    [ "$kind" = gpu ] && return
    local tnp
    tnp=$(tsan_np "$src")
    if [ -n "$tnp" ] && [ "$ASAN" = 1 ]; then # (deadlock reports off: Open MPI's own lock order trips them)
        if step_ok "tsan:$name" "$T/tsan/$name" "tsan_$name"; then
            run_prog "tsan:$name [np=$tnp]" "tsan:" " [np=$tnp]" env TSAN_OPTIONS="halt_on_error=0:exitcode=66:detect_deadlocks=0" \
                $DT_MPIRUN -np "$tnp" "$T/tsan/$name"
        fi
    fi
    if [ "$ASAN_RUN" != 1 ]; then
        [ "$ASAN" = 1 ] && report "SKIP asan:$name: $ASAN_WHY"
        return
    fi
    step_ok "asan:$name" "$T/asan/$name" "asan_$name" || return
    # OpenMPI leaks by design at exit: no leak checks for programs that run it
    local leaks=$LEAKS
    [ "$mpi" = 1 ] && leaks=0
    local opts="detect_leaks=$leaks:print_legend=0:halt_on_error=1"
    if [ "$kind" = mpi ]; then # at each rank count, as the plain runs (or those its second line names)
        for np in ${asan_nps//,/ }; do
            if [ "$np" = - ]; then
                run_prog "asan:$name" "asan:" "" env ASAN_OPTIONS="$opts" UBSAN_OPTIONS=print_stacktrace=1:suppressions=$ROOT/tests/ubsan.supp "$T/asan/$name"
            else
                run_prog "asan:$name [np=$np]" "asan:" " [np=$np]" env ASAN_OPTIONS="$opts" UBSAN_OPTIONS=print_stacktrace=1:suppressions=$ROOT/tests/ubsan.supp \
                    $DT_MPIRUN -np "$np" "$T/asan/$name"
            fi
        done
    elif [ "$mpi" = 1 ]; then
        run_prog "asan:$name" "asan:" "" env ASAN_OPTIONS="$opts" UBSAN_OPTIONS=print_stacktrace=1:suppressions=$ROOT/tests/ubsan.supp $DT_MPIRUN -np 1 "$T/asan/$name"
    else
        run_prog "asan:$name" "asan:" "" env ASAN_OPTIONS="$opts" UBSAN_OPTIONS=print_stacktrace=1:suppressions=$ROOT/tests/ubsan.supp "$T/asan/$name"
    fi
}

# step_ok NAME OUT [ID]: the build step that made OUT succeeded; else one failure named NAME
# with the compiler's output, or a SKIP when the program includes a dt header not written yet.
step_ok() {
    local name=$1 out=$2 id=${3:-$1} log missing
    [ -e "$out" ] && return 0
    log=$L/$id.log
    missing=$(grep -oE "fatal error: [^:]*dt_[a-z_]+\.h: No such file" "$log" 2>/dev/null | head -n 1 | grep -oE 'dt_[a-z_]+\.h')
    if [ -n "$missing" ]; then
        report "SKIP $name: needs $missing, which does not exist yet"
    else
        report "FAIL $name: does not build (log: $log)"
        show_log "$log" head
    fi
    return 1
}

# --- main --------------------------------------------------------------------------------------

echo "dt tests: $($DT_CC --version | head -n 1)${DT_MPICC:+, $(mpirun --version 2>/dev/null | head -n 1)}${DT_NVCC:+, nvcc $("$DT_NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') ($DT_CUDA_ARCH)}, GPU: $([ "$DT_HAVE_GPU" = 1 ] && echo yes || echo none)"

# multihost (tests/multihost.sh) waits on its namespaced hosts and on timeouts: 95 s on the clock.
# It needs only ./build.sh's examples, so it runs while the suite builds (started first, and out
# of the job table, so that JOBS compilers still run beside it) and is reported at its place
# below: the builds took some 50 s longer beside it (its ranks spin while they wait), 45 s saved.
# The compilers then run at nice 10, its ranks ahead of them: the fault checks time how soon a
# fault is named (3.6-3.75 s either way).
MH_BG=0
if selected multihost; then
    rm -f "$(run_log multihost).rc"
    (TIMEOUT=$((TIMEOUT * 3)) run_exec multihost bash tests/multihost.sh) &
    disown $!
    MH_BG=1
fi
# launch (tests/launch.sh) too: 11 s on the clock, under 1 s of CPU (its stand-in mpirun sleeps
# out the launcher's grace and probe timeouts), needing nothing the suite builds.
LAUNCH_BG=0
if selected launch; then
    rm -f "$(run_log launch).rc"
    (run_exec launch bash tests/launch.sh) &
    disown $!
    LAUNCH_BG=1
fi

# Build everything first, JOBS compilers at a time; then report and run in a fixed order.
spawn_compile_checks
spawn_kernels
spawn_test_builds 1
spawn_emu_objects
wait
spawn_test_builds 2
if [ ${#KERNELS[@]} -gt 0 ]; then
    objs=()
    for cu in "${KERNELS[@]}"; do
        o=build/kernels/$(basename "${cu%.cu}").o
        [ -e "$o" ] && objs+=("$o")
    done
    rm -f build/kernels/libdt_kernels.a
    [ ${#objs[@]} -gt 0 ] && ar rcs build/kernels/libdt_kernels.a "${objs[@]}"
fi
spawn_gpu_builds
spawn_emu_tests
spawn_emu_comm
spawn_emu_mpi
wait

if [ ${#CHECKS[@]} -gt 0 ]; then
    section "compile checks"
    for row in "${CHECKS[@]}"; do
        if [[ $row == SKIP* ]]; then report "$row"; continue; fi
        read -r name id stamp <<<"$row"
        step_result "$name" "$id" "$stamp"
    done
fi
if [ ${#KERNELS[@]} -gt 0 ]; then
    section "CUDA kernels (nvcc $DT_NVCC_FLAGS)"
    for cu in "${KERNELS[@]}"; do
        name=$(basename "$cu")
        step_result "kernel:$name" "kernel_$name" "build/kernels/${name%.cu}.o"
    done
fi

if selected ptx:dt_mma; then
    section "tensor-core and vector-load PTX for sm_80 and sm_90 (tests/ptx_mma.sh)"
    if [ -z "$DT_NVCC" ]; then report "SKIP ptx:dt_mma: nvcc not found"
    else run_prog ptx:dt_mma "" "" bash tests/ptx_mma.sh
    fi
fi
run_emu
run_emu_comm

if selected readme; then
    section "README.md and docs/*.md snippets (tests/readme_snippets.sh)"
    run_prog readme_snippets "" "" bash tests/readme_snippets.sh
fi
# tutorial:<step>_npN_losses_equal_1_single: the README's course (examples/tutorial) at np 1, 2
if selected tutorial; then
    section "examples/tutorial at np 1 and 2 against the one-process losses (tests/tutorial.sh)"
    run_prog tutorial "" "" bash tests/tutorial.sh
fi

# cuda_counters: build/examples/emu/{gpt,dlrm} (./build.sh) train with --device cuda on the emulator,
# and each step after the first allocates nothing, uploads its inputs only, copies nothing down and
# waits at most once (tests/cuda_counters.sh; six emulated runs: a longer timeout)
if selected cuda_counters; then
    section "a CUDA step stays on the device: examples/gpt and dlrm's counters on the emulator (tests/cuda_counters.sh)"
    TIMEOUT=$((TIMEOUT * 3)) run_prog cuda_counters "" "" bash tests/cuda_counters.sh
fi

if selected dlrm_reference; then
    section "examples/dlrm against an independent NumPy model (tests/dlrm_reference.py)"
    py=/usr/bin/python3 # Debian's, where python3-numpy installs
    [ -x "$py" ] || py=$(command -v python3)
    if [ -n "$py" ]; then run_prog dlrm_reference "" "" "$py" tests/dlrm_reference.py
    else report "SKIP dlrm_reference: no python3 (./build.sh installs it)"
    fi
fi

# slow_rank: examples/gpt names a rank slowed by busy loops on its core (tests/slow_rank.sh)
if selected slow_rank; then
    section "a slow rank named: gpt --slow-every with a CPU hog beside rank 1 (tests/slow_rank.sh)"
    run_prog slow_rank "" "" bash tests/slow_rank.sh
fi

# launch: examples/launch.sh's restart paths, with a stand-in mpirun (tests/launch.sh)
if [ $LAUNCH_BG = 1 ]; then
    section "elastic restart: examples/launch.sh against a stand-in mpirun (tests/launch.sh, run while the suite built)"
    waited=0 # (run_exec's timeout ends it; this bounds a subshell that died without its .rc)
    while [ ! -e "$(run_log launch).rc" ] && [ $waited -lt $((TIMEOUT * 2 + 60)) ]; do sleep 1; waited=$((waited + 1)); done
    run_report launch "" ""
fi

# multihost: examples/gpt and dlrm across 2 and 3 hosts made as network namespaces (root only:
# otherwise one SKIP line saying why), each run equal to np 1 (tests/multihost.sh)
if selected multihost; then
    section "across hosts: network namespaces, mpirun -H over TCP (tests/multihost.sh, run while the suite built)"
    waited=0 # (run_exec's timeout ends it; this bounds a subshell that died without its .rc)
    while [ ! -e "$(run_log multihost).rc" ] && [ $waited -lt $((TIMEOUT * 6 + 60)) ]; do sleep 1; waited=$((waited + 1)); done
    TIMEOUT=$((TIMEOUT * 3)) run_report multihost "" ""
fi

# ./build.sh gpu without a GPU (bench/gpu/selftest.sh: exit 3, arguments, the summary from made-up
# logs, the shard writer), then its builds (--build-only: the kernels for sm_90 with -Xptxas -v,
# the CUDA examples, every tests/cuda_emu/k_*.cpp against the real CUDA runtime, gpu_comm, the
# probe), so that the one command a GPU machine runs first cannot rot where no GPU is.
if selected "gpu:selftest gpu:build-only"; then
    section "./build.sh gpu without a GPU (bench/gpu/selftest.sh, then --build-only)"
    run_prog gpu:selftest "" "" bash bench/gpu/selftest.sh
    if [ -z "$DT_NVCC" ]; then report "SKIP gpu:build-only: nvcc not found"
    else TIMEOUT=${DT_TEST_GPU_TIMEOUT:-1800} run_prog gpu:build-only "" "" bash bench/gpu/run.sh --build-only
    fi
fi

# An implementation object that did not compile: one failure (the tests that link it say so too).
for obj in "${IMPL_SPAWNED[@]}"; do
    [ -e "$obj" ] || { report "FAIL build:$obj: tests/dt_impl.c does not compile (log: $L/$(impl_id "$obj").log)"; show_log "$L/$(impl_id "$obj").log" head; }
done
probe_sanitizers
last_kind=
for row in "${PROGRAMS[@]}"; do
    kind=${row%% *}
    if [ "$kind" != "$last_kind" ]; then
        case $kind in
            test) section "unit tests (tests/test_*.c; asan: ASan+UBSan build)" ;;
            mpi) section "multi-rank tests (tests/mpi_*.c, $DT_MPIRUN)" ;;
            gpu) section "GPU tests (tests/gpu_*)" ;;
        esac
        last_kind=$kind
    fi
    run_program "$row"
done

# The README's two commands in a fresh Debian root: minutes, root and the network, so only when
# asked for.
if selected fresh_debian; then
    section "fresh Debian 12 root (tests/fresh_debian.sh)"
    if [ "${DT_TEST_FRESH:-0}" = 1 ]; then
        echo "(some 90 minutes on 2 cores: the whole suite in each of two roots; progress in $L/run_fresh_debian.log)"
        TIMEOUT=${DT_TEST_FRESH_TIMEOUT:-10800} run_prog fresh_debian "" "" bash tests/fresh_debian.sh
    else
        report "SKIP fresh_debian: DT_TEST_FRESH=1 runs it (as root: debootstrap, chroot, some 90 minutes)"
    fi
fi

# Programs ./build.sh could not build (it passes their names).
if [ -n "${DT_BUILD_FAILED:-}" ]; then
    section "examples and benchmarks"
    for name in $DT_BUILD_FAILED; do
        selected "build:$name" || continue
        report "FAIL build:$name: does not build (log: build/logs/$(echo "$name" | tr / _).log)"
        show_log "build/logs/$(echo "$name" | tr / _).log" head
    done
fi

if [ ${#FAILURES[@]} -gt 0 ]; then
    section "failures"
    printf '%s\n' "${FAILURES[@]}"
fi
if [ ${#RUNTIMES[@]} -gt 0 ]; then
    section "the 10 slowest runs (seconds)"
    printf '%s\n' "${RUNTIMES[@]}" | sort -k1,1 -g -r | head -n 10 | awk '{ s = $1; $1 = ""; printf("%7.1f %s\n", s, substr($0, 2)) }'
fi
if [ -s "$L/build_times" ]; then
    section "the 10 slowest build steps (seconds; $(awk '{ s += $1 } END { printf "%.0f", s }' "$L/build_times") s in all, JOBS $JOBS at a time)"
    sort -k1,1 -g -r "$L/build_times" | head -n 10 | awk '{ printf("%7.1f %s\n", $1, $2) }'
fi
echo "tests took $(awk -v a="$START" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.0f", b - a}')s"
echo "$npass passed, $nfail failed, $nskip skipped"
[ $nfail -eq 0 ]
