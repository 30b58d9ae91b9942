#!/usr/bin/env bash
# bench/gpu/run.sh - `./build.sh gpu`: dt's check and measurement on a machine with a GPU, in one
# command of under 8 minutes on an H100, its build included. build.sh runs it with its toolchain
# settings in the environment (./build.sh env); run by hand, it reads them itself.
#
#   ./build.sh gpu               everything below; exit 0 when every step ran and passed
#   ./build.sh gpu --build-only  only the builds (nvcc, no GPU needed), then the CPU-side checks of
#                                the shard writer; exit 0 when all of it built. tests/run.sh runs
#                                it (check "gpu:build-only") wherever nvcc is, so it cannot rot.
#                                Host C and C++ at -O0 without -g (a fifth of -O2's compile time; what
#                                it builds runs one tiny step at most, and ./build.sh compiles the
#                                same sources at -O2, where the optimizer's warnings show); kernels
#                                as on the GPU
#   ./build.sh gpu --dry-run     no build, no GPU: the summary made from made-up figures (marked
#                                as such), to check the parsing and the format
#
# Without a GPU (no nvidia-smi, nvidia-smi lists none, or the CUDA runtime cannot use it) it says
# so and exits 3 before building anything. Without nvcc: exit 4.
#
# Steps, each under its own timeout, a step skipped (and said so) when the budget is spent:
#   device   nvidia-smi (name, driver, clocks, power, PCIe), the CUDA runtime's view of the card
#            (bench/gpu/device.c: multiprocessors, memory, datasheet peaks), nvcc, date, commit
#   build    kernels/*.cu for this GPU's arch with -Xptxas -v (registers, spills: build/gpu/ptxas/);
#            the CPU and CUDA builds of examples/gpt and examples/dlrm; every emulated kernel test
#            tests/cuda_emu/k_*.cpp against the REAL CUDA runtime, cuBLAS and the kernels (the
#            emulator's own controls from bench/gpu/emu_stubs.c; k_detect tests the emulator itself
#            and k_oom fails its allocations on purpose: both left out); tests/gpu_comm.c;
#            bench/gpu/probe.cu; bench/gpu/mkshard.c
#   tests    every k_* program on the GPU; tests/gpu_comm.c at np 1 and 2
#   losses   examples/gpt and examples/dlrm, 5 steps of a small model on the CPU and with --device
#            cuda: every step's loss within 1e-5 relative (the tolerance tests/cuda_emu/k_gpt.cpp
#            and k_dlrm.cpp document for the same comparison on the emulator); gpt --dtype bf16
#            --cp 2 (ring, then Ulysses) at 2 ranks on the GPU against the CPU's bf16 run, within
#            1e-2 (tests/cuda_emu/mpi_cp_ring.cpp's path, on the hardware)
#   probe    bench/gpu/probe.cu: each memory-bound op's GB/s as a fraction of a device-to-device
#            copy, dt's GEMM against cuBLAS called directly, in the same run (CUDA events)
#   gpt2     GPT-2 124M (12 x 768, T 1024, B 8, vocab 50257, f32) on a synthetic llm.c shard:
#            tokens/s of the steps after the first two (each logging step reads the loss, so
#            the device has finished the step when its time is taken), MFU against the card's
#            dense bf16 datasheet peak (llm.c's convention: 6N + 6LTC FLOPs a token); then
#            8 steps of --dtype bf16 (GEMMs and attention on the tensor cores), then a --profile
#            run of it and its table (gpt's op timers)
#   dlrm     DLRM at MLPerf's widths, samples/s with --device cuda and on the CPU
#   llm.c    with DT_GPU_LLMC=SRC (a checkout of karpathy/llm.c, never part of dt): its
#            train_gpt2.cu built during dt's build and run at the same shape on the same shard
#            (bench/gpu/llmc.sh), the peer of the bf16 row: dt bf16 tok/s / llm.c tok/s
# Outputs in build/gpu/: summary.md (pasteable into bench/RESULTS.md), device.txt, probe.txt,
# ptxas/, logs/ (one per build and per run). Exit: 0 all passed, 1 something failed (the summary
# says what), 2 bad arguments, 3 no usable GPU, 4 no nvcc.
#
# Environment: DT_GPU_BUDGET_S (420: seconds for the whole run, build included, before steps are
# skipped), DT_GPU_BUILD_TIMEOUT (240; --build-only 1500), DT_GPU_JOBS (compilers at a time, nproc), DT_GPU_ARCH
# (sm_XY to build for; default: the GPU's, else sm_90), DT_GPU_LOSS_RTOL (1e-5), DT_GPU_LLMC (above), DT_GPU_PRETEND=1
# (for testing this script where there is no GPU: it goes on as if there were one, and every
# step that needs the GPU fails, so the failure paths and their summary can be read).
# Flag variables (DT_CFLAGS...) are word lists, expanded unquoted on purpose.
# shellcheck disable=SC2086,SC2054
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
ROOT=$PWD
START=$SECONDS

MODE=run
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
for a in "$@"; do
    case $a in
        --build-only) MODE=build ;;
        --dry-run) MODE=dry ;;
        -h | --help) usage; exit 0 ;;
        *) echo "build.sh gpu: unknown argument '$a' (expected --build-only, --dry-run or nothing)" >&2; exit 2 ;;
    esac
done

G=build/gpu        # everything this script builds and writes
L=$G/logs
mkdir -p "$L" "$G/obj" "$G/kernels" "$G/ptxas" "$G/k"
BUDGET=${DT_GPU_BUDGET_S:-420}
RTOL=${DT_GPU_LOSS_RTOL:-1e-5}
RES=$G/results.txt # KEY<TAB>VALUE lines: what the summary is made from
FAILS=()

say() { echo "$*"; }
fail() { FAILS+=("$1"); echo "FAILED $1${2:+: $2}"; }
res() { printf '%s\t%s\n' "$1" "$2" >>"$RES"; }
get() { awk -F'\t' -v k="$1" '$1 == k { v = $2 } END { print v }' "$RES" 2>/dev/null; }
left() { echo $((BUDGET - (SECONDS - START))); }
# lim N: a timeout of N seconds, cut to what the budget has left (at least 10)
lim() { local l; l=$(left); if [ "$l" -lt "$1" ]; then echo $((l > 10 ? l : 10)); else echo "$1"; fi; }
# phase NAME SECONDS: 0 when the budget still has that much, else records the skip
phase() {
    local l; l=$(left)
    if [ "$l" -lt "$2" ]; then
        res "skip:$1" "$l s of the budget left, the step wants $2"
        FAILS+=("skipped:${1// /_}")
        echo "== $1: SKIPPED ($l s left)"
        return 1
    fi
    echo "== $1 ($l s left of ${BUDGET})"
}

# ---------------------------------------------------------------- parsing (also run by --dry-run)

# reldiff A.jsonl B.jsonl N: the largest relative difference of "loss" over the first N steps of
# both, "<diff> <at step> <steps compared>"
reldiff() {
    awk -v n="$3" 'FNR == 1 { f++ } match($0, /"loss":[-+0-9.eEnaif]*/) { v = substr($0, RSTART + 7, RLENGTH - 7);
            k[f]++; if (k[f] <= n) x[f, k[f]] = v }
        END { w = 0; at = 0; m = k[1] < k[2] ? k[1] : k[2]; if (m > n) m = n;
              for (i = 1; i <= m; i++) { a = x[1, i] + 0; b = x[2, i] + 0;
                  if (x[1, i] !~ /^[-+0-9.eE]+$/ || x[2, i] !~ /^[-+0-9.eE]+$/) { w = "nan"; at = i; break }
                  d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; if (s > 0) d /= s; if (d > w) { w = d; at = i } }
              if (w == "nan") printf("nan %d %d\n", at, m); else printf("%.3g %d %d\n", w, at, m) }' "$1" "$2"
}

