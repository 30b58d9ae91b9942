#!/usr/bin/env bash
# build.sh - the one script of dt: dependencies, build, tests, demo, benchmarks.
#
#   ./build.sh          check dependencies, build examples/*/*.c and bench/*.c into build/
#                       (examples/gpt/gpt.c -> build/examples/gpt; a program is rebuilt when its
#                       own directory's *.h / *.inc change too); the examples with a CUDA path
#                       also against the CPU emulator: build/examples/emu/{gpt,dlrm,mlp}, which
#                       run --device cuda without a GPU (and build/examples/cuda/ with nvcc)
#   ./build.sh test     the same, then run tests/run.sh (ends with "N passed, N failed, N skipped")
#   ./build.sh test quick   while iterating (under 3 minutes on 2 cores): only examples/*/*.c
#                       (the programs the tests drive; no benchmarks, no CUDA builds), then
#                       tests/run.sh quick: the unit tests and the multi-rank tests at 2 ranks,
#                       plain builds only (no compile checks, sanitizers, kernels or emulator)
#   ./build.sh demo     the same, then train examples/dlrm on one process, then on 4 ranks with
#                       mpirun, and compare the two step by step
#   ./build.sh bench    the same, then run every benchmark (build/bench/*, bench/*.py); the
#                       Python ones in build/peers, a venv of the pinned peers (torch, TorchRec,
#                       FBGEMM: bench/peers*.txt) made once from PyPI, about 6 GB
#   ./build.sh gpu      on a machine with a GPU: build, test and measure there in one command
#                       (bench/gpu/run.sh; --build-only needs only nvcc; summary in build/gpu/)
#   ./build.sh clean    remove build/
#   ./build.sh env      print the toolchain settings as shell exports (tests/run.sh reads them)
#
# Environment: CC (default gcc), DT_CUDA_ARCH (default sm_90, or native when a GPU is present),
# DT_TEST_* (see tests/run.sh).
# Flag variables (DT_CFLAGS...) are word lists, expanded unquoted on purpose.
# shellcheck disable=SC2086,SC2046
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT=$PWD
shopt -s nullglob

die() { echo "build.sh: $*" >&2; exit 1; }

# --- dependencies ------------------------------------------------------------------------------

# A CBLAS that links: a test compile is the only check that tells a usable OpenBLAS from a
# stray header or library. Without a working compiler yet, the package database answers.
have_openblas() {
    if ! command -v ${CC:-gcc} >/dev/null || [ ! -f /usr/include/stdio.h ]; then
        dpkg-query -W -f='${Status}' libopenblas-dev 2>/dev/null | grep -q 'ok installed'
        return
    fi
    printf '#include <cblas.h>\nint main(void){cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,0,0,0,1.f,0,1,0,1,0.f,0,1);return 0;}\n' |
        ${CC:-gcc} $(blas_cflags) -x c - -o /dev/null $(blas_libs) >/dev/null 2>&1
}

# Debian ships several BLAS behind /usr/include/<triplet>/cblas.h alternatives; pkg-config names
# OpenBLAS's own directory so we get its cblas.h whatever the alternative points at.
blas_cflags() { local f; f=$(pkg-config --cflags openblas 2>/dev/null) || f=; echo $f; }
blas_libs() { local f; f=$(pkg-config --libs openblas 2>/dev/null) || f=-lopenblas; echo $f; }

