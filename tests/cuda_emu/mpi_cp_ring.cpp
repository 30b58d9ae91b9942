// np: 2 4
// tests/cuda_emu/mpi_cp_ring.cpp - dt_parallel.h's ring attention (dt_cp_attention_fwd / _bwd) with
// a bf16 qkv on CUDA tensors, on the emulator: its blocks on the tensor cores (kernels/dt_flash.cu's
// block mode, each block merged into out and lse), K/V sent round the ring in bf16, the dK/dV sums
// in f32. Against the same ring on CPU tensors in f32 on the same values (qkv rounded to bf16
// first; tests/mpi_parallel_cp_attn.c holds that ring to whole-sequence attention in double), cp =
// world size (2, 4), n_kv_head 4, 2 and 1 of 4 heads of size 64, T / cp rows of chunks of 24 (off
// the kernels' 16- and 64-row tiles).
//
// Bounds: the kernels round P, dS and dout to bf16 before their products (FlashAttention-2's
// precision; tests/cuda_emu/k_flash.cpp holds them to per-element bounds, some 2e-2 of |want| +
// rms at worst), so out, dq, dk and dv are held to 2^-4 of |want| + rms(want) (16 bf16 roundoffs);
// a block missed, merged twice or masked at the wrong positions is an error of the values' own
// size. lse (f32 sums of exact bf16 products) within 1e-4 (|want| + 1). The bytes each rank sends
// (dt_comm_stats on cp_comm): forward (cp - 1) K/V blocks in bf16; backward the same again and cp
// dK/dV sums in f32. A bf16 qkv on the CPU, and bf16 at a head size the kernels do not take, are
// named errors on every rank before any message.
#include <math.h>
#include <cuda_runtime.h>
#include <vector>
#define DT_CUDA
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "tests/dt_test.h"

static dt_ctx C;
static int R, W;

#define B 2
#define H 4
#define HS 64
#define CH 24 /* rows of a chunk: a rank holds two */

static void die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", R, what, dt_ctx_error(&C));
    exit(2);
}
#define OK(x) do { if ((x) != DT_OK) die(#x); } while (0)

static dt_tensor mk(dt_device dev, dt_dtype dt, int64_t d0, int64_t d1, int64_t d2) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.device = dev;
    d.dtype = dt;
    d.ndim = 3;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2;
    OK(dt_tensor_create(&C, &t, &d));
    return t;
}
static float *F(dt_tensor *t) { return (float *)t->data; }

/* A cpu copy (f32) of a cuda tensor. */
static dt_tensor down(const dt_tensor *d) {
    dt_tensor h = mk(DT_CPU, d->dtype, d->shape[0], d->shape[1], d->shape[2]);
    OK(dt_tensor_copy(&C, &h, d));
    return h;
}
static dt_tensor up(const dt_tensor *h) {
    dt_tensor d = mk(DT_CUDA_DEVICE, h->dtype, h->shape[0], h->shape[1], h->shape[2]);
    OK(dt_tensor_copy(&C, &d, h));
    return d;
}

/* max over [lo, hi) columns of each row (width w) of |got - want| / (|want| + rms(want)), *at. */
static double worst(const float *got, const float *want, int64_t n, int64_t w, int64_t lo, int64_t hi, int64_t *at) {
    double ss = 0, m = 0;
    int64_t i, k = 0;
    for (i = 0; i < n; i++)
        if (i % w >= lo && i % w < hi) ss += (double)want[i] * want[i], k++;
    double rms = k ? sqrt(ss / (double)k) : 0;
    *at = 0;
    for (i = 0; i < n; i++) {
        if (i % w < lo || i % w >= hi) continue;
        double e = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + rms + 1e-30);
        if (!(e <= m)) m = e != e ? INFINITY : e, *at = i;
    }
    return m;
}

static double sent(dt_comm *c) {
    dt_comm_stat s;
    memset(&s, 0, sizeof s);
    dt_comm_stats(c, &s, DT_COLL_SEND);
    return (double)s.bytes;
}

