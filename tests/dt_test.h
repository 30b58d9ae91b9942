/* tests/dt_test.h - the small harness every dt test program includes (not part of the library).

   A test program prints one line per check on stdout, which tests/run.sh counts:

       PASS <name>
       FAIL <name>: <details>
       SKIP <name>: <reason>

   and exits non-zero iff a check failed. Names are short snake_case statements of the behaviour
   (matmul_matches_reference); no ": " inside a name. A FAIL says which two values it compared.

   Use:
       #define DT_IMPLEMENTATION
       #include "dt_tensor.h"
       #include "dt_test.h"
       int main(void) {
           DT_TEST_CHECK("zeros_is_zero", t.data[0] == 0.0f);
           dt_test_close("sum", got, 10.0, 1e-6);
           dt_test_allclose("matmul_matches_reference", c, ref, n, 1e-5, 1e-5);
           dt_test_error("shape_mismatch_is_named", st, dt_ctx_error(&ctx), "shape");
           if (!have_x) dt_test_skip("x_path", "needs %s", "x");
           return dt_test_finish();
       }

   Checks return 1 when they pass, so a test can stop early: if (!DT_TEST_CHECK(...)) ...

   Multi-rank programs (built with -DDT_MPI): only rank 0 prints PASS/FAIL/SKIP lines. A plain
   check that fails on another rank prints "[rank r] FAIL ..." on stderr, and dt_test_finish()
   (call it before MPI_Finalize) makes rank 0 print one FAIL line counting those failures and
   makes every rank return non-zero. dt_test_check_all() is the collective form: every rank
   passes its own verdict, rank 0 prints one line naming the ranks that failed and why.

   Scratch files: write them under dt_test_tmpdir(); the runner gives each run a fresh,
   empty directory there (shared by the ranks of one mpirun). */
#ifndef DT_TEST_H
#define DT_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DT_MPI
#include <mpi.h>
#endif

/* Every definition here is static and most tests use a few of them: keep -Wall quiet. */
#if defined(__GNUC__) || defined(__clang__)
#define DT_TEST__FN static __attribute__((unused))
#define DT_TEST__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define DT_TEST__FN static
#define DT_TEST__PRINTF(fmt, args)
#endif

/* counts of this process: [0] passed, [1] failed, [2] skipped */
static int dt_test__count[3]
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((unused))
#endif
    ;

/* Rank in MPI_COMM_WORLD while MPI is running, else -1 (a plain single-process test). */
DT_TEST__FN int dt_test__mpi_rank(void) {
#ifdef DT_MPI
    int init = 0, fin = 0, rank = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) return -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
#else
    return -1;
#endif
}

DT_TEST__FN int dt_test__is_root(void) { return dt_test__mpi_rank() <= 0; }

/* Prints the line (rank 0; other ranks print failures on stderr) and counts it.
   kind: 0 PASS, 1 FAIL, 2 SKIP; fmt may be NULL (no details). */
DT_TEST__FN void dt_test__vemit(int kind, const char *name, const char *fmt, va_list ap) {
    static const char *const word[3] = {"PASS", "FAIL", "SKIP"};
    int rank = dt_test__mpi_rank();
    FILE *out = stdout;
    dt_test__count[kind]++;
    if (rank > 0) {
        if (kind != 1) return;
        out = stderr;
        fprintf(out, "[rank %d] ", rank);
    }
    fprintf(out, "%s %s", word[kind], name);
    if (fmt && fmt[0]) {
        fputs(": ", out);
        vfprintf(out, fmt, ap);
    }
    fputc('\n', out);
    fflush(out); /* a crash right after must not lose the line */
}

DT_TEST__FN void dt_test__emit(int kind, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_test__vemit(kind, name, fmt, ap);
    va_end(ap);
}

DT_TEST__FN int dt_test_pass(const char *name) {
    dt_test__emit(0, name, NULL);
    return 1;
}

DT_TEST__FN DT_TEST__PRINTF(2, 3) int dt_test_fail(const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_test__vemit(1, name, fmt, ap);
    va_end(ap);
    return 0;
}

DT_TEST__FN DT_TEST__PRINTF(2, 3) int dt_test_skip(const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_test__vemit(2, name, fmt, ap);
    va_end(ap);
    return 1;
}

