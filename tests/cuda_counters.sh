#!/usr/bin/env bash
# tests/cuda_counters.sh - a CUDA training step stays on the device (DESIGN.md, "A GPU step stays
# on the GPU"), proved by the counters: build/examples/emu/gpt and build/examples/emu/dlrm (./build.sh:
# the examples against the CPU emulator) train a few steps of a tiny model with --device cuda
# --profile, and every rank's line
#     cuda counters per step: syncs S allocs A frees F h2d_bytes B h2d_calls C d2h_bytes D d2h_calls E
# (the most any step after the first asked of the device; a logging step's loss read, and gpt's optimizer step
# that fills the log line's info, apart) must
# say: no device allocation or free, host-to-device bytes equal to the step's inputs, nothing copied
# to the host, at most one wait. --print-every is above --steps, so steps 2 .. N-1 log nothing and
# step N's loss read is counted apart. Layouts: gpt at dp 1 and tp 2 x dp 1 on 2 ranks, each at
# ZeRO 0 and 3, in f32 and bf16, and its pipeline (pp 2: 1F1B; interleaved under deferred streams); dlrm at np 1, 2
# and 3 with data-parallel, mixed and row-wise plans, and --dtype bf16. Run by tests/run.sh (group cuda_counters); by hand:
#     bash tests/cuda_counters.sh            (after ./build.sh)
# A failing count is found with the emulator's trace: DT_EMU_TRACE=1 build/examples/emu/gpt ...
# prints where each allocation, copy and wait came from (tests/cuda_emu/cuda_emu.cpp).
# shellcheck disable=SC2086
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
if [ -z "${DT_MPIRUN:-}" ]; then
    settings=$(bash ./build.sh env) || { echo "tests/cuda_counters.sh: ./build.sh env failed" >&2; exit 1; }
    eval "$settings"
fi
export OPENBLAS_NUM_THREADS=1
TMP=${DT_TEST_TMPDIR:-$(mktemp -d)}
GPT=build/examples/emu/gpt
DLRM=build/examples/emu/dlrm
STEPS=3
fails=0

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; fails=$((fails + 1)); }

# check NAME LOG RANKS EXPECTED_H2D WHAT: each of the RANKS counter lines in LOG against the bounds.
check() {
    local name=$1 log=$2 ranks=$3 want=$4 what=$5 n r=0 line syncs allocs frees h2d h2dc d2h d2hc bad
    n=$(grep -c '^cuda counters per step:' "$log")
    if [ "$n" -ne "$ranks" ]; then
        fail "${name}_prints_one_counter_line_per_rank" "$n lines for $ranks ranks; the run's end:"
        tail -n 15 "$log" | sed 's/^/    | /'
        return
    fi
    while read -r line; do
        read -r syncs allocs frees h2d h2dc d2h d2hc < <(echo "$line" | sed -n \
            's/^cuda counters per step: syncs \([0-9-]*\) allocs \([0-9-]*\) frees \([0-9-]*\) h2d_bytes \([0-9-]*\) h2d_calls \([0-9-]*\) d2h_bytes \([0-9-]*\) d2h_calls \([0-9-]*\)$/\1 \2 \3 \4 \5 \6 \7/p')
        if [ -z "${d2hc:-}" ]; then fail "${name}_counter_line_has_the_documented_form" "'$line'"; r=$((r + 1)); continue; fi
        echo "  $name line $((r + 1)): syncs $syncs allocs $allocs frees $frees h2d_bytes $h2d (expected $want: $what) h2d_calls $h2dc d2h_bytes $d2h d2h_calls $d2hc"
        bad=
        [ "$allocs" -eq 0 ] || bad+=" allocs $allocs (expected 0);"
        [ "$frees" -eq 0 ] || bad+=" frees $frees (expected 0);"
        [ "$h2d" -eq "$want" ] || bad+=" h2d_bytes $h2d (expected $want: $what);"
        [ "$d2h" -eq 0 ] || bad+=" d2h_bytes $d2h in $d2hc calls (expected 0);"
        [ "$syncs" -le 1 ] || bad+=" syncs $syncs (expected <= 1);"
        if [ -z "$bad" ]; then pass "${name}_step_stays_on_the_device [line $((r + 1))]"
        else bad=${bad%;}; fail "${name}_step_stays_on_the_device [line $((r + 1))]" "${bad# }; DT_EMU_TRACE=1 names where each comes from"; fi
        r=$((r + 1))
    done < <(grep '^cuda counters per step:' "$log")
}