# steady LOG.jsonl FIELD SKIP UNITS_PER_STEP: the rate of the steps after the first SKIP, from a
# log whose FIELD is the cumulative rate since the first step (units done / seconds since it), as
# gpt's tokens_per_s and dlrm's samples_per_s are: step k ended at k * UNITS / rate_k seconds.
steady() {
    awk -v f="\"$2\":" -v skip="$3" -v u="$4" '{
            if (!match($0, /"step":[0-9]+/)) next; s = substr($0, RSTART + 7, RLENGTH - 7) + 0
            if (!match($0, f "[0-9.eE+]+")) next; r = substr($0, RSTART + length(f), RLENGTH - length(f)) + 0
            if (n == 0) first = s; n++; k = s - first + 1; if (r > 0) t[k] = k * u / r; last = k }
        END { if (n == 0 || last <= skip || !(skip in t) && skip > 0) { print ""; exit }
              t0 = skip > 0 ? t[skip] : 0; if (t[last] > t0) printf("%.1f\n", (last - skip) * u / (t[last] - t0)) }' "$1"
}

# mfu TOKENS_PER_S PEAK_TFLOPS: % of the peak at llm.c's FLOPs per token for GPT-2 124M:
# 6 N (N = 124,475,904 parameters, padded vocab) + 6 L T C (attention), forward and backward
mfu() { awk -v t="$1" -v p="$2" 'BEGIN { if (t == "" || p + 0 <= 0) exit; f = 6 * 124475904 + 6 * 12 * 1024 * 768; printf("%.2f", 100 * t * f / (p * 1e12)) }'; }

# counts LOG: "<PASS lines> <FAIL lines> <SKIP lines>"
counts() { awk '/^PASS /{p++} /^FAIL /{f++} /^SKIP /{s++} END {printf("%d %d %d\n", p, f, s)}' "$1" 2>/dev/null || echo "0 0 0"; }

# ---------------------------------------------------------------- the summary

