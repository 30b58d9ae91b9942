#!/usr/bin/env bash
# tests/readme_snippets.sh - every ```c block of README.md and docs/*.md compiles as printed, every
# one that is a program runs, and every ```diff block shows lines its files really hold. One
# check line per block: "PASS|FAIL readme:snippet_N: README.md line L, ..." for README.md,
# "readme:docs/X.md:N: docs/X.md line L, ..." for docs/X.md; a FAIL names the first compiler
# error (at its Markdown line) and the log.
#
# The blocks:
#   ```c      a whole C file, as a reader would save it. Compiled with the build's flags
#             (-std=c99 -Wall -Wextra -Werror, dt's directory on the include path) but at -O0
#             without -g (a quarter of -O2's time: each block compiles all of dt; the headers
#             build at -O2 everywhere else, where the optimizer's warnings show); when it
#             defines main it is linked and run. A block that includes dt_comm.h is built with
#             mpicc -DDT_MPI and run on 2 ranks under mpirun, as build.sh builds the examples.
#             Programs run in a scratch directory, 60 s at most.
#   ```diff   an excerpt of a change between two files of the repository, named by its
#             "--- PATH" and "+++ PATH" lines: each "-" line (its text after the mark, spaces
#             at both ends ignored) must be a line of the first file, each "+" and " " line a
#             line of the second; "@@ ... @@" lines stand for what is left out.
# An old "<!-- snippet: ... -->" marker is a FAIL: blocks are whole files.
#
#   bash tests/readme_snippets.sh [FILE.md...]   (default README.md docs/*.md; tests/run.sh runs
#                                                 it; ./build.sh env gives the flags)
# shellcheck disable=SC2086,SC2153
set -uo pipefail
export LC_ALL=C # compiler messages in ASCII, quoted as they are in the FAIL lines
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
shopt -s nullglob
if [ $# -gt 0 ]; then DOCS=("$@"); else DOCS=(README.md docs/*.md); fi

if [ -z "${DT_CFLAGS:-}" ]; then
    settings=$(bash ./build.sh env) || { echo "tests/readme_snippets.sh: ./build.sh env failed" >&2; exit 1; }
    eval "$settings"
fi

SNIP_CFLAGS=$(echo " $DT_CFLAGS " | sed 's/ -O[0-3s] / -O0 /; s/ -g / /; s/^ //; s/ $//')
D=build/tests/readme
rm -rf "$D" && mkdir -p "$D" || exit 1
RUNDIR=${DT_TEST_TMPDIR:-$ROOT/$D/run}
nfail=0 nblocks=0
# The blocks are checked JOBS at a time (each compile is one process on one core), each into
# its own result file, printed in the documents' order at the end.
JOBS=${DT_TEST_JOBS:-$(OMP_NUM_THREADS= nproc 2>/dev/null || echo 2)} # (nproc reads OMP_NUM_THREADS, 1 in the suite)
RESULTS=()

# first_error LOG: the first compiler error (or else the first line) of a log, on one line.
first_error() { { grep -m1 -E 'error|undefined reference' "$1" || head -n 1 "$1"; } | cut -c1-300; }

# check_c NAME WHERE MD LINE SRC: one ```c block (SRC) starting at line LINE of MD.
check_c() {
    local name=$1 where=$2 md=$3 line=$4 src=$5 base=${5%.c}
    local cc=$DT_CC defs='' mpi=0 log=$base.log rc run
    { printf '#line %d "%s"\n' "$line" "$md"; cat "$src"; } >"$base.t.c"
    if grep -qE '#[[:space:]]*include[[:space:]]*[<"]([^">]*/)?dt_comm\.h[">]' "$src"; then
        cc=$DT_MPICC defs=-DDT_MPI mpi=1
    fi
    if ! grep -qE '(^|[^A-Za-z0-9_])main[[:space:]]*\(' "$src"; then
        # a file without main: compiled, not linked
        if $cc $SNIP_CFLAGS $DT_CPPFLAGS $defs -c "$base.t.c" -o "$base.o" >"$log" 2>&1; then
            echo "PASS $name: $where, compiles"
        else
            echo "FAIL $name: $where: does not compile: $(first_error "$log") (log: $log)"
            nfail=$((nfail + 1))
        fi
        return
    fi
    if ! $cc $SNIP_CFLAGS $DT_CPPFLAGS $defs "$base.t.c" -o "$base" $DT_LIBS >"$log" 2>&1; then
        echo "FAIL $name: $where: does not compile: $(first_error "$log") (log: $log)"
        nfail=$((nfail + 1))
        return
    fi
    run=$RUNDIR/$(basename "$base")
    rm -rf "$run" && mkdir -p "$run"
    if [ $mpi = 1 ]; then
        (cd "$run" && timeout -k 5 60 $DT_MPIRUN -np 2 "$ROOT/$base" </dev/null >"$ROOT/$base.out" 2>&1)
    else
        (cd "$run" && timeout -k 5 60 "$ROOT/$base" </dev/null >"$ROOT/$base.out" 2>&1)
    fi
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "PASS $name: $where, compiles and runs$([ $mpi = 1 ] && echo " on 2 ranks")"
    else
        echo "FAIL $name: $where: compiles, but exits with status $rc$([ $rc -eq 124 ] && echo " (timed out)"):" \
            "$(tail -n 1 "$base.out" | cut -c1-300) (output: $base.out)"
        nfail=$((nfail + 1))
    fi
}

# check_diff NAME WHERE SRC: one ```diff block; its lines against the files it names.
check_diff() {
    local name=$1 where=$2 src=$3 old new bad
    old=$(sed -n 's/^--- \([^[:space:]]*\).*/\1/p' "$src" | head -n 1)
    new=$(sed -n 's/^+++ \([^[:space:]]*\).*/\1/p' "$src" | head -n 1)
    if [ -z "$old" ] || [ -z "$new" ] || [ ! -f "$old" ] || [ ! -f "$new" ]; then
        echo "FAIL $name: $where: a diff block names its files in '--- PATH' and '+++ PATH' lines of existing" \
            "files (found '${old:-none}' and '${new:-none}')"
        nfail=$((nfail + 1))
        return
    fi
    bad=$(awk -v old="$old" -v new="$new" '
        function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
        BEGIN {
            while ((getline l < old) > 0) in_old[trim(l)] = 1
            close(old) # old may be new
            while ((getline l < new) > 0) in_new[trim(l)] = 1
        }
        /^(---|\+\+\+) / || /^@@/ { next }
        { mark = substr($0, 1, 1); text = trim(substr($0, 2)) }
        mark == "-" && !(text in in_old) { print NR ": \"" text "\" is not a line of " old; exit }
        (mark == "+" || mark == " ") && !(text in in_new) { print NR ": \"" text "\" is not a line of " new; exit }
        mark != "-" && mark != "+" && mark != " " && $0 != "" { print NR ": a line that starts with neither -, + nor a space"; exit }
    ' "$src")
    if [ -z "$bad" ]; then
        echo "PASS $name: $where, every line is in $old / $new"
    else
        echo "FAIL $name: $where: block line ${bad} (block: $src)"
        nfail=$((nfail + 1))
    fi
}

for md in "${DOCS[@]}"; do
    [ -f "$md" ] || { echo "FAIL readme:$md: no such file"; nfail=$((nfail + 1)); continue; }
    if [ "$md" = README.md ]; then prefix=readme:snippet_ sub=$D; else prefix="readme:$md:" sub=$D/${md//\//_}; fi
    mkdir -p "$sub"
    # Splits md into $sub/b_N.c or b_N.diff, one per ```c / ```diff block, with $sub/b_N.meta
    # holding "LINE KIND" (LINE: the md line of the block's first line).
    awk -v dir="$sub" '
        /^<!-- snippet: [A-Za-z_]+ -->[ \t]*$/ { print NR > (dir "/markers") }
        !inside && /^```(c|diff)[ \t]*$/ {
            inside = 1; n++; kind = substr($0, 4); sub(/[ \t]+$/, "", kind)
            out = dir "/b_" n "." kind
            printf "" > out
            print NR + 1, kind > (dir "/b_" n ".meta")
            next
        }
        inside && /^```[ \t]*$/ { inside = 0; close(out); next }
        inside { print > out }
    ' "$md"
    if [ -f "$sub/markers" ]; then
        echo "FAIL ${prefix%:}:markers: $md line(s) $(tr '\n' ' ' <"$sub/markers")hold a '<!-- snippet: ... -->' marker: a block is a whole file now"
        nfail=$((nfail + 1))
    fi
    count=$(find "$sub" -name 'b_*.meta' | wc -l)
    for ((n = 1; n <= count; n++)); do
        read -r line kind <"$sub/b_$n.meta"
        nblocks=$((nblocks + 1))
        RESULTS+=("$sub/b_$n.res")
        if [ "$kind" = c ]; then
            while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
            check_c "$prefix$n" "$md line $line" "$md" "$line" "$sub/b_$n.c" >"$sub/b_$n.res" &
        else check_diff "$prefix$n" "$md line $line" "$sub/b_$n.diff" >"$sub/b_$n.res"
        fi
    done
done
wait
for r in "${RESULTS[@]}"; do
    cat "$r"
    nfail=$((nfail + $(grep -c '^FAIL' "$r")))
done
[ "$nblocks" -gt 0 ] || { echo "FAIL readme:snippets: no \`\`\`c or \`\`\`diff block in ${DOCS[*]}"; exit 1; }
[ $nfail -eq 0 ]