# check_uneven NAME LOG RANKS H2D_A H2D_B WHAT: check, each line's upload being one of two sizes.
check_uneven() {
    local name=$1 log=$2 ranks=$3 a=$4 b=$5 what=$6 line h2d k=0 sub
    sub=$TMP/$name.line
    while read -r line; do
        h2d=$(echo "$line" | sed -n 's/.* h2d_bytes \([0-9-]*\) .*/\1/p')
        k=$((k + 1))
        echo "$line" >"$sub"
        if [ "$h2d" = "$b" ]; then check "$name.$k" "$sub" 1 "$b" "$what"; else check "$name.$k" "$sub" 1 "$a" "$what"; fi
    done < <(grep '^cuda counters per step:' "$log")
    [ "$k" -eq "$ranks" ] || fail "${name}_prints_one_counter_line_per_rank" "$k lines for $ranks ranks"
}

# run NP LOG CMD...: CMD at NP ranks (np 1 without mpirun), a device per rank (the fake NCCL, as
# the real one, wants distinct devices); its exit status must be 0.
run() {
    local np=$1 log=$2
    shift 2
    if [ "$np" -eq 1 ]; then timeout -k 10 600 "$@" </dev/null >"$log" 2>&1
    else DT_EMU_DEVICES=$np timeout -k 10 600 $DT_MPIRUN -np "$np" "$@" </dev/null >"$log" 2>&1; fi
}

# gpt: B sequences of T tokens; a tp group's ranks all see the dp rank's batch, ids and targets
# i32 each: 2 x 4 x (B / dp) x T bytes up per step.
# --dtype bf16 (GEMMs and attention on the tensor cores: their bf16 operands in ctx scratch) too.
B=2 T=16
for layout in "1 1 f32" "2 2 f32" "1 1 bf16" "2 2 bf16"; do
    read -r np tp dtype <<<"$layout"
    for zero in 0 3; do
        name=gpt_cuda_np${np}_tp${tp}_zero${zero}
        [ "$dtype" = f32 ] || name=${name}_$dtype
        log=$TMP/$name.log
        if [ ! -x "$GPT" ]; then fail "$name" "$GPT does not exist (./build.sh builds it)"; continue; fi
        if ! run "$np" "$log" "$GPT" --device cuda --layers 1 --width 32 --heads 2 --seq $T --batch $B --steps $STEPS \
            --warmup 1 --tp "$tp" --zero "$zero" --dtype "$dtype" --print-every 1000 --profile; then
            fail "${name}_runs" "exit status non-zero; the end of its output:"
            tail -n 15 "$log" | sed 's/^/    | /'
            continue
        fi
        dp=$((np / tp))
        check "$name" "$log" "$np" $((2 * 4 * (B / dp) * T)) "ids + targets, 2 x 4 x $((B / dp)) x $T"
    done
done

# dlrm: a rank's Bl = B / np samples, one-hot (synthetic data's default): 13 dense f32, 1 label
# f32, and per feature (26) one id and its length, i64 each (dt_kjt): (13 + 1) x 4 + 26 x 2 x 8
# bytes a sample. Plans: tiny tables (every table data-parallel), larger ones (the planner's mix of
# table-wise and data-parallel), and every table row-wise (an owner's requests vary by batch).
# With --accum 2 (the embedding's contributions wait in the device's window, dt_embed_set_sync 0)
# a step uploads the same bytes, in two micro-batches, and its final loss must equal the CPU
# run's within k_dlrm.cpp's derived LOSS_RTOL (7e-5 relative: the dense side's sums differ in order).
# With --dtype bf16 (the linears' GEMMs in bf16: their operands rounded into scratch, nothing
# allocated after the first step) the same bytes go up, and the final loss must equal the CPU
# bf16 run's within k_dlrm.cpp's BF16_RTOL (1e-3 relative: an activation on the edge between two
# bf16 values may round the other way).
DB=16
for cfg in "1 dp --rows 16" "2 dp --rows 16" "2 mixed --rows 100000 --dim 16" "2 row --rows 1000 --shard row" \
           "3 row --rows 1000 --shard row" "2 mixed_accum2 --rows 100000 --dim 16 --accum 2" \
           "2 row_accum2 --rows 1000 --shard row --accum 2" "2 mixed_bf16 --rows 100000 --dim 16 --dtype bf16"; do
    read -r np plan extra <<<"$cfg"
    name=dlrm_cuda_np${np}_$plan
    log=$TMP/$name.log
    if [ ! -x "$DLRM" ]; then fail "$name" "$DLRM does not exist (./build.sh builds it)"; continue; fi
    if ! run "$np" "$log" "$DLRM" --device cuda --dim 4 --batch $DB --bottom 8 --top 8 --steps $STEPS \
        --eval-every 1000 --eval-samples 16 --print-every 1000 --profile $extra; then
        fail "${name}_runs" "exit status non-zero; the end of its output:"
        tail -n 15 "$log" | sed 's/^/    | /'
        continue
    fi
    # a rank's samples: B / np, the first B mod np ranks one more; the lines come in any rank order,
    # so with an uneven split every line must be one of the two sizes (both np here divide 16 but 3)
    bl=$((DB / np))
    if [ $((DB % np)) -eq 0 ]; then
        check "$name" "$log" "$np" $(((14 * 4 + 26 * 2 * 8) * bl)) "dense 13 x 4 + label 4 + ids 26 x 8 + lengths 26 x 8, x $bl samples"
    else
        check_uneven "$name" "$log" "$np" $(((14 * 4 + 26 * 2 * 8) * bl)) $(((14 * 4 + 26 * 2 * 8) * (bl + 1))) \
            "(13 x 4 + 4 + 26 x 8 + 26 x 8) x $bl or $((bl + 1)) samples"
    fi
    case $plan in *accum* | *bf16*)
        tol=7e-5
        case $plan in *bf16*) tol=1e-3 ;; esac
        cpu=$TMP/$name.cpu.log
        if run "$np" "$cpu" build/examples/dlrm --dim 4 --batch $DB --bottom 8 --top 8 --steps $STEPS --eval-every 1000 \
            --eval-samples 16 --print-every 1000 $extra; then
            lg=$(sed -n 's/^final: loss \([^ ]*\) .*/\1/p' "$log"); lc=$(sed -n 's/^final: loss \([^ ]*\) .*/\1/p' "$cpu")
            if awk -v g="$lg" -v c="$lc" -v t="$tol" 'BEGIN { d = g - c; if (d < 0) d = -d; a = c < 0 ? -c : c; exit !(g != "" && c != "" && d <= t * a) }'; then
                pass "${name}_final_loss_equals_cpu [cuda $lg, cpu $lc]"
            else fail "${name}_final_loss_equals_cpu" "cuda $lg, cpu $lc (tolerance $tol relative)"; fi
        else fail "${name}_cpu_run" "build/examples/dlrm exit status non-zero"; fi ;;
    esac