# Every tool the build, the tests and the demo call, with the Debian package that holds it.
# Named one by one, so that an install without APT's recommended packages (usual in container
# images) gets them too: gcc alone does not bring libc6-dev's headers then.
#   gcc, libc6-dev      C compiler and C library headers (examples, tests, ASan/UBSan builds)
#   g++                 the compile checks build every header as C++ (tests/run.sh)
#   binutils            nm and ar (compile checks, kernel archive)
#   pkg-config          finds OpenBLAS's own cblas.h (blas_cflags)
#   libopenblas-dev     CBLAS for -DDT_CBLAS
#   libopenmpi-dev, openmpi-bin   mpicc and mpirun (multi-rank tests, the demo)
#   libstb-dev          stb_ds.h (dt_embed.h)
#   python3, python3-numpy        the independent safetensors / checkpoint readers in tests/
# (coreutils' timeout, awk, sed and the like come with every Debian.) Optional, never installed:
# clang (more compile checks) and nvcc (the CUDA parts); without them their checks are skipped.
# docs/build.md ("Dependencies") shows the same list.

# The packages above that are missing, on one line.
missing_deps() {
    local m=()
    command -v ${CC:-gcc} >/dev/null || m+=(gcc)
    [ -f /usr/include/stdio.h ] || m+=(libc6-dev)
    command -v ${CXX:-g++} >/dev/null || m+=(g++)
    command -v nm >/dev/null && command -v ar >/dev/null || m+=(binutils)
    command -v pkg-config >/dev/null || m+=(pkg-config)
    have_openblas || m+=(libopenblas-dev)
    command -v mpicc >/dev/null || m+=(libopenmpi-dev)
    command -v mpirun >/dev/null || m+=(openmpi-bin)
    [ -f /usr/include/stb/stb_ds.h ] || m+=(libstb-dev)
    [ -x /usr/bin/python3 ] || m+=(python3)
    # the tests run Debian's interpreter, /usr/bin/python3, where python3-numpy installs
    [ -f /usr/lib/python3/dist-packages/numpy/__init__.py ] || m+=(python3-numpy)
    if [ "${cmd:-}" = bench ]; then # the peers' venv (peers_venv) and torch.compile's C++ wrappers
        /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || m+=(python3-venv)
        [ -f "$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)/Python.h" ] ||
            m+=(python3-dev)
    fi
    echo "${m[*]}"
}

# Installs what is missing when run as root on a system with apt-get; otherwise says what to
# run as root (and how, from this account) and exits non-zero.
check_deps() {
    local missing line
    # a compiler named in CC or CXX is the user's business: no package would bring it
    if [ -n "${CC:-}" ] && ! command -v ${CC%% *} >/dev/null; then die "CC=$CC: no such command"; fi
    if [ -n "${CXX:-}" ] && ! command -v ${CXX%% *} >/dev/null; then die "CXX=$CXX: no such command"; fi
    missing=$(missing_deps)
    [ -z "$missing" ] && return 0
    if ! command -v apt-get >/dev/null; then
        die "missing: $missing (Debian package names); install their equivalents, then run $0 again"
    fi
    line="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $missing"
    if [ "$(id -u)" -ne 0 ]; then
        {
            echo "build.sh: missing Debian packages: $missing"
            echo "build.sh: install them as root, then run ./build.sh $cmd again. As root:"
            echo "    $line"
            echo "  from this account, with root's password:"
            echo "    su -c '$line'"
            if command -v sudo >/dev/null; then
                echo "  or, if you may use sudo:"
                echo "    sudo sh -c '$line'"
            fi
        } >&2
        exit 1
    fi
    echo "build.sh: installing $missing"
    apt-get update || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y $missing || die "apt-get install -y $missing failed"
    missing=$(missing_deps)
    [ -z "$missing" ] || die "still missing after apt-get install: $missing"
}

# --- toolchain ---------------------------------------------------------------------------------

find_nvcc() {
    if command -v nvcc >/dev/null; then command -v nvcc
    elif [ -x /usr/local/cuda/bin/nvcc ]; then echo /usr/local/cuda/bin/nvcc
    fi
}