DT_TEST__FN int dt_test__check(const char *name, int ok, const char *expr, const char *file, int line) {
    if (ok) return dt_test_pass(name);
    return dt_test_fail(name, "%s is false (%s:%d)", expr, file, line);
}
/* PASS iff cond is true; the FAIL line quotes the condition. */
#define DT_TEST_CHECK(name, cond) dt_test__check((name), (cond) ? 1 : 0, #cond, __FILE__, __LINE__)

/* PASS iff |got - want| <= tol. */
DT_TEST__FN int dt_test_close(const char *name, double got, double want, double tol) {
    if (fabs(got - want) <= tol) return dt_test_pass(name);
    return dt_test_fail(name, "got %.9g, want %.9g, |diff| %.3g > tol %.3g", got, want, fabs(got - want), tol);
}

/* PASS iff every |got[i] - want[i]| <= atol + rtol * |want[i]| (numpy.allclose). NaN fails
   unless both are NaN; infinities must match exactly. The FAIL line gives the first bad
   index with both values, how many were bad and the largest difference. */
DT_TEST__FN int dt_test_allclose(const char *name, const float *got, const float *want, size_t n, double atol,
                                 double rtol) {
    size_t i, bad = 0, first = 0;
    double maxdiff = 0.0;
    for (i = 0; i < n; i++) {
        double g = got[i], w = want[i], d = fabs(g - w);
        int ok = d <= atol + rtol * fabs(w);
        if (isnan(g) || isnan(w) || isinf(g) || isinf(w)) { /* fabs(inf - inf) is NaN: compare exactly */
            ok = (isnan(g) && isnan(w)) || g == w;
            d = ok ? 0.0 : INFINITY;
        }
        if (d > maxdiff) maxdiff = d;
        if (!ok && bad++ == 0) first = i;
    }
    if (bad == 0) return dt_test_pass(name);
    return dt_test_fail(name, "%zu of %zu differ; first at [%zu]: got %.9g, want %.9g; max |diff| %.3g (atol %.3g, rtol %.3g)",
                        bad, n, first, (double)got[first], (double)want[first], maxdiff, atol, rtol);
}

/* PASS iff the two buffers are bitwise identical (determinism, resume, save/load round trips). */
DT_TEST__FN int dt_test_equal_bytes(const char *name, const void *got, const void *want, size_t nbytes) {
    const unsigned char *g = (const unsigned char *)got, *w = (const unsigned char *)want;
    size_t i;
    for (i = 0; i < nbytes; i++)
        if (g[i] != w[i])
            return dt_test_fail(name, "first difference at byte %zu of %zu: got 0x%02x, want 0x%02x", i, nbytes, g[i],
                                w[i]);
    return dt_test_pass(name);
}

/* PASS iff a call failed (status != 0) with a message that contains `must_contain` (the
   argument name, the bad value...). msg may be NULL, which fails. */
DT_TEST__FN int dt_test_error(const char *name, int status, const char *msg, const char *must_contain) {
    if (status == 0) return dt_test_fail(name, "status 0 (ok), want an error mentioning \"%s\"", must_contain);
    if (!msg || !strstr(msg, must_contain))
        return dt_test_fail(name, "status %d with message \"%s\", want it to mention \"%s\"", status,
                            msg ? msg : "(null)", must_contain);
    return dt_test_pass(name);
}

/* Collective over MPI_COMM_WORLD (every rank calls it; without MPI, a plain check): PASS iff
   `ok` on every rank. Each rank's details (printf-style) appear in the FAIL line, by rank.
   Returns the global verdict on every rank. */
