/* tests/test_blas_note.c - dt_blas_note and dt_blas_rerun: OpenBLAS's kernels against the CPU.
   The program runs itself as a child twice, with --report (which calls dt_blas_rerun first, as
   the examples' main does, then prints OpenBLAS's kernels, OPENBLAS_CORETYPE and the note):
     OPENBLAS_CORETYPE=Prescott   OpenBLAS takes its SSE3 kernels whatever the CPU: on a CPU with
                                  AVX2 and FMA dt_blas_note must name them and the fitting
                                  type (SkylakeX with AVX-512 F/BW/VL/DQ, else Haswell), and
                                  dt_blas_rerun must leave the user's variable alone;
     OPENBLAS_CORETYPE unset      after dt_blas_rerun no note is left: OpenBLAS's own choice
                                  fitted, or the program ran again with the type the note named
                                  (the case of an OpenBLAS older than the CPU model). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include "dt_tensor.h"
#include "dt_test.h"

char *openblas_get_corename(void);

/* /proc/cpuinfo's flags: 2 with AVX-512 F/BW/VL/DQ, 1 with AVX2 and FMA, else 0 */
static int cpu_level(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int lv = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            if (strstr(line, " avx2") && strstr(line, " fma")) lv = 1;
            if (lv && strstr(line, " avx512f") && strstr(line, " avx512bw") && strstr(line, " avx512vl") &&
                strstr(line, " avx512dq"))
                lv = 2;
            break;
        }
    fclose(f);
    return lv;
}

/* the child's one line: core=<OpenBLAS's kernels> env=<OPENBLAS_CORETYPE or -> note=<0 or its text> */
static int run_child(const char *self, const char *env, char *out, size_t cap) {
    char cmd[4096];
    FILE *p;
    size_t n;
    snprintf(cmd, sizeof cmd, "%s '%s' --report 2>/dev/null", env ? env : "env -u OPENBLAS_CORETYPE", self);
    if (!(p = popen(cmd, "r"))) return 0;
    n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    return pclose(p) == 0 && n > 0;
}

int main(int argc, char **argv) {
    char out[1024], want[64];
    int lv = cpu_level(), ok;
    if (argc > 1 && !strcmp(argv[1], "--report")) {
        const char *e, *note;
        dt_blas_rerun(argv);
        e = getenv("OPENBLAS_CORETYPE");
        note = dt_blas_note();
        printf("core=%s env=%s note=%s\n", openblas_get_corename(), e ? e : "-", note ? note : "0");
        return 0;
    }
    printf("# OpenBLAS: %s; this CPU: %s\n", openblas_get_corename(),
           lv == 2 ? "AVX-512" : lv ? "AVX2 + FMA" : "neither AVX2 nor AVX-512");

    ok = run_child(argv[0], "OPENBLAS_CORETYPE=Prescott", out, sizeof out);
    printf("# forced: %s", out);
    dt_test_check_all("forced_prescott_child_ran", ok && !strncmp(out, "core=Prescott env=Prescott ", strlen("core=Prescott env=Prescott ")), "\"%s\"", out);
    snprintf(want, sizeof want, "OPENBLAS_CORETYPE=%s", lv == 2 ? "SkylakeX" : "Haswell");
    if (lv)
        dt_test_check_all("old_kernels_are_named_with_the_fit", strstr(out, "took its Prescott kernels") && strstr(out, want),
                          "\"%s\", want \"%s\"", out, want);
    else
        dt_test_check_all("no_note_without_avx2", strstr(out, "note=0") != NULL, "\"%s\"", out);

    ok = run_child(argv[0], NULL, out, sizeof out);
    printf("# unset: %s", out);
    dt_test_check_all("unset_child_ran", ok, "\"%s\"", out);
    dt_test_check_all("no_note_after_rerun", strstr(out, " note=0") != NULL, "\"%s\"", out);
    if (!strstr(out, " env=- ")) /* it ran again: with the fitting type, which OpenBLAS took */
        dt_test_check_all("rerun_took_the_fitting_kernels",
                          (lv == 2 && strstr(out, "core=SkylakeX env=SkylakeX")) ||
                          (lv == 1 && strstr(out, "core=Haswell env=Haswell")), "\"%s\"", out);
    return dt_test_finish();
}