# The CUDA prefix (include/cuda_runtime.h, lib64/libcudart.so) of the nvcc that builds the
# kernels. That nvcc can be a wrapper script (/usr/local/bin/nvcc), so its directory says
# nothing: the TOP that nvcc itself reports, else CUDA_HOME or CUDA_PATH when they hold the
# headers (a stale CUDA_HOME must not pair one toolkit's nvcc with another's headers), else
# the usual places.
cuda_home() {
    local nvcc=$1 d top
    top=$("$nvcc" --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
    if [ -n "$top" ] && [ -f "$top/include/cuda_runtime.h" ]; then
        (cd "$top" && pwd -P); return
    fi
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/lib/cuda /usr; do
        if [ -f "$d/include/cuda_runtime.h" ]; then echo "$d"; return; fi
    done
    dirname "$(dirname "$nvcc")"
}

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

# CUDA 13 dropped the pre-Turing archs. With a GPU, build for it; without, sm_90 (H100) if this
# nvcc knows it, else the oldest arch it lists.
cuda_arch() {
    local nvcc=$1
    if [ -n "${DT_CUDA_ARCH:-}" ]; then echo "$DT_CUDA_ARCH"; return; fi
    if have_gpu; then echo native; return; fi
    local archs
    archs=$("$nvcc" --list-gpu-arch 2>/dev/null | tr '\n' ' ')
    case " $archs " in
        *" compute_90 "*|"  ") echo sm_90 ;;
        *) set -- $archs; echo "sm_${1#compute_}" ;;
    esac
}

# Sets and exports every DT_* setting the build and tests/run.sh use.
setup_toolchain() {
    DT_CC=${CC:-gcc}
    DT_CXX=${CXX:-g++}
    DT_MPICC=$(command -v mpicc || true)
    DT_CFLAGS="-std=c99 -O2 -g -Wall -Wextra -Werror"
    DT_CPPFLAGS="-I$ROOT -DDT_CBLAS $(blas_cflags)"
    DT_LIBS="$(blas_libs) -lm"
    DT_NVCC=$(find_nvcc)
    DT_CUDA_HOME=''
    DT_CUDA_ARCH=''
    DT_CUDA_LDFLAGS=''
    DT_NCCL_DEFS=''
    DT_NCCL_LIBS=''
    DT_NVCC_FLAGS=''
    if [ -n "$DT_NVCC" ]; then
        DT_CUDA_HOME=$(cuda_home "$DT_NVCC")
        DT_CUDA_ARCH=$(cuda_arch "$DT_NVCC")
        # kernels/*.cu: machine code for A100 (sm_80, which also runs on sm_86/89) and H100 (sm_90),
        # PTX for newer GPUs to JIT, no warnings; DT_CUDA_ARCH adds its own when it is another sm_
        DT_NVCC_FLAGS="-O2 -Werror all-warnings -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"
        DT_NVCC_FLAGS+=" -gencode arch=compute_90,code=compute_90"
        case $DT_CUDA_ARCH in
            sm_80 | sm_90 | native | '') ;;
            sm_*) DT_NVCC_FLAGS+=" -gencode arch=compute_${DT_CUDA_ARCH#sm_},code=$DT_CUDA_ARCH" ;;
        esac
        # the runtime and cuBLAS live in lib64/, NCCL (in the CUDA 13 images) in lib/
        DT_CUDA_LDFLAGS="-L$DT_CUDA_HOME/lib64 -L$DT_CUDA_HOME/lib -Wl,-rpath,$DT_CUDA_HOME/lib64 -Wl,-rpath,$DT_CUDA_HOME/lib"
        # NCCL is optional: without it dt_comm.h stages device buffers through host memory
        if [ -f "$DT_CUDA_HOME/include/nccl.h" ] || [ -f /usr/include/nccl.h ]; then
            DT_NCCL_DEFS=-DDT_NCCL
            DT_NCCL_LIBS=-lnccl
        fi
    fi
    DT_HAVE_GPU=0
    if have_gpu; then DT_HAVE_GPU=1; fi
    export DT_CC DT_CXX DT_MPICC DT_CFLAGS DT_CPPFLAGS DT_LIBS DT_NVCC DT_CUDA_HOME DT_CUDA_ARCH DT_CUDA_LDFLAGS \
        DT_NVCC_FLAGS DT_NCCL_DEFS DT_NCCL_LIBS DT_HAVE_GPU

    # mpirun in containers and CI: root needs explicit consent; 4 ranks on 2 cores need
    # oversubscription; single-copy (CMA) needs ptrace rights containers often deny
    # ("Read -1, expected ..., errno = 1"); without ssh/rsh, mpirun refuses to start even for
    # local ranks unless told that everything is local (plm=isolated).
    export DT_MPIRUN="mpirun --oversubscribe"
    if [ "$(id -u)" -eq 0 ]; then
        DT_MPIRUN+=" --allow-run-as-root"
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
    export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
    if ! command -v ssh >/dev/null && ! command -v rsh >/dev/null; then
        export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
    fi
}