DT_TEST__FN DT_TEST__PRINTF(3, 4) int dt_test_check_all(const char *name, int ok, const char *fmt, ...) {
    char detail[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
#ifdef DT_MPI
    if (dt_test__mpi_rank() >= 0) {
        int rank, size, r, all_ok = 1;
        int *oks = NULL;
        char *details = NULL;
        ok = ok ? 1 : 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (rank == 0) {
            oks = (int *)malloc(sizeof(int) * (size_t)size);
            details = (char *)malloc(sizeof detail * (size_t)size);
        }
        MPI_Gather(&ok, 1, MPI_INT, oks, 1, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Gather(detail, (int)sizeof detail, MPI_CHAR, details, (int)sizeof detail, MPI_CHAR, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            char msg[1024];
            size_t len = 0;
            msg[0] = '\0';
            for (r = 0; r < size; r++) {
                if (oks[r]) continue;
                all_ok = 0;
                if (len < sizeof msg)
                    len += (size_t)snprintf(msg + len, sizeof msg - len, "%srank %d: %s", len ? "; " : "", r,
                                            details + (size_t)r * sizeof detail);
            }
            if (all_ok) dt_test_pass(name);
            else dt_test_fail(name, "%s", msg);
            free(oks);
            free(details);
        }
        MPI_Bcast(&all_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        return all_ok;
    }
#endif
    if (ok) return dt_test_pass(name);
    return dt_test_fail(name, "%s", detail);
}

/* The directory for scratch files: $DT_TEST_TMPDIR (set by the runner), else $TMPDIR, else /tmp. */
DT_TEST__FN const char *dt_test_tmpdir(void) {
    const char *d = getenv("DT_TEST_TMPDIR");
    if (!d || !d[0]) d = getenv("TMPDIR");
    return d && d[0] ? d : "/tmp";
}

/* 1 under `tests/run.sh quick` (DT_TEST_QUICK=1): a test that drives many runs may keep to its
   2-rank ones. */
DT_TEST__FN int dt_test_quick(void) {
    const char *q = getenv("DT_TEST_QUICK");
    return q && q[0] == '1';
}

/* 1 when a driver of examples' binaries should keep to its 2-rank runs: under quick, and in the
   sanitizer build, which instruments the driver, not the example it starts (a plain binary). */
DT_TEST__FN int dt_test_short_run(void) {
#ifdef __SANITIZE_ADDRESS__
    return 1;
#else
    return dt_test_quick();
#endif
}

/* A fixed pseudo-random value in [-1, 1) from an index and a salt (a splitmix-style hash): the
   same on every rank and every run, so multi-rank tests build each rank's share of one input. */
DT_TEST__FN float dt_test_unit(uint64_t i, uint64_t salt) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + salt * 0xD1B54A32D192ED69ull + 1;
    x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* The exit status for main: 0 iff no check failed, on any rank. With MPI running it is
   collective: call it on every rank, before MPI_Finalize. */
DT_TEST__FN int dt_test_finish(void) {
    int failed = dt_test__count[1] > 0;
#ifdef DT_MPI
    if (dt_test__mpi_rank() >= 0) {
        int rank, mine, others = 0, any = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        /* rank 0 has printed its own failures; count the ones only stderr has seen */
        mine = rank == 0 ? 0 : dt_test__count[1];
        MPI_Allreduce(&mine, &others, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0 && others > 0)
            dt_test_fail("checks_on_other_ranks", "%d check(s) failed on ranks other than 0 (see their [rank r] lines)",
                         others);
        /* mpirun kills every rank once one exits non-zero: none leaves before rank 0 has printed */
        MPI_Barrier(MPI_COMM_WORLD);
        return any || others ? 1 : 0;
    }
#endif
    return failed;
}

/* PASS name when ok, else FAIL name with the printf-formatted details (the drivers' one-liner). */
DT_TEST__FN DT_TEST__PRINTF(3, 4) int dt_test_expect(const char *name, int ok, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    if (ok) return dt_test_pass(name);
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dt_test_fail(name, "%s", why);
}

/* The mpirun command line drivers start ranks with: $DT_MPIRUN (tests/run.sh exports it from
   build.sh), else "mpirun --oversubscribe". */
DT_TEST__FN const char *dt_test_mpirun(void) {
    const char *m = getenv("DT_MPIRUN");
    return m && *m ? m : "mpirun --oversubscribe";
}

#ifdef DT_TENSOR_H
/* An f32 [a, b] host tensor of ctx; exits 2 (naming the error) when it cannot be made. */
DT_TEST__FN dt_tensor dt_test_t2(dt_ctx *ctx, int64_t a, int64_t b) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = a; d.shape[1] = b; d.ndim = 2;
    if (dt_tensor_create(ctx, &t, &d)) { fprintf(stderr, "dt_test_t2: %s\n", dt_ctx_error(ctx)); exit(2); }
    return t;
}
#endif

#endif /* DT_TEST_H */