summary() {
    local S=$G/summary.md fake=${1:-} d=$G/device.txt p=$G/probe.txt
    dv() { sed -n "s/^$1: //p" "$d" 2>/dev/null | head -n 1; }
    {
        [ -n "$fake" ] && echo "> DRY RUN: every figure below is made up (./build.sh gpu --dry-run checks the format only)." && echo
        echo "### \`./build.sh gpu\` on $(dv name) ($(get date))"
        echo
        echo "Command: \`./build.sh gpu\` at commit $(get commit), $(get total_s) s in all (build $(get build_s) s); exit $(get exit)."
        echo "Device: $(dv name), $(dv arch), $(dv multiprocessors) SMs, $(dv memory_gib) GiB, L2 $(dv l2_mib) MiB, max clocks SM $(dv sm_clock_max_mhz) /" \
            "memory $(dv mem_clock_max_mhz) MHz; driver $(sed -n 's/^driver_version: //p' "$d" | head -n 1), CUDA runtime $(dv cuda_runtime)," \
            "nvcc $(get nvcc); host $(get host_cores) cores. Peaks used (dense, datasheet): bf16 $(dv peak_bf16_tflops), fp32 $(dv peak_fp32_tflops) TFLOP/s."
        echo
        echo "| check | result |"
        echo "|---|---|"
        echo "| build: kernels ($(get arch), -Xptxas -v), examples, k_* tests, gpu_comm, probe | $(get build) |"
        echo "| ptxas | $(get ptxas) |"
        [ -n "$(get notes)" ] && echo "| this machine | $(get notes) |"
        echo "| tests/cuda_emu/k_*.cpp on the GPU | $(get k_tests) |"
        echo "| tests/gpu_comm.c np 1 / np 2 | $(get gpu_comm_np1) / $(get gpu_comm_np2) |"
        echo "| examples/gpt cpu vs cuda, loss per step (rtol $RTOL) | $(get gpt_losses) |"
        echo "| examples/dlrm cpu vs cuda, loss per step (rtol $RTOL) | $(get dlrm_losses) |"
        echo "| examples/gpt bf16 cp 2 ring / Ulysses at np 2 vs the CPU's bf16, loss per step (rtol 1e-2) | $(get gpt_cp_ring_losses) / $(get gpt_cp_ulysses_losses) |"
        local k
        awk -F'\t' '$1 ~ /^skip:/ { print substr($1, 6) }' "$RES" | while IFS= read -r k; do
            echo "| $k | **skipped**: $(get "skip:$k") |"
        done
        echo
        if [ -s "$p" ] && grep -q '^copy' "$p"; then
            echo "Kernel probe (bench/gpu/probe.cu, GPT-2 124M shapes, B 8 T 1024; CUDA events, median): device-to-device copy" \
                "$(awk -F'\t' '$1 == "copy" { printf("%.0f GB/s", $3) }' "$p") (read + write), the reference of every ratio."
            echo
            echo "| memory-bound op | ms | GB/s | / copy | >= 0.7 |"
            echo "|---|---|---|---|---|"
            awk -F'\t' '$1 == "bw" { printf("| %s | %.3f | %.0f | %.2f | %s |\n", $2, $3, $4, $5, $5 >= 0.7 ? "met" : "**not met**") }' "$p"
            echo
            echo "| GEMM (M x N x K) | dt TFLOP/s | cuBLAS TFLOP/s | cuBLAS time / dt time | >= 0.97 (f32) | max diff |"
            echo "|---|---|---|---|---|---|"
            awk -F'\t' '$1 == "gemm" { t = $2 ~ /^f32/ ? ($8 >= 0.97 ? "met" : "**not met**") : "-";
                printf("| %s (%s) | %.1f | %.1f | %.3f | %s | %s |\n", $2, $3, $5, $7, $8, t, $9) }' "$p"
            awk -F'\t' '$1 == "flops" { printf("\n%s: %.3f ms, %.1f TFLOP/s%s", $2, $3, $4, $2 ~ /^attention/ ? " (causal FLOPs)" : "") }
                       END { print "" }' "$p"
            awk -F'\t' '$1 == "fail" || $1 == "skip" { printf("- probe %s: %s %s\n", $1, $2, $3) }' "$p"
            echo
        else
            echo "Kernel probe: $(get probe)"
            echo
        fi
        echo "| end to end | figure |"
        echo "|---|---|"
        local tps m
        tps=$(get gpt2_tok_s)
        m=$(mfu "$tps" "$(dv peak_bf16_tflops)")
        # or() A B: A when it is not empty, else B
        or() { if [ -n "$1" ]; then echo "$1"; else echo "$2"; fi; }
        echo "| GPT-2 124M, f32, B 8, T 1024, --device cuda | $(or "${tps:+$tps tok/s, MFU ${m:-?}% of $(dv peak_bf16_tflops) TFLOP/s bf16 dense (llm.c, bf16: ~460k tok/s on one H100)}" "$(get gpt2)") |"
        echo "| GPT-2 124M step losses | $(get gpt2_losses) |"
        tps=$(get gpt2_bf16_tok_s)
        m=$(mfu "$tps" "$(dv peak_bf16_tflops)")
        echo "| GPT-2 124M, --dtype bf16 (GEMMs and attention on the tensor cores, bf16 activations) | $(or "${tps:+$tps tok/s, MFU ${m:-?}%}" "$(get gpt2_bf16)") |"
        echo "| GPT-2 124M bf16 step losses | $(get gpt2_bf16_losses) |"
        echo "| the planner on this GPU (gpt --plan: dt_plan_machine_measure, the layout above predicted) | $(or "$(get plan_gpt2_bf16)" "not run") |"
        local lc
        lc=$(get llmc_tok_s)
        echo "| llm.c train_gpt2.cu (bf16, B 8, T 1024, the same shard; DT_GPU_LLMC) | $(or "${lc:+$lc tok/s, MFU $(mfu "$lc" "$(dv peak_bf16_tflops)")%}" "$(or "$(get llmc)" "not run (DT_GPU_LLMC unset)")") |"
        [ -n "$lc" ] && [ -n "$tps" ] && echo "| dt bf16 / llm.c (target >= 0.9) | $(awk -v a="$tps" -v b="$lc" 'BEGIN { printf("%.2f", a / b) }') |"
        local sg sc
        sg=$(get dlrm_cuda_sps) sc=$(get dlrm_cpu_sps)
        echo "| DLRM (MLPerf widths, B 4096, 26 tables x 100k rows, dim 128), --device cuda | $(or "${sg:+$sg samples/s}" "$(get dlrm_cuda)") |"
        echo "| the same on the CPU ($(get host_cores) cores) | $(or "${sc:+$sc samples/s}" "$(get dlrm_cpu)") |"
        [ -n "$sg" ] && [ -n "$sc" ] && echo "| DLRM cuda / cpu | $(awk -v a="$sg" -v b="$sc" 'BEGIN { printf("%.1fx", a / b) }') |"
        echo
        if [ -s "$G/profile.txt" ]; then
            echo "gpt --profile (GPT-2 124M --dtype bf16, rank 0, ms per step):"
            echo
            echo '```'
            cat "$G/profile.txt"
            echo '```'
            echo
        fi
        if [ ${#FAILS[@]} -gt 0 ]; then echo "Failed: ${FAILS[*]} (logs: build/gpu/logs/)."; else echo "Every step passed."; fi
    } >"$S"
    echo "== summary: $S"
    cat "$S"
}

# ---------------------------------------------------------------- dry run: made-up figures

if [ "$MODE" = dry ]; then
    G=$G/dry L=$G/logs RES=$G/results.txt
    mkdir -p "$L"
    : >"$RES"
    rm -f "$L/a.jsonl" "$L/b.jsonl"
    printf '%s\n' "name: FAKE GPU H100 80GB HBM3" "arch: sm_90" "multiprocessors: 132" "memory_gib: 79.1" "l2_mib: 50.0" \
        "sm_clock_max_mhz: 1980" "mem_clock_max_mhz: 2619" "cuda_runtime: 13.0" "driver_version: 000.00" \
        "peak_bf16_tflops: 989" "peak_fp32_tflops: 67" >"$G/device.txt"
    printf 'copy\t0.7000\t3067.0\nbw\tgelu_fwd [N,4C]\t0.1000\t2013.3\t0.656\nbw\tlayernorm_fwd [N,C]\t0.0100\t2516.6\t0.821\n' >"$G/probe.txt"
    printf 'gemm\tf32 fc fwd [N,C]x[C,4C]\t8192x3072x768\t1.0000\t38.65\t0.9800\t39.44\t0.980\t0\n' >>"$G/probe.txt"
    printf 'gemm\ttf32 fc fwd [N,C]x[C,4C]\t8192x3072x768\t0.2000\t193.27\t0.1000\t386.55\t0.500\t1e-06\n' >>"$G/probe.txt"
    printf 'flops\tattention_fwd flash\t2.0000\t17.20\nskip\tadamw dt_opt_step 124M\tbudget\n' >>"$G/probe.txt"
    printf 'flops\tattention_fwd tensor cores bf16\t0.5000\t200.00\nflops\tcublas bf16 gemm [N,C]x[C,4C] (f32 out)\t0.2000\t600.00\n' \
        >>"$G/probe.txt"
    # two runs whose losses differ by 1e-6 at most (at step 3), and cumulative rates as gpt and dlrm log them:
    # the first step takes 10 s, the next ones 0.5 s each (16384 tokens: 32768 tok/s steady)
    for k in 1 2 3 4 5 6; do
        el=$(awk -v k="$k" 'BEGIN { print 10 + 0.5 * (k - 1) }')
        printf '{"step":%d,"loss":%s,"tokens_per_s":%s}\n' "$k" "$(awk -v k="$k" 'BEGIN { printf("%.9g", 11 - k / 10) }')" \
            "$(awk -v k="$k" -v e="$el" 'BEGIN { printf("%.6f", k * 16384 / e) }')" >>"$L/a.jsonl"
        printf '{"step":%d,"loss":%s,"tokens_per_s":1}\n' "$k" "$(awk -v k="$k" 'BEGIN { printf("%.9g", k == 3 ? 10.7000107 : 11 - k / 10) }')" >>"$L/b.jsonl"
    done
    read -r rd at n < <(reldiff "$L/a.jsonl" "$L/b.jsonl" 5)
    res date "$(date -u +%Y-%m-%dT%H:%MZ)"
    res commit "$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    res host_cores "$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc)"
    res nvcc 13.0
    res arch sm_90
    res build "ok (fake)"
    res ptxas "0 spills (fake)"
    res k_tests "17 programs: 16 passed, 1 failed (fake)"
    res gpu_comm_np1 "PASS, 53 checks (fake)"
    res gpu_comm_np2 "PASS, 59 checks (fake)"
    res gpt_losses "largest relative difference $rd at step $at of $n: $(awk -v r="$rd" -v t="$RTOL" 'BEGIN { print (r <= t ? "PASS" : "FAIL") }')"
    res dlrm_losses "largest relative difference 0 at step 0 of 5: PASS (fake)"
    res gpt_cp_ring_losses "PASS: largest relative difference 0.003 (step 5 of 5) (fake)"
    res gpt_cp_ulysses_losses "PASS: largest relative difference 0.003 (step 5 of 5) (fake)"
    res gpt2_tok_s "$(steady "$L/a.jsonl" tokens_per_s 2 16384)"
    res gpt2_losses "10.9 10.8 10.7 (fake)"
    res gpt2_bf16_tok_s 40000.0
    res gpt2_bf16_losses "10.9 10.8 10.7 (fake)"
    res llmc_tok_s 400000
    res dlrm_cuda_sps 1000000.0
    res dlrm_cpu_sps 50000.0
    res skip:llm.c "not part of this script (fake)"
    res build_s 100
    res total_s 400
    res exit 0
    printf '  fake op                           100.000  100.0%%  (1 calls)\n' >"$G/profile.txt"
    summary fake
    # the parsing itself, checked on the made-up logs: steady rate 32768 tok/s (steps 3-6 took
    # 0.5 s each), MFU 2.66% (32768 x 803478528 FLOPs / 989 TFLOP/s), 1e-6 at step 3
    want_tps=32768.0 got_tps=$(get gpt2_tok_s) got_mfu=$(mfu 32768 989)
    if [ "$got_tps" = "$want_tps" ] && [ "$rd" = 1e-06 ] && [ "$at" = 3 ] && [ "$got_mfu" = 2.66 ]; then
        echo "dry run: parsing checked (steady rate $got_tps tok/s, loss difference $rd at step $at, MFU $got_mfu%)"
        exit 0
    fi
    echo "dry run: parsing is wrong: steady $got_tps (want $want_tps), loss difference $rd at $at (want 1e-06 at 3), MFU $got_mfu (want 2.66)"
    exit 1