print_env() {
    local v
    for v in DT_CC DT_CXX DT_MPICC DT_CFLAGS DT_CPPFLAGS DT_LIBS DT_NVCC DT_CUDA_HOME DT_CUDA_ARCH \
             DT_CUDA_LDFLAGS DT_NVCC_FLAGS DT_NCCL_DEFS DT_NCCL_LIBS DT_HAVE_GPU DT_MPIRUN $(compgen -e | grep -E '^OMPI_' || true); do
        printf 'export %s=%q\n' "$v" "${!v}"
    done
}

# --- building ----------------------------------------------------------------------------------

# True when $1 exists and is newer than every other argument (that exists).
up_to_date() {
    local out=$1 dep; shift
    [ -e "$out" ] || return 1
    for dep in "$@"; do [ "$dep" -nt "$out" ] && return 1; done
    return 0
}

# A program that talks MPI (through dt_comm.h or directly) is built with mpicc -DDT_MPI.
uses_mpi() { grep -qE '#[[:space:]]*include[[:space:]]*[<"]([^">]*/)?(dt_comm\.h|mpi\.h)[">]' "$1"; }

# build_program SRC OUT: one C file, which includes the dt implementations it needs, into a
# program. Its log goes to build/logs/; on failure, prints the log and returns 1.
build_program() {
    local src=$1 out=$2 log
    log=build/logs/$(echo "${out#build/}" | tr / _).log
    up_to_date "$out" "$src" "$(dirname "$src")"/*.h "$(dirname "$src")"/*.inc dt_*.h kernels/dt_kernels.h build.sh && return 0
    local cc=$DT_CC defs=
    if uses_mpi "$src"; then cc=$DT_MPICC defs=-DDT_MPI; fi
    mkdir -p "$(dirname "$out")"
    if ! $cc $DT_CFLAGS $DT_CPPFLAGS $defs -I"$(dirname "$src")" "$src" -o "$out" $DT_LIBS >"$log" 2>&1; then
        echo "FAILED $src -> $out (log: $log)"
        head -n 40 "$log"
        rm -f "$out"
        return 1
    fi
    echo "built $out"
}

# build_cuda_program SRC OUT: the same program built with -DDT_CUDA (and -DDT_NCCL when it talks
# MPI and NCCL is installed), linked with the kernels, the CUDA runtime, cuBLAS and NCCL: proves the CUDA build of
# every example links, on machines without a GPU too. Log and failure as build_program.
build_cuda_program() {
    local src=$1 out=$2 log
    log=build/logs/$(echo "${out#build/}" | tr / _).log
    up_to_date "$out" "$src" "$(dirname "$src")"/*.h "$(dirname "$src")"/*.inc dt_*.h kernels/*.h build/kernels/libdt_kernels.a build.sh && return 0
    local cc=$DT_CC defs=-DDT_CUDA libs="-lcublasLt -lcublas -lcudart" kernels_lib=
    [ -f build/kernels/libdt_kernels.a ] && kernels_lib=build/kernels/libdt_kernels.a
    if uses_mpi "$src"; then cc=$DT_MPICC defs+=" -DDT_MPI $DT_NCCL_DEFS" libs+=" $DT_NCCL_LIBS"; fi
    mkdir -p "$(dirname "$out")"
    if ! $cc $DT_CFLAGS $DT_CPPFLAGS $defs -I"$DT_CUDA_HOME/include" -I"$ROOT/kernels" -I"$(dirname "$src")" \
        "$src" $kernels_lib -o "$out" $DT_CUDA_LDFLAGS $libs -lstdc++ $DT_LIBS >"$log" 2>&1; then
        echo "FAILED $src -> $out (CUDA build; log: $log)"
        head -n 40 "$log"
        rm -f "$out"
        return 1
    fi
    echo "built $out"
}

# build/kernels/*.o and build/kernels/libdt_kernels.a from kernels/*.cu, when nvcc exists.
# build_kernel CU OBJ: one nvcc compile; its log, and its failure shown, as build_program's.
build_kernel() {
    local cu=$1 obj=$2 log
    log=build/logs/kernel_$(basename "$cu").log
    if "$DT_NVCC" -c $DT_NVCC_FLAGS -I"$ROOT" -I"$ROOT/kernels" "$cu" -o "$obj" >"$log" 2>&1; then
        echo "built $obj"
    else
        echo "FAILED $cu (log: $log)"
        head -n 40 "$log"
        rm -f "$obj"
        return 1
    fi
}

# The cores, for how many compilers run at once: nproc alone reads OMP_NUM_THREADS (a user's
# OMP_NUM_THREADS=1 made every build one compiler at a time).
cores() { OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc 2>/dev/null || echo 2; }

# Every kernels/*.cu, nproc at a time (nvcc runs one file on one core for tens of seconds).
build_kernels() {
    local cu obj ok=0 objs=() max_jobs failed=build/logs/kernels_failed
    max_jobs=$(cores)
    mkdir -p build/kernels build/logs
    rm -f "$failed"
    for cu in kernels/*.cu; do
        obj=build/kernels/$(basename "${cu%.cu}").o
        objs+=("$obj")
        up_to_date "$obj" "$cu" kernels/*.h kernels/*.cuh dt_*.h build.sh && continue
        while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do wait -n || true; done
        { build_kernel "$cu" "$obj" || echo "$cu" >>"$failed"; } &
    done
    wait
    [ -f "$failed" ] && ok=1
    if [ $ok -eq 0 ] && [ ${#objs[@]} -gt 0 ]; then
        rm -f build/kernels/libdt_kernels.a
        ar rcs build/kernels/libdt_kernels.a "${objs[@]}"
    fi
    return $ok
}

# build/examples/emu/<name>: the examples with a CUDA path (gpt, dlrm, mlp) built against the CPU
# emulator (tests/cuda_emu: the kernels compiled by g++, a fake CUDA runtime and a fake NCCL over
# MPI), so their --device cuda runs here without a GPU, under mpirun too; tests/cuda_counters.sh
# checks what their steps ask of the "device". The objects and commands are tests/run.sh's
# (tests/cuda_emu/emu_build.sh). Names each program that fails in $failed_list.
build_emu_examples() {
    local failed_list=$1 src name out log max_jobs
    max_jobs=$(cores)
    # shellcheck source=tests/cuda_emu/emu_build.sh
    source tests/cuda_emu/emu_build.sh
    if ! emu_objects; then
        for src in examples/*/*.c; do
            grep -q DT_CUDA "$src" && echo "examples/emu/$(basename "${src%.c}")" >>"$failed_list"
        done
        return 1
    fi
    mkdir -p build/examples/emu
    for src in examples/*/*.c; do
        grep -q DT_CUDA "$src" || continue
        name=$(basename "${src%.c}")
        out=build/examples/emu/$name
        log=build/logs/examples_emu_$name.log
        up_to_date "$out" "$src" "$(dirname "$src")"/*.h dt_*.h kernels/*.h "$E"/obj/*.o "$E"/comm/*.o build.sh \
            tests/cuda_emu/emu_build.sh && continue
        while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do wait -n || true; done
        {
            if emu_example "$src" "$out" >"$log" 2>&1; then echo "built $out"
            else echo "FAILED $src -> $out (emulator build; log: $log)"; head -n 40 "$log"; rm -f "$out"
                 echo "examples/emu/$name" >>"$failed_list"; fi
        } &
    done
    wait
}

# Builds everything, as many compilers at a time as there are cores. The programs that failed
# to build are listed in BUILD_FAILED (tests/run.sh reports each as a failure).
BUILD_FAILED=
build_all() {
    local max_jobs src name failed_list=build/logs/failed.list quick=${1:-} sources=(examples/*/*.c bench/*.c)
    max_jobs=$(cores)
    mkdir -p build/logs
    rm -f "$failed_list"
    [ "$quick" = quick ] && sources=(examples/*/*.c)
    # examples/<dir>/<name>.c -> build/examples/<name> (examples/mlp/mlp.c -> build/examples/mlp)
    for src in "${sources[@]}"; do
        name=$(basename "${src%.c}")
        case "$src" in examples/*) name=examples/$name ;; bench/*) name=bench/$name ;; esac
        while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do wait -n || true; done
        { build_program "$src" "build/$name" || echo "$name" >>"$failed_list"; } &
    done
    wait
    [ -f "$failed_list" ] && BUILD_FAILED=$(sort "$failed_list" | tr '\n' ' ' | sed 's/ $//')

    local kernels_ok=0
    if [ "$quick" != quick ]; then
        build_emu_examples "$failed_list" || true
        [ -f "$failed_list" ] && BUILD_FAILED=$(sort "$failed_list" | tr '\n' ' ' | sed 's/ $//')
    fi
    if [ "$quick" = quick ]; then
        :
    elif [ -n "$DT_NVCC" ]; then
        build_kernels || kernels_ok=1
        # examples/<dir>/<name>.c -> build/examples/cuda/<name>, -DDT_CUDA (they run on a GPU
        # when one is present and their code asks for it; the CPU path is the same program). Only
        # the examples with a CUDA path (their code names DT_CUDA: gpt, dlrm, mlp): built with
        # -DDT_CUDA, the others (examples/tutorial) would be their CPU program again.
        for src in examples/*/*.c; do
            grep -q DT_CUDA "$src" || continue
            name=$(basename "${src%.c}")
            while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do wait -n || true; done
            { build_cuda_program "$src" "build/examples/cuda/$name" || echo "examples/cuda/$name" >>"$failed_list"; } &
        done
        wait
        [ -f "$failed_list" ] && BUILD_FAILED=$(sort "$failed_list" | tr '\n' ' ' | sed 's/ $//')
    else
        echo "nvcc not found: CUDA parts skipped"
    fi
    [ -z "$BUILD_FAILED" ] && [ $kernels_ok -eq 0 ]
}

