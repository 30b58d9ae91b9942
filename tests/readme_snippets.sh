#!/usr/bin/env bash
# tests/readme_snippets.sh - every ```c block of README.md compiles, and every one that is a
# program runs. One check line per block, "PASS|FAIL readme:snippet_N: README.md line L, ...";
# a FAIL names the first compiler error (at its README.md line) and the log.
#
# How README.md marks its blocks:
#   ```c                     a whole C file. Compiled with the build's flags (-Wall -Wextra
#                            -Werror); when it defines main it is linked and run.
#   <!-- snippet: main -->   on the line just before the ```c: the block is the body of main().
#   ```c                     Its leading #define / #include lines (and blank lines among them)
#                            stay at file scope, the rest goes into int main(void) { ... return
#                            0; }; linked and run.
# A block that includes dt_comm.h is built with mpicc -DDT_MPI and run on 2 ranks under mpirun,
# as build.sh builds the examples. Programs run in a scratch directory, 60 s at most.
#
#   bash tests/readme_snippets.sh [README]   (tests/run.sh runs it; ./build.sh env gives the flags)
# shellcheck disable=SC2086,SC2153
set -uo pipefail
export LC_ALL=C # compiler messages in ASCII, quoted as they are in the FAIL lines
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
README=${1:-README.md}

if [ -z "${DT_CFLAGS:-}" ]; then
    settings=$(bash ./build.sh env) || { echo "tests/readme_snippets.sh: ./build.sh env failed" >&2; exit 1; }
    eval "$settings"
fi

D=build/tests/readme
rm -rf "$D" && mkdir -p "$D" || exit 1
RUNDIR=${DT_TEST_TMPDIR:-$ROOT/$D/run}
nfail=0

# Splits README into $D/snippet_N.c, one per ```c block, with $D/snippet_N.meta holding
# "LINE KIND" (LINE: README line of the first code line; KIND: file, main or an unknown word).
awk -v dir="$D" '
    /^<!-- snippet: [A-Za-z_]+ -->[ \t]*$/ { mark = $3; marked = NR; next }
    !inside && /^```c[ \t]*$/ {
        inside = 1; n++
        kind = (marked == NR - 1) ? mark : "file"
        print NR + 1, kind > (dir "/snippet_" n ".meta")
        next
    }
    inside && /^```[ \t]*$/ { inside = 0; close(dir "/snippet_" n ".c"); next }
    inside { print > (dir "/snippet_" n ".c") }
' "$README"

# wrap_main SRC LINE: the body of main() made into a whole C file, with #line directives so
# that compiler messages name README lines.
wrap_main() {
    local src=$1 line=$2 nhead
    # leading preprocessor and blank lines stay at file scope
    nhead=$(awk '/^[ \t]*(#|$)/ { n++; next } { exit } END { print n + 0 }' "$src")
    printf '#line %d "%s"\n' "$line" "$README"
    head -n "$nhead" "$src"
    printf 'int main(void) {\n#line %d "%s"\n' $((line + nhead)) "$README"
    tail -n +$((nhead + 1)) "$src"
    printf 'return 0;\n}\n'
}

# first_error LOG: the first compiler error (or else the first line) of a log, on one line.
first_error() { { grep -m1 -E 'error|undefined reference' "$1" || head -n 1 "$1"; } | cut -c1-300; }

count=$(find "$D" -name 'snippet_*.meta' | wc -l)
for ((n = 1; n <= count; n++)); do
    name=readme:snippet_$n
    src=$D/snippet_$n.c
    read -r line kind <"$D/snippet_$n.meta"
    [ -f "$src" ] || : >"$src"
    where="$README line $line"
    case $kind in
        file) { printf '#line %d "%s"\n' "$line" "$README"; cat "$src"; } >"$D/t$n.c" ;;
        main) wrap_main "$src" "$line" >"$D/t$n.c" ;;
        *)
            echo "FAIL $name: $where: unknown <!-- snippet: $kind --> (file or main)"
            nfail=$((nfail + 1))
            continue
            ;;
    esac
    cc=$DT_CC defs='' mpi=0
    if grep -qE '#[[:space:]]*include[[:space:]]*[<"]([^">]*/)?dt_comm\.h[">]' "$src"; then
        cc=$DT_MPICC defs=-DDT_MPI mpi=1
    fi
    log=$D/t$n.log
    if [ "$kind" = file ] && ! grep -qE '(^|[^A-Za-z0-9_])main[[:space:]]*\(' "$src"; then
        # a file without main: compiled, not linked
        if $cc $DT_CFLAGS $DT_CPPFLAGS $defs -c "$D/t$n.c" -o "$D/t$n.o" >"$log" 2>&1; then
            echo "PASS $name: $where, compiles"
        else
            echo "FAIL $name: $where: does not compile: $(first_error "$log") (log: $log)"
            nfail=$((nfail + 1))
        fi
        continue
    fi
    if ! $cc $DT_CFLAGS $DT_CPPFLAGS $defs "$D/t$n.c" -o "$D/t$n" $DT_LIBS >"$log" 2>&1; then
        echo "FAIL $name: $where: does not compile: $(first_error "$log") (log: $log)"
        nfail=$((nfail + 1))
        continue
    fi
    run=$RUNDIR/snippet_$n
    rm -rf "$run" && mkdir -p "$run"
    if [ $mpi = 1 ]; then
        (cd "$run" && timeout -k 5 60 $DT_MPIRUN -np 2 "$ROOT/$D/t$n" </dev/null >"$ROOT/$D/t$n.out" 2>&1)
    else
        (cd "$run" && timeout -k 5 60 "$ROOT/$D/t$n" </dev/null >"$ROOT/$D/t$n.out" 2>&1)
    fi
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "PASS $name: $where, compiles and runs$([ $mpi = 1 ] && echo " on 2 ranks")"
    else
        echo "FAIL $name: $where: compiles, but exits with status $rc$([ $rc -eq 124 ] && echo " (timed out)"):" \
            "$(tail -n 1 "$D/t$n.out" | cut -c1-300) (output: $D/t$n.out)"
        nfail=$((nfail + 1))
    fi
done
[ "$count" -gt 0 ] || { echo "FAIL readme:snippets: no \`\`\`c block in $README"; exit 1; }
[ $nfail -eq 0 ]
