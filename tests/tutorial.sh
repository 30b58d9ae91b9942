#!/usr/bin/env bash
# tests/tutorial.sh - the README's course runs as printed: every examples/tutorial step, built
# as build.sh builds it, at np 1 and 2 under mpirun, prints per step the loss of the one-process
# run (1_single.c) within fp32 rounding. One check line per run:
#   PASS|FAIL tutorial:<step>[_<arg>]_np<N>_losses_equal_1_single: <worst step, both values, bound>
# Then each step, and examples/mlp, given arguments it does not take (a bad value, an unknown
# flag): exit 2 and a message naming the argument, one line each:
#   PASS|FAIL tutorial:<prog>_refuses_bad_args (<args>): <its message>
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

# exe STEP [SRC]: the program, from ./build.sh's build/examples/STEP when that is newer than its
# inputs, else built here with build.sh's command (mpicc -DDT_MPI: every step includes dt_comm.h).
exe() {
    local src=${2:-examples/tutorial/$1.c} built=build/examples/$1 f
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

# PROG|ARGS|WANT: PROG ARGS (split at spaces; '' an empty one) exits 2, its output holding WANT.
while IFS='|' read -r step args want; do
    src=; [ "$step" = mlp ] && src=examples/mlp/mlp.c
    name="tutorial:${step}_refuses_bad_args ($args)"
    if ! prog=$(exe "$step" $src); then
        echo "FAIL $name: does not build (log: $D/$step.build.log)"; nfail=$((nfail + 1)); continue
    fi
    out=$D/$step.bad_args.out
    eval "set -- $args"
    OPENBLAS_NUM_THREADS=1 timeout -k 5 60 "$prog" "$@" </dev/null >"$out" 2>&1
    rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$want" "$out"; then echo "PASS $name: $(head -n 1 "$out")"
    else echo "FAIL $name: exit $rc (want 2), output: $(head -n 1 "$out" | cut -c1-300); want: $want"; nfail=$((nfail + 1)); fi
done <<'EOF'
1_single|--steps 5 --bogus|1_single takes no arguments, got '--steps'
1_single|--help|1_single takes no arguments, got '--help'
2_ddp|--steps 5|2_ddp takes no arguments, got '--steps'
3_zero2|abc|the ZeRO stage 0..3 (default 2); got 'abc'
3_zero2|4|the ZeRO stage 0..3 (default 2); got '4'
3_zero2|''|the ZeRO stage 0..3 (default 2); got ''
3_zero2|3 --bogus|the ZeRO stage 0..3 (default 2); got '--bogus'
4_tp|--sq|4_tp takes one optional argument, --sp; got '--sq'
4_tp|--sp --bogus|4_tp takes one optional argument, --sp; got '--bogus'
5_pipeline|--bogus|5_pipeline takes no arguments, got '--bogus'
mlp|--steps 12abc|--steps wants an integer in [1, 1000000000], got '12abc'
mlp|--steps 1e30|--steps wants an integer in [1, 1000000000], got '1e30'
mlp|--steps 4294967298|--steps wants an integer in [1, 1000000000], got '4294967298'
mlp|--steps ''|--steps wants an integer in [1, 1000000000], got ''
mlp|--steps|--steps wants an integer in [1, 1000000000], got nothing
mlp|--lr inf|--lr wants a number in [0, 100], got 'inf'
mlp|--lr 1e39|--lr wants a number in [0, 100], got '1e39'
mlp|--seed -1|--seed wants an integer in [0, 9007199254740992], got '-1'
mlp|--seed 99999999999999999999|--seed wants an integer in [0, 9007199254740992], got '99999999999999999999'
mlp|--device gpu|--device wants cpu or cuda, got 'gpu'
mlp|--bogus 1|unknown flag '--bogus'
EOF
# and the flags it takes still train: mlp's last line is its eval loss
out=$D/mlp.good_args.out
if prog=$(exe mlp examples/mlp/mlp.c) &&
   OPENBLAS_NUM_THREADS=1 timeout -k 5 60 "$prog" --steps 3 --batch 8 --hidden 8 --seed 5 --lr 0.1 </dev/null >"$out" 2>&1 &&
   grep -q '^final: loss [0-9]' "$out"; then
    echo "PASS tutorial:mlp_takes_good_args: $(tail -n 1 "$out")"
else echo "FAIL tutorial:mlp_takes_good_args: $(tail -n 1 "$out" 2>/dev/null) (output: $out)"; nfail=$((nfail + 1)); fi
[ $nfail -eq 0 ]