fi

# ---------------------------------------------------------------- device (seconds, before any build)

: >"$RES"
have_smi=0
if command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then have_smi=1; fi
PRETEND=${DT_GPU_PRETEND:-0}
if [ "$MODE" = run ] && [ $have_smi = 0 ] && [ "$PRETEND" != 1 ]; then
    if command -v nvidia-smi >/dev/null; then
        echo "build.sh gpu: no GPU here: nvidia-smi lists none ($(timeout 30 nvidia-smi -L 2>&1 | head -n 1)). Nothing was run;" \
            "./build.sh gpu --build-only checks the builds without one."
    else
        echo "build.sh gpu: no GPU here: nvidia-smi is not installed. Nothing was run; ./build.sh gpu --build-only checks the builds without one."
    fi
    exit 3
fi
if [ -z "${DT_CFLAGS:-}" ]; then # run by hand: build.sh's settings, the one place they are chosen
    settings=$(bash ./build.sh env) || { echo "build.sh gpu: ./build.sh env failed" >&2; exit 4; }
    eval "$settings"
fi
if [ -z "${DT_NVCC:-}" ]; then
    echo "build.sh gpu: nvcc not found (PATH, /usr/local/cuda/bin): nothing can be built for the GPU"
    exit 4
fi
CUDA_INC=-I$DT_CUDA_HOME/include
K_OPT=-O1 # the k_* tests' C++
if [ "$MODE" = build ]; then # only compiled and linked (above): -O0, no debug info
    DT_CFLAGS=$(echo " $DT_CFLAGS " | sed 's/ -O[0-3s] / -O0 /; s/ -g / /; s/^ //; s/ $//')
    K_OPT=-O0
fi
# A GPU machine is often a CUDA image without Debian's packages and without a network (build.sh
# gpu installs nothing): what is missing is worked around where dt allows it, and said.
NOTES=()
if ! printf '#include <cblas.h>\nint main(void){cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,0,0,0,1.f,0,1,0,1,0.f,0,1);return 0;}\n' |
    $DT_CC $DT_CPPFLAGS -x c - -o "$G/obj/cblas_probe" $DT_LIBS >/dev/null 2>&1; then
    DT_CPPFLAGS=$(echo " $DT_CPPFLAGS " | sed 's/ -DDT_CBLAS / /') DT_LIBS=$(echo " $DT_LIBS " | sed 's/ -lopenblas / /')
    NOTES+=("no OpenBLAS: dt's portable CPU GEMM (CPU figures are slower than with a BLAS)")
fi
# stb_ds.h (dt_embed.h: examples/dlrm, the k tests that link every implementation, the probe):
# --build-only keeps a copy in build/gpu/inc/, which a GPU machine without libstb-dev can be given
mkdir -p "$G/inc/stb"
if [ -f /usr/include/stb/stb_ds.h ]; then
    cmp -s /usr/include/stb/stb_ds.h "$G/inc/stb/stb_ds.h" || cp /usr/include/stb/stb_ds.h "$G/inc/stb/stb_ds.h"
elif [ -f "$G/inc/stb/stb_ds.h" ]; then
    DT_CPPFLAGS+=" -I$ROOT/$G/inc"
    NOTES+=("no libstb-dev: stb_ds.h from build/gpu/inc/")
else
    NOTES+=("no stb_ds.h (Debian libstb-dev, or a copy in build/gpu/inc/stb/): dt_embed.h, examples/dlrm, the k tests and the probe do not build")
fi
[ -n "${DT_MPICC:-}" ] && command -v mpirun >/dev/null || NOTES+=("no MPI (mpicc, mpirun): the examples and gpu_comm as one process, gpu_comm np 2 skipped")
export DT_CPPFLAGS DT_LIBS
for n in "${NOTES[@]}"; do echo "note: $n"; done
res date "$(date -u +%Y-%m-%dT%H:%MZ)"
res commit "$(git rev-parse --short HEAD 2>/dev/null || echo '?') ($(git status --porcelain 2>/dev/null | wc -l) files changed)"
res host_cores "$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc)"
res nvcc "$("$DT_NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
ARCH=sm_90 # --build-only: H100's, or build.sh's choice when it named one
case ${DT_CUDA_ARCH:-} in sm_*) ARCH=$DT_CUDA_ARCH ;; esac
ARCH=${DT_GPU_ARCH:-$ARCH}
if [ "$MODE" = run ]; then
    # the runtime's view, built in a second: a driver older than the toolkit fails here, not later
    "$DT_CC" -std=c99 -O2 $CUDA_INC bench/gpu/device.c -o "$G/device" $DT_CUDA_LDFLAGS -lcudart >"$L/device_build.log" 2>&1 ||
        { echo "build.sh gpu: bench/gpu/device.c does not build ($L/device_build.log)"; cat "$L/device_build.log"; exit 4; }
    timeout 60 "$G/device" >"$G/device.txt" 2>&1
    rc=$?
    [ "$PRETEND" = 1 ] && rc=0 && echo "name: none (DT_GPU_PRETEND=1)" >>"$G/device.txt"
    if [ $rc -ne 0 ]; then
        echo "build.sh gpu: nvidia-smi lists a GPU, but the CUDA runtime cannot use it: $(head -n 1 "$G/device.txt"). Nothing was run."
        exit 3
    fi
    { nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,pcie.link.gen.current,pcie.link.width.current,temperature.gpu \
          --format=csv,noheader 2>/dev/null | head -n 1 | awk -F', ' '{ printf("driver_version: %s\nsmi_clocks: SM %s (max %s), memory %s (max %s)\npower_limit: %s\npcie: gen %s x%s\ntemperature: %s C\n", $1, $2, $3, $4, $5, $6, $7, $8, $9) }'
      nvidia-smi -L 2>/dev/null | sed 's/^/smi: /'; } >>"$G/device.txt"
    [ -n "${DT_GPU_ARCH:-}" ] || ARCH=$(sed -n 's/^arch: //p' "$G/device.txt" | grep . || echo "$ARCH")
    echo "== device"
    cat "$G/device.txt"