static void run_case(dt_layout *l, int hkv) {
    const int cp = l->cp, r = l->cp_rank, kvh = hkv == H ? 0 : hkv;
    const int64_t T = 2 * (int64_t)cp * CH, Tl = T / cp, Wd = (int64_t)(H + 2 * hkv) * HS, Cq = H * HS;
    const int64_t Ckv = (int64_t)hkv * HS;
    dt_tensor qkv = mk(DT_CPU, DT_F32, B, Tl, Wd), dout = mk(DT_CPU, DT_F32, B, Tl, Cq);
    dt_tensor out = mk(DT_CPU, DT_F32, B, Tl, Cq), lse = mk(DT_CPU, DT_F32, B, H, Tl);
    dt_tensor dqkv = mk(DT_CPU, DT_F32, B, Tl, Wd), q16 = mk(DT_CPU, DT_BF16, B, Tl, Wd);
    char name[160];
    int64_t b, j, i, at;
    for (b = 0; b < B; b++) /* this rank's zigzag rows of the whole sequence's values */
        for (j = 0; j < Tl; j++) {
            int64_t p = dt_cp_position(cp, r, T, j);
            for (i = 0; i < Wd; i++)
                F(&qkv)[(b * Tl + j) * Wd + i] = dt_bf16_to_f32(dt_f32_to_bf16(dt_test_unit((uint64_t)((b * T + p) * Wd + i), 3 + hkv)));
            for (i = 0; i < Cq; i++) F(&dout)[(b * Tl + j) * Cq + i] = dt_test_unit((uint64_t)((b * T + p) * Cq + i), 50 + hkv);
        }
    OK(dt_tensor_cast(&C, &q16, &qkv)); /* exact: the values are bf16's */
    OK(dt_tensor_fill(&C, &dqkv, 0.5));
    /* the cuda ring, from a bf16 qkv */
    dt_tensor dq16 = up(&q16), ddout = up(&dout), dout_c = up(&out), dlse = up(&lse), ddqkv = up(&dqkv);
    OK(dt_tensor_fill(&C, &dout_c, 7.0)); /* written, not added */
    dt_comm_stats_reset(l->cp_comm);
    OK(dt_cp_attention_fwd(l, &dout_c, &dlse, &dq16, H, kvh));
    double fwd_bytes = sent(l->cp_comm), fwd_want = (double)(cp - 1) * B * Tl * 2 * Ckv * 2;
    dt_comm_stats_reset(l->cp_comm);
    OK(dt_cp_attention_bwd(l, &ddqkv, &ddout, &dq16, &dout_c, &dlse, H, kvh));
    double bwd_bytes = sent(l->cp_comm), bwd_want = (double)(cp - 1) * B * Tl * 2 * Ckv * 2 + (double)cp * B * Tl * 2 * Ckv * 4;
    /* the cpu ring in f32 on the same values */
    OK(dt_cp_attention_fwd(l, &out, &lse, &qkv, H, kvh));
    OK(dt_cp_attention_bwd(l, &dqkv, &dout, &qkv, &out, &lse, H, kvh));
    dt_tensor go = down(&dout_c), gl = down(&dlse), gg = down(&ddqkv);
    snprintf(name, sizeof name, "ring_bf16_hkv%d_cp%d_forward_sends_kv_in_bf16", hkv, cp);
    dt_test_check_all(name, fwd_bytes == fwd_want, "sent %.0f bytes, (cp - 1) bf16 K/V blocks are %.0f",
                      fwd_bytes, fwd_want);
    snprintf(name, sizeof name, "ring_bf16_hkv%d_cp%d_backward_sends_kv_bf16_and_dkv_f32", hkv, cp);
    dt_test_check_all(name, bwd_bytes == bwd_want, "sent %.0f bytes, the formula %.0f", bwd_bytes, bwd_want);
    struct part { const char *what; const float *got, *want; int64_t n, w, lo, hi; } parts[4] = {
        {"out", F(&go), F(&out), out.numel, Cq, 0, Cq},
        {"dq", F(&gg), F(&dqkv), dqkv.numel, Wd, 0, Cq},
        {"dk", F(&gg), F(&dqkv), dqkv.numel, Wd, Cq, Cq + Ckv},
        {"dv", F(&gg), F(&dqkv), dqkv.numel, Wd, Cq + Ckv, Wd},
    };
    double wmax = 0;
    for (int k = 0; k < 4; k++) {
        double e = worst(parts[k].got, parts[k].want, parts[k].n, parts[k].w, parts[k].lo, parts[k].hi, &at);
        wmax = fmax(wmax, e);
        snprintf(name, sizeof name, "ring_bf16_hkv%d_cp%d_%s_within_2^-4_of_the_f32_ring", hkv, cp, parts[k].what);
        dt_test_check_all(name, e <= 1.0 / 16, "[%lld]: %.7g on the tensor cores, %.7g in f32: %.3g of |want| + rms",
                          (long long)at, (double)parts[k].got[at], (double)parts[k].want[at], e);
    }
    int64_t bad = 0, first = 0;
    for (i = 0; i < lse.numel; i++)
        if (!(fabs(F(&gl)[i] - F(&lse)[i]) <= 1e-4 * (fabs(F(&lse)[i]) + 1)) && bad++ == 0) first = i;
    snprintf(name, sizeof name, "ring_bf16_hkv%d_cp%d_lse_matches_the_f32_ring", hkv, cp);
    dt_test_check_all(name, !bad, "%lld of %lld; first [%lld] %.7g, want %.7g", (long long)bad,
                      (long long)lse.numel, (long long)first, (double)F(&gl)[first], (double)F(&lse)[first]);
    if (R == 0) printf("ring bf16 hkv %d cp %d: worst |diff| / (|want| + rms) %.3g (bound 0.0625)\n", hkv, cp, wmax);
    dt_tensor *all[] = {&qkv, &dout, &out, &lse, &dqkv, &q16, &dq16, &ddout, &dout_c, &dlse, &ddqkv, &go, &gl, &gg};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) dt_tensor_free(&C, all[k]);
}