# --- commands ----------------------------------------------------------------------------------

run_tests() {
    # A failed build does not stop the tests: the runner counts each program that did not build
    # (and each kernel that did not compile) as a failure, so the summary line stays the last.
    # "quick": the examples only, then tests/run.sh quick.
    local quick=${1:-}
    [ -z "$quick" ] || [ "$quick" = quick ] || die "unknown argument '$quick' to test (quick)"
    build_all $quick || true
    DT_BUILD_FAILED=$BUILD_FAILED bash tests/run.sh $quick
}

# A program that does not build is reported but does not stop the demo or the benchmarks that did.
build_what_builds() {
    build_all || echo "build.sh: build failed${BUILD_FAILED:+: $BUILD_FAILED}; going on with the rest" >&2
}

# The demo: examples/dlrm, DLRM on synthetic Criteo-shaped data, hybrid parallel on DEMO_NP ranks
# (tables bigger than 50k rows row-wise, mid ones table-wise, small ones data-parallel, as
# dt_embed's planner and the pins give them; MLPs data-parallel). First a 1-process run of the
# same training (quiet: its last line only), then the DEMO_NP-rank run in full (the plan, the
# held-out AUC rising, progress), then how far apart the two are, from the loss of every step
# (--log). The tables are exact at any world size; the dense gradients are fp32 sums taken in
# another order (rank by rank), which starts the runs ~1e-7 apart, and training then amplifies
# that like any perturbation (by 400 steps the losses of single batches differ by ~1e-3, the
# AUCs by ~1e-3). So the demo fails when the first DEMO_EXACT_STEPS steps differ by more than
# DEMO_RTOL, or the final held-out AUCs by more than DEMO_AUC_TOL. The last line is the
# parallel run's "final: loss L auc A".
DEMO=(build/examples/dlrm --steps 400 --batch 512 --rows 100000 --row-wise-over 50000 --print-every 50)
DEMO_NP=4
DEMO_EXACT_STEPS=20
DEMO_RTOL=1e-5
DEMO_AUC_TOL=0.01