fi
res arch "$ARCH"
[ ${#NOTES[@]} -eq 0 ] || res notes "$(printf '%s; ' "${NOTES[@]}")"
NVCC_FLAGS="-O2 -Werror all-warnings -gencode arch=compute_${ARCH#sm_},code=$ARCH"
JOBS=${DT_GPU_JOBS:-$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc 2>/dev/null || echo 2)} # (nproc reads OMP_NUM_THREADS: 1 under tests/run.sh)
HAVE_MPI=0
if [ -n "${DT_MPICC:-}" ] && command -v mpirun >/dev/null; then HAVE_MPI=1; fi

# ---------------------------------------------------------------- build

# fresh OUT DEP...: OUT was made by a command that finished (OUT.ok, written after it) since
# every DEP and every shared input last changed (a second call on a warm machine, or ./build.sh
# test after ./build.sh gpu, rebuilds only what changed; a compile the timeout cut is redone)
INPUTS=(dt_*.h kernels/*.h kernels/*.cuh "$G/flags.txt")
# the settings every command uses: a change (another arch, no OpenBLAS here) rebuilds everything
echo "$ARCH|$NVCC_FLAGS|$K_OPT|$DT_CC|$DT_CXX|$DT_CFLAGS|$DT_CPPFLAGS|$DT_LIBS|$DT_CUDA_LDFLAGS|$HAVE_MPI|$DT_NCCL_DEFS" >"$G/flags.new"
if cmp -s "$G/flags.new" "$G/flags.txt"; then rm -f "$G/flags.new"; else mv "$G/flags.new" "$G/flags.txt"; fi
fresh() {
    local out=$1 f
    shift
    [ -e "$out" ] && [ -e "$out.ok" ] || return 1
    for f in "$@" "${INPUTS[@]}"; do [ "$f" -nt "$out.ok" ] && return 1; done
    return 0
}
# job NAME OUT "DEPS" CMD...: unless OUT is fresh, runs CMD in the background (JOBS at a time),
# its output in logs/NAME.log; a failure removes OUT and lands in logs/failed
job() {
    local name=$1 out=$2 deps=$3
    shift 3
    fresh "$out" $deps && return 0
    rm -f "$out.ok"
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    { if "$@" >"$L/$name.log" 2>&1; then touch "$out.ok"; else rm -f "$out"; echo "$name" >>"$L/failed"; fi; } &
}
# the kernels' compile, its -Xptxas -v output kept whole in ptxas/
kernel() { "$DT_NVCC" -c $NVCC_FLAGS -Xptxas -v -I"$ROOT" -I"$ROOT/kernels" "$1" -o "$2" && cp "$L/kernel_$(basename "$1").log" "$G/ptxas/$(basename "$1").log"; }

# A k_*.cpp: which implementation object it links (none when it includes an example's .c or
# defines DT_IMPLEMENTATION), as tests/run.sh does on the emulator
k_impl() {
    grep -qE '^#[[:space:]]*define[[:space:]]+DT_IMPLEMENTATION|^#[[:space:]]*include[[:space:]]+"[^"]*\.c"' "$1" && return 0
    if grep -qE '^#[[:space:]]*define[[:space:]]+DT_CUDA' "$1"; then echo "$G/obj/impl_cuda.o"; else echo "$G/obj/impl_cpu.o"; fi
}
# k_build SRC OUT: against the real <cuda_runtime.h> (not tests/cuda_emu/include), the stubs
# force-included; g++, or nvcc when the test holds kernels of its own (or includes a kernels/*.cu)
K_LIBS="$G/libdt_kernels.a $DT_CUDA_LDFLAGS -lcublasLt -lcublas -lcudart $DT_LIBS -lpthread"
k_build() {
    local src=$1 out=$2 cxx="$DT_CXX -std=c++17 $K_OPT" impl
    impl=$(k_impl "$src")
    grep -qE '__global__|^#[[:space:]]*include[[:space:]]+"[^"]*\.cu"' "$src" && cxx="$DT_NVCC -x cu -std=c++17 $K_OPT -gencode arch=compute_${ARCH#sm_},code=$ARCH"
    $cxx -include "$ROOT/bench/gpu/emu_stubs.h" -I"$ROOT" -I"$ROOT/kernels" -I"$ROOT/tests" -I"$ROOT/tests/cuda_emu" \
        $CUDA_INC $DT_CPPFLAGS -c "$src" -o "$out.o" &&
        $DT_CXX "$out.o" $impl "$G/obj/emu_stubs.o" -o "$out" $K_LIBS
}
# an example: CPU (plain) or CUDA (-DDT_CUDA, the kernels, cuBLAS, NCCL), with mpicc -DDT_MPI
# when there is one (else a world of one rank), as build.sh builds them
example() {
    local src=$1 out=$2 cuda=$3 cc=$DT_CC defs='' libs=''
    if [ $HAVE_MPI = 1 ]; then cc=$DT_MPICC defs=-DDT_MPI; fi
    if [ "$cuda" = 1 ]; then
        defs+=" -DDT_CUDA $CUDA_INC -I$ROOT/kernels" libs="$G/libdt_kernels.a $DT_CUDA_LDFLAGS -lcublasLt -lcublas -lcudart -lstdc++"
        [ $HAVE_MPI = 1 ] && defs+=" $DT_NCCL_DEFS" libs+=" $DT_NCCL_LIBS"
    fi
    $cc $DT_CFLAGS $DT_CPPFLAGS $defs -I"$(dirname "$src")" "$src" -o "$out" $libs $DT_LIBS
}

build_everything() {
    local cu n src objs=() k_skip=(k_detect k_oom) # the emulator's own checks; k_oom fails allocations on purpose
    rm -f "$L/failed"
    for cu in kernels/*.cu; do
        n=$(basename "$cu" .cu)
        objs+=("$G/kernels/$n.o")
        job "kernel_$n.cu" "$G/kernels/$n.o" "$cu" kernel "$cu" "$G/kernels/$n.o"
    done
    job impl_cpu "$G/obj/impl_cpu.o" "tests/dt_impl.c" $DT_CC $DT_CFLAGS $DT_CPPFLAGS -c tests/dt_impl.c -o "$G/obj/impl_cpu.o"
    job impl_cuda "$G/obj/impl_cuda.o" "tests/dt_impl.c" $DT_CC $DT_CFLAGS $DT_CPPFLAGS -DDT_CUDA $CUDA_INC -c tests/dt_impl.c -o "$G/obj/impl_cuda.o"
    job emu_stubs "$G/obj/emu_stubs.o" "bench/gpu/emu_stubs.c bench/gpu/emu_stubs.h" $DT_CC $DT_CFLAGS -c bench/gpu/emu_stubs.c -o "$G/obj/emu_stubs.o"
    job mkshard "$G/mkshard" "bench/gpu/mkshard.c" $DT_CC $DT_CFLAGS bench/gpu/mkshard.c -o "$G/mkshard"
    job device "$G/device" "bench/gpu/device.c" $DT_CC $DT_CFLAGS $CUDA_INC bench/gpu/device.c -o "$G/device" $DT_CUDA_LDFLAGS -lcudart
    for n in gpt dlrm; do
        job "${n}_cpu" "$G/${n}_cpu" "examples/$n/$n.c $(echo examples/$n/*.h)" example "examples/$n/$n.c" "$G/${n}_cpu" 0
    done
    wait
    # the archive, once every kernel built
    if [ ! -e "$L/failed" ] || ! grep -q '^kernel_' "$L/failed"; then
        if [ ! -e "$G/libdt_kernels.a" ] || [ -n "$(find "${objs[@]}" -newer "$G/libdt_kernels.a" 2>/dev/null | head -n 1)" ]; then
            rm -f "$G/libdt_kernels.a"
            ar rcs "$G/libdt_kernels.a" "${objs[@]}" || echo libdt_kernels.a >>"$L/failed"
        fi
    fi
    [ -e "$G/libdt_kernels.a" ] || return 1
    for n in gpt dlrm; do
        job "${n}_cuda" "$G/${n}_cuda" "examples/$n/$n.c $(echo examples/$n/*.h) $G/libdt_kernels.a" example "examples/$n/$n.c" "$G/${n}_cuda" 1
    done
    for src in tests/cuda_emu/k_*.cpp; do
        n=$(basename "$src" .cpp)
        [[ " ${k_skip[*]} " == *" $n "* ]] && continue
        job "$n" "$G/k/$n" "$src $G/libdt_kernels.a $G/obj/impl_cuda.o $G/obj/impl_cpu.o $G/obj/emu_stubs.o bench/gpu/emu_stubs.h tests/dt_test.h tests/cuda_emu/k_common.h examples/*/*.c examples/*/*.h" k_build "$src" "$G/k/$n"
    done
    local cc=$DT_CC defs='' libs=''
    if [ $HAVE_MPI = 1 ]; then cc=$DT_MPICC defs="-DDT_MPI $DT_NCCL_DEFS" libs=$DT_NCCL_LIBS; fi
    job gpu_comm "$G/gpu_comm" "tests/gpu_comm.c tests/dt_test.h $G/libdt_kernels.a" $cc $DT_CFLAGS $DT_CPPFLAGS -DDT_CUDA $defs $CUDA_INC -I"$ROOT/kernels" \
        -I"$ROOT/tests" tests/gpu_comm.c -o "$G/gpu_comm" "$G/libdt_kernels.a" $DT_CUDA_LDFLAGS -lcublasLt -lcublas -lcudart $libs -lstdc++ $DT_LIBS
    job probe "$G/probe" "bench/gpu/probe.cu $G/libdt_kernels.a $G/obj/impl_cuda.o" "$DT_NVCC" -O2 -std=c++17 $NVCC_FLAGS -DDT_CUDA $DT_CPPFLAGS \
        -I"$ROOT/kernels" bench/gpu/probe.cu "$G/obj/impl_cuda.o" "$G/libdt_kernels.a" -o "$G/probe" -lcublasLt -lcublas $DT_LIBS
    wait
    [ ! -e "$L/failed" ]
}

LLMC=${DT_GPU_LLMC:-}
LLMC_PID=
if [ "$MODE" = run ] && [ -n "$LLMC" ]; then
    if [ -f "$LLMC/train_gpt2.cu" ]; then
        bash bench/gpu/llmc.sh "$LLMC" build >"$L/llmc_build.log" 2>&1 &
        LLMC_PID=$!
    else
        res llmc "**not run**: DT_GPU_LLMC=$LLMC holds no train_gpt2.cu"
    fi
fi
echo "== build (kernels for $ARCH, $JOBS at a time; logs in $L)"
t0=$SECONDS
export -f build_everything job fresh kernel k_impl k_build example
export G L JOBS ARCH NVCC_FLAGS CUDA_INC K_LIBS K_OPT HAVE_MPI ROOT DT_CFLAGS
BUILD_TIMEOUT=${DT_GPU_BUILD_TIMEOUT:-240}
[ "$MODE" = build ] && BUILD_TIMEOUT=${DT_GPU_BUILD_TIMEOUT:-1500} # CI: no budget, a slow shared machine
timeout "$BUILD_TIMEOUT" bash -c 'INPUTS=('"${INPUTS[*]}"'); build_everything'
rc=$?
res build_s $((SECONDS - t0))
nk=$(ls kernels/*.cu | wc -l)
nt=0
for t in "$G"/k/k_*; do [[ -x $t && $t != *.o && $t != *.ok ]] && nt=$((nt + 1)); done
if [ $rc -eq 0 ]; then
    res build "ok in $((SECONDS - t0)) s: $nk kernel files, 4 examples, $nt k_* tests, gpu_comm$([ $HAVE_MPI = 1 ] || echo ' (no MPI: one rank)'), probe"
    echo "ok: build in $((SECONDS - t0)) s ($nk kernel files, $nt k_* tests)"
else
    what=$(sort -u "$L/failed" 2>/dev/null | tr '\n' ' ')
    [ $rc -eq 124 ] && what+="(timed out after $BUILD_TIMEOUT s) "
    res build "**failed**: ${what}(logs: $L/<name>.log)"
    fail build "$what"
    for n in $(sort -u "$L/failed" 2>/dev/null | head -n 3); do echo "--- $L/$n.log"; head -n 25 "$L/$n.log"; done
fi
spills=$(cat "$G"/ptxas/*.log 2>/dev/null | grep -c 'bytes spill stores' || true)
nonzero=$(cat "$G"/ptxas/*.log 2>/dev/null | grep 'spill stores' | grep -vc ' 0 bytes spill stores' || true)
res ptxas "$nonzero of $spills kernels spill registers (build/gpu/ptxas/)"

# the shard writer, read back by examples/gpt itself (CPU): the format is the one gpt validates
if [ -x "$G/mkshard" ] && [ -x "$G/gpt_cpu" ]; then
    if "$G/mkshard" "$G/tiny_000001.bin" 4096 1 &&
        timeout 60 "$G/gpt_cpu" --shards "$G/tiny_*.bin" --layers 1 --width 32 --heads 2 --seq 16 --batch 2 --steps 1 --quiet \
            >"$L/shard_check.log" 2>&1 && grep -q '^final: loss' "$L/shard_check.log"; then
        echo "ok: a synthetic shard written by mkshard trains examples/gpt ($(tail -n 1 "$L/shard_check.log"))"
    else
        fail shard "examples/gpt does not read mkshard's shard ($L/shard_check.log): $(tail -n 2 "$L/shard_check.log" | tr '\n' ' ')"
    fi
fi

if [ "$MODE" = build ]; then
    if [ ${#FAILS[@]} -eq 0 ]; then
        echo "PASS gpu:build-only: $nk kernel files for $ARCH, examples gpt and dlrm (cpu, cuda), $nt k_* tests against the real CUDA runtime, gpu_comm, probe, mkshard in $((SECONDS - START)) s"
        exit 0
    fi
    echo "FAIL gpu:build-only: ${FAILS[*]} (logs: $L/)"
    exit 1
fi

# ---------------------------------------------------------------- tests on the GPU

# nothing of an earlier run may pass for this one's
rm -f "$G/probe.txt" "$G/profile.txt" "$G/summary.md" "$L"/*.jsonl "$L"/run_*

if phase "k_* tests on the GPU" 30; then
    np=0 nf=0 list=
    for t in "$G"/k/k_*; do
        [[ $t == *.o || $t == *.ok ]] && continue
        n=$(basename "$t")
        while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
        ( timeout "$(lim 90)" "$t" >"$L/run_$n.log" 2>&1; echo $? >"$L/run_$n.rc" ) &
    done
    wait
    for t in "$G"/k/k_*; do
        [[ $t == *.o || $t == *.ok ]] && continue
        n=$(basename "$t")
        read -r p f s < <(counts "$L/run_$n.log")
        rc=$(cat "$L/run_$n.rc" 2>/dev/null || echo 1)
        if [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] && [ "$p" -gt 0 ]; then np=$((np + 1))
        else
            nf=$((nf + 1))
            if [ "$rc" -eq 124 ]; then why="timed out"
            elif [ "$rc" -gt 128 ]; then why="signal $((rc - 128))"
            elif [ "$f" -gt 0 ]; then why="$f FAIL"
            else why="exit $rc: $(tail -n 1 "$L/run_$n.log" | cut -c1-100 | tr '|' '/')"
            fi
            list+=" $n ($why, $p PASS);"
            echo "FAILED $n: rc $rc, $f FAIL lines: $( (grep -m 2 '^FAIL' "$L/run_$n.log" || tail -n 1 "$L/run_$n.log") | cut -c1-160 | tr '\n' ' ')"
        fi
    done
    res k_tests "$((np + nf)) programs: $np passed, $nf failed${list:+:$list} (logs: build/gpu/logs/run_k_*.log)"
    echo "k_* on the GPU: $np passed, $nf failed"
    [ $nf -eq 0 ] || FAILS+=(k_tests)
fi
if phase "tests/gpu_comm.c" 20; then
    for np in 1 2; do
        if [ ! -x "$G/gpu_comm" ]; then res "gpu_comm_np$np" "not built"; continue; fi
        if [ $np -gt 1 ] && [ $HAVE_MPI = 0 ]; then res "gpu_comm_np$np" "skipped: no mpicc / mpirun"; continue; fi
        if [ $HAVE_MPI = 1 ]; then timeout "$(lim 90)" $DT_MPIRUN -np $np "$G/gpu_comm" >"$L/run_gpu_comm_np$np.log" 2>&1
        else timeout "$(lim 90)" "$G/gpu_comm" >"$L/run_gpu_comm_np$np.log" 2>&1; fi
        rc=$?
        read -r p f s < <(counts "$L/run_gpu_comm_np$np.log")
        if [ $rc -eq 0 ] && [ "$f" -eq 0 ] && [ "$p" -gt 0 ]; then res "gpu_comm_np$np" "PASS, $p checks, $s skipped"
        elif [ $rc -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -gt 0 ]; then
            res "gpu_comm_np$np" "**SKIP**: $(grep -m 1 '^SKIP' "$L/run_gpu_comm_np$np.log" | cut -c6-)"
            fail "gpu_comm_np$np" "it skipped: $(grep -m 1 '^SKIP' "$L/run_gpu_comm_np$np.log")"
        else res "gpu_comm_np$np" "**FAIL**: rc $rc, $f FAIL lines"; fail "gpu_comm_np$np" "rc $rc, $f FAIL lines"; fi
    done
fi

# losses NAME ARGS...: the CPU and the CUDA build, 5 steps, loss per step compared
losses() {
    local n=$1 rd at cnt
    shift
    if [ ! -x "$G/${n}_cpu" ] || [ ! -x "$G/${n}_cuda" ]; then res "${n}_losses" "not built"; return; fi
    timeout "$(lim 120)" "$G/${n}_cpu" "$@" --log "$L/${n}_small_cpu.jsonl" >"$L/${n}_small_cpu.log" 2>&1
    if ! timeout "$(lim 120)" "$G/${n}_cuda" "$@" --device cuda --log "$L/${n}_small_cuda.jsonl" >"$L/${n}_small_cuda.log" 2>&1; then
        res "${n}_losses" "**FAIL**: --device cuda exited non-zero: $(tail -n 1 "$L/${n}_small_cuda.log")"
        fail "${n}_losses" "$(tail -n 2 "$L/${n}_small_cuda.log" | tr '\n' ' ')"
        return
    fi
    read -r rd at cnt < <(reldiff "$L/${n}_small_cpu.jsonl" "$L/${n}_small_cuda.jsonl" 5)
    if [ "${cnt:-0}" -ge 5 ] && awk -v r="$rd" -v t="$RTOL" 'BEGIN { exit !(r != "nan" && r <= t) }'; then
        res "${n}_losses" "PASS: largest relative difference $rd (step $at of $cnt)"
    else
        res "${n}_losses" "**FAIL**: largest relative difference $rd at step $at of ${cnt:-0} (tolerance $RTOL)"
        fail "${n}_losses" "$rd at step $at of ${cnt:-0}"
    fi
}
# cp_losses KIND: context parallelism on the tensor cores, which only the emulator has run
# (tests/cuda_emu/mpi_cp_ring.cpp): --dtype bf16 --cp 2 at 2 ranks on this GPU (they share it, so
# dt stages their messages through MPI) against the CPU's bf16 run of one process, 5 steps, each
# loss within 1e-2 relative (the bound the emulator's gpt bf16 runs are held to)
cp_losses() {
    local kind=$1 rd at cnt n=gpt_cp_$1
    local args=(--layers 2 --heads 2 --width 64 --seq 64 --batch 4 --steps 5 --warmup 1 --print-every 1 --dtype bf16)
    if [ $HAVE_MPI = 0 ]; then res "${n}_losses" "skipped: no mpicc / mpirun"; return; fi
    if [ ! -x "$G/gpt_cpu" ] || [ ! -x "$G/gpt_cuda" ]; then res "${n}_losses" "not built"; return; fi
    [ -s "$L/gpt_bf16_cpu.jsonl" ] ||
        timeout "$(lim 120)" "$G/gpt_cpu" "${args[@]}" --log "$L/gpt_bf16_cpu.jsonl" >"$L/gpt_bf16_cpu.log" 2>&1
    if ! timeout "$(lim 120)" $DT_MPIRUN -np 2 "$G/gpt_cuda" "${args[@]}" --device cuda --cp 2 --cp-kind "$kind" \
        --log "$L/$n.jsonl" >"$L/$n.log" 2>&1; then
        res "${n}_losses" "**FAIL**: exited non-zero: $(tail -n 1 "$L/$n.log")"
        fail "${n}_losses" "$(tail -n 2 "$L/$n.log" | tr '\n' ' ')"
        return
    fi
    read -r rd at cnt < <(reldiff "$L/gpt_bf16_cpu.jsonl" "$L/$n.jsonl" 5)
    if [ "${cnt:-0}" -ge 5 ] && awk -v r="$rd" 'BEGIN { exit !(r != "nan" && r <= 1e-2) }'; then
        res "${n}_losses" "PASS: largest relative difference $rd (step $at of $cnt)"
    else
        res "${n}_losses" "**FAIL**: largest relative difference $rd at step $at of ${cnt:-0} (tolerance 1e-2)"
        fail "${n}_losses" "$rd at step $at of ${cnt:-0}"
    fi
}
if phase "gpt and dlrm, cpu vs cuda" 30; then
    losses gpt --layers 2 --heads 2 --width 64 --seq 32 --batch 4 --steps 5 --warmup 1 --print-every 1
    losses dlrm --steps 5 --batch 256 --rows 10000 --print-every 1 --eval-every 1000000 --eval-samples 1024
fi
if phase "gpt bf16 cp 2, cpu vs cuda" 30; then
    cp_losses ring
    cp_losses ulysses
fi

# ---------------------------------------------------------------- probe

run_probe() {
    PROBE_BUDGET_S=$(( $(left) > 260 ? 100 : 60 )) timeout "$(lim 150)" "$G/probe" >"$G/probe.txt" 2>&1
    rc=$?
    [ $rc -eq 0 ] || fail probe "rc $rc: $(grep -m 2 '^fail' "$G/probe.txt" | tr '\t\n' '  ')"
    res probe "rc $rc ($G/probe.txt)"
    grep -v '^#' "$G/probe.txt"
}
if phase "kernel probe" 60; then
    if [ -x "$G/probe" ]; then run_probe; else res probe "not built"; fail probe "not built"; fi
fi

# ---------------------------------------------------------------- end to end

# GPT-2 124M: 8 steps, the rate of steps 3-8
run_gpt2() {
    local tps rc
    "$G/mkshard" "$G/gpt2_synth_000001.bin" 2000000 1
    GPT2=(--layers 12 --heads 12 --width 768 --seq 1024 --batch 8 --shards "$G/gpt2_synth_*.bin" --warmup 2 --lr 6e-4 --clip 1 --device cuda)
    timeout "$(lim 150)" "$G/gpt_cuda" "${GPT2[@]}" --steps 8 --print-every 1 --log "$L/gpt2.jsonl" >"$L/gpt2.log" 2>&1
    rc=$?
    tps=$(steady "$L/gpt2.jsonl" tokens_per_s 2 8192 2>/dev/null)
    [ -n "$tps" ] || tps=$(steady "$L/gpt2.jsonl" tokens_per_s 1 8192 2>/dev/null)
    res gpt2_losses "$(sed -n 's/.*"loss":\([^,]*\).*/\1/p' "$L/gpt2.jsonl" 2>/dev/null | awk '{ printf("%.4f ", $1) }')"
    if [ -z "$tps" ]; then
        res gpt2 "**no figure**: rc $rc ($L/gpt2.log): $(tail -n 2 "$L/gpt2.log" | tr '\n' ' ')"
        fail gpt2 "rc $rc: $(tail -n 2 "$L/gpt2.log" | tr '\n' ' ')"
        return
    fi
    res gpt2_tok_s "$tps"
    echo "GPT-2 124M: $tps tok/s (steady), MFU $(mfu "$tps" "$(sed -n 's/^peak_bf16_tflops: //p' "$G/device.txt")")% of bf16 dense"
}
if phase "GPT-2 124M" 90; then
    if [ -x "$G/gpt_cuda" ]; then run_gpt2; else res gpt2 "not built"; fail gpt2 "not built"; fi
fi

# the same in --dtype bf16: bf16 parameters (f32 masters), attention (kernels/dt_flash.cu) and the
# GEMMs (cublasGemmEx and cuBLASLt, f32 accumulation) on the tensor cores, the activations the GEMMs
# read in bf16 (as llm.c); then 4 steps under --profile for gpt's table (the run llm.c is the peer of)
run_gpt2_bf16() {
    local tps rc
    timeout "$(lim 120)" "$G/gpt_cuda" "${GPT2[@]}" --dtype bf16 --steps 8 --print-every 1 --log "$L/gpt2_bf16.jsonl" \
        >"$L/gpt2_bf16.log" 2>&1
    rc=$?
    tps=$(steady "$L/gpt2_bf16.jsonl" tokens_per_s 2 8192 2>/dev/null)
    res gpt2_bf16_losses "$(sed -n 's/.*"loss":\([^,]*\).*/\1/p' "$L/gpt2_bf16.jsonl" 2>/dev/null | awk '{ printf("%.4f ", $1) }')"
    if [ -z "$tps" ]; then
        res gpt2_bf16 "**no figure**: rc $rc ($L/gpt2_bf16.log): $(tail -n 2 "$L/gpt2_bf16.log" | tr '\n' ' ')"
        fail gpt2_bf16 "rc $rc: $(tail -n 2 "$L/gpt2_bf16.log" | tr '\n' ' ')"
        return
    fi
    res gpt2_bf16_tok_s "$tps"
    GPT2_BF16_TPS=$tps
    echo "GPT-2 124M bf16: $tps tok/s (steady)"
    phase "GPT-2 124M bf16 --profile" 45 || return
    timeout "$(lim 100)" "$G/gpt_cuda" "${GPT2[@]}" --dtype bf16 --steps 4 --print-every 1 --profile \
        >"$L/gpt2_profile.log" 2>&1
    awk '/^profile/ { p = 1 } p && /^final:/ { exit } p' "$L/gpt2_profile.log" | head -n 50 >"$G/profile.txt"
    grep -q . "$G/profile.txt" || echo "(no profile table: $(tail -n 1 "$L/gpt2_profile.log"))" >"$G/profile.txt"
}
if [ -n "${GPT2[*]:-}" ] && phase "GPT-2 124M bf16" 60; then run_gpt2_bf16; fi

# The planner on this device (issue 23): gpt --plan measures the machine's figures on the GPU
# (dt_plan_machine_measure: the block's bf16 linears and flash attention at GPT-2's shapes, a device
# copy, the host link) into $G/machine.json, and predicts the step of the layout just run; printed
# against the steady rate measured above (a figure, not a pass / fail)
run_plan_bf16() {
    local pred rc
    timeout "$(lim 60)" "$G/gpt_cuda" "${GPT2[@]}" --dtype bf16 --plan --plan-profile "$G/machine.json" \
        >"$L/plan_gpt2_bf16.log" 2>&1
    rc=$?
    pred=$(sed -n 's/^plan: the layout given .*: predicted step [0-9.]* s, \([0-9]*\) tokens\/s.*/\1/p' "$L/plan_gpt2_bf16.log")
    if [ -z "$pred" ]; then
        res plan_gpt2_bf16 "**no figure**: rc $rc ($L/plan_gpt2_bf16.log): $(tail -n 1 "$L/plan_gpt2_bf16.log")"
        fail plan_gpt2_bf16 "rc $rc: $(tail -n 2 "$L/plan_gpt2_bf16.log" | tr '\n' ' ')"
        return
    fi
    res plan_gpt2_bf16 "predicted $pred tok/s, measured ${GPT2_BF16_TPS:-?} tok/s$(awk -v p="$pred" -v m="${GPT2_BF16_TPS:-0}" \
        'BEGIN { if (m > 0) printf(", error %+.1f%%", 100 * (p - m) / m) }'); machine $G/machine.json"
    grep -m 1 '^plan: machine' "$L/plan_gpt2_bf16.log"
}
if [ -n "${GPT2[*]:-}" ] && phase "planner on the device" 40; then run_plan_bf16; fi

# DLRM at MLPerf's widths, 30 steps on each device: the rate of steps 6-30
run_dlrm() {
    local dev=$1 sps rc
    DL=(--steps 30 --batch 4096 --rows 100000 --dim 128 --bottom 512,256 --top 1024,1024,512,256 --print-every 10
        --eval-every 1000000 --eval-samples 1024)
    timeout "$(lim 90)" "$G/dlrm_$dev" "${DL[@]}" --device "$dev" --log "$L/dlrm_$dev.jsonl" >"$L/dlrm_$dev.log" 2>&1
    rc=$?
    sps=$(steady "$L/dlrm_$dev.jsonl" samples_per_s 5 4096 2>/dev/null)
    if [ -n "$sps" ]; then res "dlrm_${dev}_sps" "$sps"; echo "DLRM --device $dev: $sps samples/s (steps 6 on)"
    else res "dlrm_$dev" "**no figure**: rc $rc ($L/dlrm_$dev.log)"; fail "dlrm_$dev" "rc $rc: $(tail -n 1 "$L/dlrm_$dev.log")"; fi
}
if phase "DLRM samples/s" 60; then
    for dev in cuda cpu; do
        if [ -x "$G/dlrm_$dev" ]; then run_dlrm "$dev"; else res "dlrm_$dev" "not built"; fail "dlrm_$dev" "not built"; fi
    done
fi

# llm.c on the same shard, last: its build ran beside dt's, its run times nothing of dt's
if [ -n "$LLMC_PID" ] && phase "llm.c" 40; then
    if ! wait "$LLMC_PID"; then
        res llmc "**not built**: $(tail -n 2 "$L/llmc_build.log" | tr '\n|' ' /')"
    elif [ ! -f "$G/gpt2_synth_000001.bin" ]; then
        res llmc "not run: no shard (the GPT-2 step did not run)"
    else
        timeout "$(lim 150)" bash bench/gpu/llmc.sh "$LLMC" run "$G/gpt2_synth_000001.bin" >"$L/llmc.txt" 2>&1
        lc=$(sed -n 's/^llmc_tok_s //p' "$L/llmc.txt")
        if [ -n "$lc" ]; then res llmc_tok_s "$lc"; echo "llm.c: $lc tok/s"
        else res llmc "**no figure**: $(tail -n 1 "$L/llmc.txt" | tr '|' '/')"; fi
    fi
fi

res total_s $((SECONDS - START))
code=0
[ ${#FAILS[@]} -eq 0 ] || code=1
res exit $code
summary
exit $code