done

# gpt's pipeline on CUDA (pp 2): its messages go over NCCL, a group of two per directed link
# (dt_pp_run), so its step stays on the device as the others' do: each stage uploads the ids and
# targets of its micro-batches (gpt reads both on every stage), 2 x 4 x B x T bytes. It must also
# end on the CPU run's loss within k_gpt.cpp's LOSS_RTOL (2e-5 relative). 1F1B as is, and
# interleaved (its last chunk's gradients come before the list receives them: posted early) under
# deferred streams, where a consumer not ordered after its receive reads stale data.
for cfg in "1f1b 2 2 immediate" "interleaved 4 4 deferred"; do
    read -r sched layers micro streams <<<"$cfg"
    name=gpt_cuda_np2_pp2_$sched
    if [ ! -x "$GPT" ]; then fail "$name" "$GPT does not exist (./build.sh builds it)"; continue; fi
    args="--layers $layers --width 32 --heads 2 --seq $T --batch $micro --steps $STEPS --warmup 1 --pp 2 --micro $micro"
    args+=" --schedule $sched --print-every 1000"
    if DT_EMU_STREAMS=$streams run 2 "$TMP/$name.log" "$GPT" --device cuda --profile $args &&
        run 2 "$TMP/$name.cpu.log" build/examples/gpt $args; then
        check "$name" "$TMP/$name.log" 2 $((2 * 4 * micro * T)) "ids + targets, 2 x 4 x $micro x $T"
        lg=$(sed -n 's/^final: loss \([^ ]*\).*/\1/p' "$TMP/$name.log"); lc=$(sed -n 's/^final: loss \([^ ]*\).*/\1/p' "$TMP/$name.cpu.log")
        if awk -v g="$lg" -v c="$lc" 'BEGIN { d = g - c; if (d < 0) d = -d; a = c < 0 ? -c : c; exit !(g != "" && c != "" && d <= 2e-5 * a) }'; then
            pass "${name}_final_loss_equals_cpu [cuda $lg, cpu $lc]"
        else fail "${name}_final_loss_equals_cpu" "cuda $lg, cpu $lc (tolerance 2e-5 relative)"; fi
    else
        fail "${name}_runs" "exit status non-zero; the end of its output:"
        tail -n 8 "$TMP/$name.log" | sed 's/^/    | /'
    fi
done

# dt_ctx_init's failure is named (no GPU: the emulator with no device), not "ctx is NULL"
name=gpt_cuda_without_a_device_names_the_error
if [ -x "$GPT" ]; then
    DT_EMU_DEVICES=0 timeout 60 "$GPT" --device cuda --steps 1 >"$TMP/nodev.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q 'dt_ctx_init: no usable CUDA device' "$TMP/nodev.log" && ! grep -q 'ctx is NULL' "$TMP/nodev.log"; then
        pass "$name"
    else
        fail "$name" "exit status $rc, output: $(head -c 300 "$TMP/nodev.log")"
    fi
else
    fail "$name" "$GPT does not exist (./build.sh builds it)"
fi
[ $fails -eq 0 ]