final_auc() { sed -n 's/^final: loss [^ ]* auc \([^ ]*\).*/\1/p' "$1" | tail -n 1; }

# largest_rel LOG_A LOG_B N: the largest relative difference of "loss" over steps 1..N, and its step.
largest_rel() {
    awk -v n="$3" 'FNR == 1 { f++ } match($0, /"loss":[-0-9.eE+]*/) {
            v = substr($0, RSTART + 7, RLENGTH - 7) + 0; k[f]++; if (k[f] <= n) x[f, k[f]] = v }
        END { w = 0; at = 0; for (i = 1; i <= n && i <= k[1] && i <= k[2]; i++) {
                d = x[1, i] - x[2, i]; if (d < 0) d = -d; m = x[1, i] < 0 ? -x[1, i] : x[1, i];
                if (m > 0) d /= m; if (d > w) { w = d; at = i } }
              printf("%.2g %d\n", w, at) }' "$1" "$2"
}

run_demo() {
    build_what_builds
    [ -x "${DEMO[0]}" ] || die "${DEMO[0]} does not exist yet"
    local one=build/logs/demo_1 many=build/logs/demo_$DEMO_NP early late a1 an
    # one BLAS thread per rank, the same in both runs: the ranks already fill the cores of a
    # small machine, and the two runs then differ only in the number of ranks
    export OPENBLAS_NUM_THREADS=1
    echo "== ${DEMO[*]} --quiet   (1 process, the reference)"
    "${DEMO[@]}" --quiet --log "$one.jsonl" </dev/null | tee "$one.log"
    echo "== $DT_MPIRUN -np $DEMO_NP ${DEMO[*]}"
    $DT_MPIRUN -np "$DEMO_NP" "${DEMO[@]}" --log "$many.jsonl" </dev/null | tee "$many.log"
    a1=$(final_auc "$one.log"); an=$(final_auc "$many.log")
    [ -n "$a1" ] && [ -n "$an" ] || die "no \"final: loss L auc A\" line in $one.log or $many.log"
    read -r early early_at < <(largest_rel "$one.jsonl" "$many.jsonl" "$DEMO_EXACT_STEPS")
    read -r late late_at < <(largest_rel "$one.jsonl" "$many.jsonl" 1000000000)
    echo "== demo: 1 process vs $DEMO_NP ranks, the loss of every step"
    echo "  steps 1-$DEMO_EXACT_STEPS: largest relative difference $early (step $early_at): the same training up to fp32 rounding"
    echo "  whole run:  largest relative difference $late (step $late_at): that rounding, amplified by training"
    echo "  held-out AUC: 1 process $a1, $DEMO_NP ranks $an"
    awk -v r="$early" -v t="$DEMO_RTOL" 'BEGIN { exit !(r <= t) }' ||
        die "the first $DEMO_EXACT_STEPS steps differ by $early (relative), more than $DEMO_RTOL: the parallel run is not the single-process run"
    awk -v a="$a1" -v b="$an" -v t="$DEMO_AUC_TOL" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }' ||
        die "the held-out AUCs differ by more than $DEMO_AUC_TOL"
    grep '^final: ' "$many.log" | tail -n 1
}

