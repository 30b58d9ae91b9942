/* tests/test_bf16_gemm.c - dt_linear with a bf16 weight on the CPU: x and dout rounded to bf16,
   bf16 products, f32 sums, f32 outputs. Every output element is compared with a double-precision
   sum of the same rounded operands; a sum of K products in f32 (in any order) is within
   (K + 1) * 2^-24 * (|c0| + sum |a b|) of it (c0: what dx / dw held before, the += of the
   backward), so the bound is derived, not tuned. Shapes cross the AMX kernel's edges: tiles of 16,
   blocks of 32 x 32, k in steps of 32 and blocks of 512, rows in blocks of 64, columns in blocks
   of 1024, and K = 0.

   The program runs twice: once as the process finds the CPU (AMX where it has AMX-BF16, which
   dt_cpu_bf16_gemm must then say) and once in a child with DT_CPU_BF16=f32 (the f32 fallback
   every other CPU takes). Both ways must be within the bound; bad dtypes are named. */
#define _POSIX_C_SOURCE 200809L
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "dt_tensor.h"
#include "dt_test.h"

static dt_ctx C;

static dt_tensor mk(dt_dtype dt, int64_t r, int64_t c) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt; d.ndim = 2; d.shape[0] = r; d.shape[1] = c;
    if (dt_tensor_create(&C, &t, &d)) { dt_test_fail("setup_create", "%s", dt_ctx_error(&C)); exit(1); }
    return t;
}

static uint64_t g_seed = 12345;
static float rnd(void) { /* uniform in [-2, 2), some exponents apart */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_seed >> 40) / (double)(1ull << 24) * 4.0 - 2.0);
}
static double rb(float v) { return dt_bf16_to_f32(dt_f32_to_bf16(v)); }

/* err / bound at worst over an output [R x Cc]: out[r][c] against c0[r][c] + sum_k a(r, k) b(k, c) */
typedef struct { const float *a; int64_t ars, aks; const void *b; int bbf; int64_t bks, bcs; } prod;
static double pv(const prod *p, int64_t r, int64_t k, int64_t c, double *abs_) {
    double a = rb(p->a[r * p->ars + k * p->aks]);
    double b = p->bbf ? dt_bf16_to_f32(((const uint16_t *)p->b)[k * p->bks + c * p->bcs])
                      : rb(((const float *)p->b)[k * p->bks + c * p->bcs]);
    *abs_ = fabs(a * b);
    return a * b;
}
static double worst_of(const prod *p, const float *out, const float *c0, int64_t R, int64_t Cc, int64_t K,
                       int64_t *wr, int64_t *wc, double *got, double *want) {
    double worst = 0.0;
    int64_t r, c, k;
    for (r = 0; r < R; r++)
        for (c = 0; c < Cc; c++) {
            double s = c0 ? c0[r * Cc + c] : 0.0, sa = fabs(s), e, bound, ab;
            for (k = 0; k < K; k++) { s += pv(p, r, k, c, &ab); sa += ab; }
            bound = (double)(K + 1) * ldexp(1.0, -24) * sa + 1e-30;
            e = fabs(out[r * Cc + c] - s) / bound;
            if (e > worst || e != e) { worst = e != e ? INFINITY : e; *wr = r; *wc = c; *got = out[r * Cc + c]; *want = s; }
        }
    return worst;
}

