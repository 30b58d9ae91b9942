#!/usr/bin/env bash
# tests/tutorial.sh - the README's course runs as printed: every examples/tutorial step, built
# as build.sh builds it, at np 1 and 2 under mpirun, prints per step the loss of the one-process
# run (1_single.c) within fp32 rounding. One check line per run:
#   PASS|FAIL tutorial:<step>[_<arg>]_np<N>_losses_equal_1_single: <worst step, both values, bound>
#
# The bound. The runs differ only in the order of their fp32 additions (a batch's rows split
# over ranks or micro-batches, the hidden units over tp ranks, then summed by dt_comm). Summed in
# any order, n terms differ by at most (n-1) u sum|terms| (Higham, u = 2^-24); the longest sums
# here are over the B = 32 rows and the H = 32 hidden units, so one step's loss, gradient and
# update (SGD, the gradient clipped to norm 1, lr 0.5) carry a relative difference below
# (B + H) u, and the weights take one such difference per step. So step s's loss may differ by
#     tol_s = s (B + H) 2^-23 max(1, |loss_s|)      (2^-23 = 2u: the loss and the update each)
# 7.6e-6 at step 1, 1.5e-4 at step 20; measured: below 1e-7 relative.
#
#   bash tests/tutorial.sh   (tests/run.sh runs it as group "tutorial"; ./build.sh env gives the flags)
# shellcheck disable=SC2086,SC2153
set -uo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

if [ -z "${DT_CFLAGS:-}" ]; then
    settings=$(bash ./build.sh env) || { echo "tests/tutorial.sh: ./build.sh env failed" >&2; exit 1; }
    eval "$settings"
fi

D=build/tests/tutorial
mkdir -p "$D" || exit 1
B=32 H=32 # examples/tutorial/*.c's batch and hidden width (the bound above)
nfail=0

# exe STEP: the program, from ./build.sh's build/examples/STEP when that is newer than its inputs,
# else built here with build.sh's command (mpicc -DDT_MPI: every step includes dt_comm.h).
exe() {
    local src=examples/tutorial/$1.c built=build/examples/$1 f
    if [ -x "$built" ]; then
        for f in "$src" dt_*.h; do [ "$f" -nt "$built" ] && built=; done
        [ -n "$built" ] && { echo "$built"; return 0; }
    fi
    $DT_MPICC $DT_CFLAGS $DT_CPPFLAGS -DDT_MPI "$src" -o "$D/$1" $DT_LIBS >"$D/$1.build.log" 2>&1 || return 1
    echo "$D/$1"
}

# compare NAME REF OUT: every "step S loss L" line of OUT against REF's, within tol_s.
compare() {
    local name=$1 ref=$2 out=$3 verdict
    verdict=$(awk -v B=$B -v H=$H '
        FNR == NR { if ($1 == "step") ref[$2] = $4; next }
        $1 == "step" {
            n++
            if (!($2 in ref)) { bad = bad ? bad : sprintf("step %s is not in the one-process run", $2); next }
            a = $4 + 0; r = ref[$2] + 0; d = a - r; if (d < 0) d = -d
            s = (r < 0 ? -r : r); tol = $2 * (B + H) * 2^-23 * (s > 1 ? s : 1)
            if (d > tol && !bad) bad = sprintf("step %s: loss %s, one process %s: |d| %.3g > tol %.3g", $2, $4, ref[$2], d, tol)
            if (d / tol >= worst) { worst = d / tol; w = sprintf("worst step %s: %s vs %s (|d| %.3g <= tol %.3g)", $2, $4, ref[$2], d, tol) }
        }
        END {
            if (n != length(ref)) bad = bad ? bad : sprintf("%d step lines, the one-process run has %d", n, length(ref))
            if (bad) print "FAIL " bad; else print "PASS " n " steps, " w
        }' "$ref" "$out")
    case $verdict in
        PASS*) echo "PASS $name: ${verdict#PASS }" ;;
        *) echo "FAIL $name: ${verdict#FAIL } (output: $out)"; nfail=$((nfail + 1)) ;;
    esac
}

ref_exe=$(exe 1_single) || { echo "FAIL tutorial:1_single_builds: $(grep -m1 error "$D/1_single.build.log") (log: $D/1_single.build.log)"; exit 1; }
if ! timeout -k 5 120 "$ref_exe" >"$D/1_single.out" 2>&1 || ! grep -q '^step' "$D/1_single.out"; then
    echo "FAIL tutorial:1_single_runs: $(tail -n 1 "$D/1_single.out") (output: $D/1_single.out)"
    exit 1
fi
echo "PASS tutorial:1_single_runs: $(grep -c '^step' "$D/1_single.out") steps, last: $(tail -n 1 "$D/1_single.out")"

# STEP ARG NPS: the runs (ARG "-": none)
while read -r step arg nps; do
    if ! prog=$(exe "$step"); then
        echo "FAIL tutorial:${step}_builds: $(grep -m1 error "$D/$step.build.log") (log: $D/$step.build.log)"
        nfail=$((nfail + 1))
        continue
    fi
    [ "$arg" = - ] && arg=
    for np in $nps; do
        name=tutorial:${step}${arg:+_${arg#--}}_np${np}_losses_equal_1_single
        out=$D/${step}${arg:+_${arg#--}}.np$np.out
        timeout -k 5 120 $DT_MPIRUN -np "$np" "$prog" $arg </dev/null >"$out" 2>&1
        rc=$?
        if [ $rc -ne 0 ]; then
            echo "FAIL $name: exits with status $rc: $(grep -v '^step' "$out" | head -n 1 | cut -c1-300) (output: $out)"
            nfail=$((nfail + 1))
            continue
        fi
        compare "$name" "$D/1_single.out" "$out"
    done
done <<'EOF'
2_ddp - 1 2
3_zero2 - 1 2
3_zero2 3 2
4_tp - 1 2
4_tp --sp 2
5_pipeline - 1 2
EOF
[ $nfail -eq 0 ]