# First-line comment "// np: N ..." in a benchmark's source: run it under mpirun -np N.
bench_ranks() { head -n 1 "$1" | sed -n 's|^//[[:space:]]*np:[[:space:]]*\([0-9]*\).*|\1|p'; }

# The benchmark peers: a venv at build/peers with bench/peers.txt (and bench/peers-nodeps.txt
# without dependencies), made once; remade when those files change. Prints the interpreter to
# run bench/*.py with: the venv's, or /usr/bin/python3 (the scripts then say what they skip).
PEERS=build/peers
peers_venv() {
    local want
    want=$(cat bench/peers.txt bench/peers-nodeps.txt | sha256sum | cut -c1-16)
    if [ "$(cat "$PEERS/.made" 2>/dev/null)" != "$want" ]; then
        echo "build.sh bench: making $PEERS (pip from PyPI: bench/peers.txt, bench/peers-nodeps.txt; once)" >&2
        rm -rf "$PEERS"
        if ! { /usr/bin/python3 -m venv "$PEERS" && "$PEERS/bin/pip" install -q -r bench/peers.txt &&
            "$PEERS/bin/pip" install -q --no-deps -r bench/peers-nodeps.txt; } >&2; then
            echo "build.sh bench: $PEERS failed (no network to PyPI?); the Python benches run with /usr/bin/python3" >&2
            rm -rf "$PEERS"
            echo /usr/bin/python3
            return
        fi
        echo "$want" >"$PEERS/.made"
    fi
    echo "$ROOT/$PEERS/bin/python"
}