static void one_shape(const char *way, int64_t N, int64_t In, int64_t Out) {
    dt_tensor x = mk(DT_F32, N, In), w = mk(DT_BF16, Out, In), out = mk(DT_F32, N, Out), dout = mk(DT_F32, N, Out);
    dt_tensor dx = mk(DT_F32, N, In), dw = mk(DT_F32, Out, In);
    float *dx0 = malloc(sizeof(float) * (size_t)(N * In + 1)), *dw0 = malloc(sizeof(float) * (size_t)(Out * In + 1));
    int64_t i, wr = 0, wc = 0;
    double got = 0, want = 0, worst;
    char name[160];
    dt_status st;
    prod p;
    for (i = 0; i < N * In; i++) ((float *)x.data)[i] = rnd();
    for (i = 0; i < Out * In; i++) ((uint16_t *)w.data)[i] = dt_f32_to_bf16(rnd());
    for (i = 0; i < N * Out; i++) ((float *)dout.data)[i] = rnd();
    for (i = 0; i < N * In; i++) ((float *)dx.data)[i] = dx0[i] = rnd();
    for (i = 0; i < Out * In; i++) ((float *)dw.data)[i] = dw0[i] = rnd();
    for (i = 0; i < N * Out; i++) ((float *)out.data)[i] = 1e30f; /* fwd overwrites */

    st = dt_linear_fwd(&C, &out, &x, &w, NULL);
    snprintf(name, sizeof name, "%s_fwd_within_bound_N%lld_In%lld_Out%lld", way, (long long)N, (long long)In, (long long)Out);
    p.a = (const float *)x.data; p.ars = In; p.aks = 1; p.b = w.data; p.bbf = 1; p.bks = 1; p.bcs = In;
    worst = st ? INFINITY : worst_of(&p, (const float *)out.data, NULL, N, Out, In, &wr, &wc, &got, &want);
    if (!dt_test_check_all(name, worst <= 1.0, "%s; worst out[%lld][%lld] = %.9g, want %.9g: %.3g of the bound",
                           st ? dt_ctx_error(&C) : "ok", (long long)wr, (long long)wc, got, want, worst))
        goto done;

    st = dt_linear_bwd(&C, &dx, &dw, NULL, &dout, &x, &w);
    snprintf(name, sizeof name, "%s_dx_within_bound_N%lld_In%lld_Out%lld", way, (long long)N, (long long)In, (long long)Out);
    p.a = (const float *)dout.data; p.ars = Out; p.aks = 1; p.b = w.data; p.bbf = 1; p.bks = In; p.bcs = 1;
    worst = st ? INFINITY : worst_of(&p, (const float *)dx.data, dx0, N, In, Out, &wr, &wc, &got, &want);
    dt_test_check_all(name, worst <= 1.0, "%s; worst dx[%lld][%lld] = %.9g, want %.9g: %.3g of the bound",
                      st ? dt_ctx_error(&C) : "ok", (long long)wr, (long long)wc, got, want, worst);
    snprintf(name, sizeof name, "%s_dw_within_bound_N%lld_In%lld_Out%lld", way, (long long)N, (long long)In, (long long)Out);
    p.a = (const float *)dout.data; p.ars = 1; p.aks = Out; p.b = x.data; p.bbf = 0; p.bks = In; p.bcs = 1;
    worst = st ? INFINITY : worst_of(&p, (const float *)dw.data, dw0, Out, In, N, &wr, &wc, &got, &want);
    dt_test_check_all(name, worst <= 1.0, "%s; worst dw[%lld][%lld] = %.9g, want %.9g: %.3g of the bound",
                      st ? dt_ctx_error(&C) : "ok", (long long)wr, (long long)wc, got, want, worst);
done:
    free(dx0); free(dw0);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &dout); dt_tensor_free(&C, &dx); dt_tensor_free(&C, &dw);
}

/* The product of a row with a NaN is NaN; the other rows stay finite. */
static void nan_row(const char *way) {
    dt_tensor x = mk(DT_F32, 40, 70), w = mk(DT_BF16, 33, 70), out = mk(DT_F32, 40, 33);
    int64_t i, bad = 0;
    char name[96];
    for (i = 0; i < 40 * 70; i++) ((float *)x.data)[i] = rnd();
    for (i = 0; i < 33 * 70; i++) ((uint16_t *)w.data)[i] = dt_f32_to_bf16(rnd());
    ((float *)x.data)[17 * 70 + 69] = NAN;
    dt_linear_fwd(&C, &out, &x, &w, NULL);
    for (i = 0; i < 40 * 33; i++) {
        float v = ((float *)out.data)[i];
        if ((i / 33 == 17) != (v != v)) bad++;
    }
    snprintf(name, sizeof name, "%s_nan_reaches_its_row_only", way);
    dt_test_check_all(name, bad == 0, "%lld elements wrong (row 17 NaN, the rest finite)", (long long)bad);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &out);
}