/* One bad call on every rank: the status and a message naming what is wrong. */
static void bad(const char *name, dt_status got, dt_status want, const char *needle) {
    dt_test_check_all(name, got == want && strstr(dt_ctx_error(&C), needle), "status %d (want %d), message '%s' (want "
                      "'%s')", (int)got, (int)want, dt_ctx_error(&C), needle);
}

static void refusals(dt_layout *l) {
    const int64_t Tl = 2 * CH, Wd = 3 * H * HS;
    dt_tensor q16 = mk(DT_CPU, DT_BF16, B, Tl, Wd), out = mk(DT_CPU, DT_F32, B, Tl, H * HS), lse = mk(DT_CPU, DT_F32, B, H, Tl);
    dt_tensor cq = mk(DT_CUDA_DEVICE, DT_BF16, B, Tl, 3 * H * 8), cout = mk(DT_CUDA_DEVICE, DT_F32, B, Tl, H * 8);
    dt_tensor clse = mk(DT_CUDA_DEVICE, DT_F32, B, H, Tl);
    bad("ring_bf16_qkv_on_the_cpu_named", dt_cp_attention_fwd(l, &out, &lse, &q16, H, 0), DT_ERR_DTYPE,
        "bf16 qkv on cuda only");
    bad("ring_bf16_head_size_8_named", dt_cp_attention_fwd(l, &cout, &clse, &cq, H, 0), DT_ERR_UNSUPPORTED,
        "head size 8");
    /* nothing was sent: a good call still pairs up with every other rank */
    dt_tensor f32 = mk(DT_CUDA_DEVICE, DT_F32, B, Tl, 3 * H * 8);
    OK(dt_tensor_fill(&C, &f32, 0.25));
    dt_test_check_all("ring_works_after_the_bf16_refusals", dt_cp_attention_fwd(l, &cout, &clse, &f32, H, 0) == DT_OK,
                      "%s", dt_ctx_error(&C));
    dt_tensor *all[] = {&q16, &out, &lse, &cq, &cout, &clse, &f32};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) dt_tensor_free(&C, all[k]);
}

int main(void) {
    dt_comm *world = NULL;
    dt_layout *l;
    dt_layout_desc ld;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    memset(&ld, 0, sizeof ld);
    ld.cp = W;
    OK(dt_layout_create(world, &l, &ld));
    run_case(l, H);
    run_case(l, 2);
    run_case(l, 1);
    refusals(l);
    dt_layout_free(l);
    int rc = dt_test_finish();
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return rc;
}