run_bench() {
    build_what_builds
    local exe np failed py
    py=$(peers_venv)
    export DT_PEERS_PYTHON=$py # (bench/embed runs its torch peer with it)
    read -r -a failed <<<"$BUILD_FAILED"
    for exe in build/bench/*; do
        # only programs whose source is still there (build/ may hold old ones)
        [[ -f bench/$(basename "$exe").c && -x $exe ]] || continue
        np=$(bench_ranks "bench/$(basename "$exe").c")
        if [ -n "$np" ]; then
            echo "== $DT_MPIRUN -np $np $exe"
            OPENBLAS_NUM_THREADS=1 $DT_MPIRUN -np "$np" "$exe" </dev/null || failed+=("$exe")
        else
            echo "== $exe"
            "$exe" || failed+=("$exe")
        fi
    done
    for exe in bench/*.py; do
        echo "== $py $exe"
        OPENBLAS_NUM_THREADS=1 "$py" "$exe" || failed+=("$exe")
    done
    [ ${#failed[@]} -eq 0 ] || die "did not build or did not finish: ${failed[*]}"
}

cmd=${1:-build}
case "$cmd" in
    clean) rm -rf --one-file-system build; exit 0 ;; # never into a mount (tests/fresh_debian.sh)
    env) setup_toolchain; print_env; exit 0 ;;
    build|test|demo|bench) ;;
    # no dependency install: a GPU machine may have no network, and the script says what it lacks
    gpu) setup_toolchain; exec bash bench/gpu/run.sh "${@:2}" ;;
    -h|--help|help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown command '$cmd' (build, test, demo, bench, gpu, clean, env)" ;;
esac

check_deps
setup_toolchain
case "$cmd" in
    build) build_all || die "build failed${BUILD_FAILED:+: $BUILD_FAILED}" ;;
    test) run_tests "${2:-}" ;;
    demo) run_demo ;;
    bench) run_bench ;;
esac