static void bad_inputs(void) {
    dt_tensor x = mk(DT_F32, 4, 8), xb = mk(DT_BF16, 4, 8), w = mk(DT_BF16, 3, 8), out = mk(DT_F32, 4, 3);
    dt_tensor outb = mk(DT_BF16, 4, 3), dwb = mk(DT_BF16, 3, 8), w7 = mk(DT_BF16, 3, 7), dw = mk(DT_F32, 3, 7);
    dt_status st;
    st = dt_linear_fwd(&C, &out, &xb, &w, NULL);
    dt_test_check_all("bf16_x_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&C), "x"), "status %d: %s", (int)st,
                      dt_ctx_error(&C));
    st = dt_linear_fwd(&C, &outb, &x, &w, NULL);
    dt_test_check_all("bf16_out_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&C), "out"), "status %d: %s",
                      (int)st, dt_ctx_error(&C));
    st = dt_linear_fwd(&C, &out, &x, &w7, NULL);
    dt_test_check_all("bf16_w_shape_is_named", st == DT_ERR_SHAPE && strstr(dt_ctx_error(&C), "w.shape[1]"),
                      "status %d: %s", (int)st, dt_ctx_error(&C));
    st = dt_linear_bwd(&C, NULL, &dwb, NULL, &out, &x, &w);
    dt_test_check_all("bf16_dw_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&C), "dw"), "status %d: %s",
                      (int)st, dt_ctx_error(&C));
    st = dt_linear_bwd(&C, NULL, &dw, NULL, &out, &x, &w);
    dt_test_check_all("bf16_dw_shape_is_named", st == DT_ERR_SHAPE && strstr(dt_ctx_error(&C), "dw"), "status %d: %s",
                      (int)st, dt_ctx_error(&C));
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &xb); dt_tensor_free(&C, &w); dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &outb); dt_tensor_free(&C, &dwb); dt_tensor_free(&C, &w7); dt_tensor_free(&C, &dw);
}

/* /proc/cpuinfo's flags name amx_bf16 and avx512_bf16 */
static int cpu_has_amx(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int amx = 0, bf = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            amx = strstr(line, " amx_bf16") && strstr(line, " amx_tile");
            bf = strstr(line, " avx512_bf16") != NULL;
            break;
        }
    fclose(f);
    return amx && bf;
}

int main(int argc, char **argv) {
    static const int64_t shapes[][3] = {
        {1, 1, 1},     {3, 5, 2},      {16, 32, 16},  {17, 33, 15},   {32, 64, 32},   {33, 31, 47},   {64, 96, 100},
        {65, 513, 40}, {70, 1030, 33}, {130, 40, 70}, {8, 20, 1100},  {2, 3, 0},      {0, 4, 5},      {5, 0, 4},
        {129, 257, 1025}};
    const char *env = getenv("DT_CPU_BF16"), *path, *way;
    int forced = env && !strcmp(env, "f32"), child_status = 0;
    size_t s;
    pid_t pid = -1;
    (void)argc;
    if (dt_ctx_init(&C, NULL)) return 1;
    path = dt_cpu_bf16_gemm();
    way = forced ? "fallback" : strcmp(path, "amx-bf16") ? "f32" : "amx";
    printf("# dt_cpu_bf16_gemm: %s%s\n", path, forced ? " (the child run)" : "");
    if (forced)
        dt_test_check_all("forced_fallback_is_named", strstr(path, "DT_CPU_BF16=f32") != NULL, "\"%s\"", path);
    else
        dt_test_check_all("amx_found_where_the_cpu_has_it", (strcmp(path, "amx-bf16") == 0) == cpu_has_amx(),
                          "dt_cpu_bf16_gemm \"%s\", /proc/cpuinfo %s amx_bf16 + avx512_bf16", path,
                          cpu_has_amx() ? "has" : "lacks");
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++) one_shape(way, shapes[s][0], shapes[s][1], shapes[s][2]);
    nan_row(way);
    if (!forced) {
        bad_inputs();
        fflush(stdout);
        pid = fork();
        if (pid == 0) { /* the fallback, in a child (the way is chosen once a process) */
            setenv("DT_CPU_BF16", "f32", 1);
            execv(argv[0], argv);
            _exit(127);
        }
        if (pid > 0) waitpid(pid, &child_status, 0);
        dt_test_check_all("fallback_child_ran_and_passed", pid > 0 && WIFEXITED(child_status) &&
                          WEXITSTATUS(child_status) == 0, "pid %d, status %d", (int)pid, child_status);
    }
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
