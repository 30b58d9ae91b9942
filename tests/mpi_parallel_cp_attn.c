// np: 1 2 4
/* tests/mpi_parallel_cp_attn.c - dt_parallel.h's context-parallel attention against a causal
   attention computed here in double over the whole sequence (a loop per query, nothing of dt's):
   the ring (dt_cp_attention_fwd / _bwd) with n_kv_head = n_head, 2 and 1 (grouped-query) and
   Ulysses (dt_cp_ulysses_fwd / _bwd; n_kv_head 4, and 2 where cp divides it), cp = world size
   (1, 2, 4). Each rank holds the zigzag rows
   of dt_cp_position; out within 2e-6 + 2e-5 |ref|, lse within 1e-5 + 1e-5 |ref|, every column of
   dqkv (added to what it held) within 1e-5 + 1e-4 |ref|. Counted, not timed: the pairs each rank's
   forward scored (dt_cp_pairs_done) equal dt_cp_attention_pairs and the closed form (2cp-1) c^2 +
   c (c+1) on every rank, and the schedule's counts at cp 2..16 sum over the ranks to the causal
   T (T+1)/2 (every pair once) while being equal rank to rank; the bytes each rank sends
   (dt_comm_stats on cp_comm) equal the volume formulas: ring 2 S h_kv (CP-1)/CP forward (and
   (2CP-1) blocks backward), Ulysses (2h + 2h_kv) (S/CP) (CP-1)/CP each way. Bad inputs are named
   errors on every rank before any message, and the ring works after them. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_ctx C;
static dt_comm *world;
static int W, R;

#define B 2
#define T 32
#define HS 8
#define H 4

static void die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", R, what, dt_ctx_error(&C));
    exit(2);
}
#define OK(x) do { if ((x) != DT_OK) die(#x); } while (0)

static dt_tensor mk(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32;
    d.ndim = d3 ? 4 : 3;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2; d.shape[3] = d3;
    OK(dt_tensor_create(&C, &t, &d));
    return t;
}
static float *F(dt_tensor *t) { return (float *)t->data; }

/* The reference: causal attention of the whole [B, T, (H + 2 Hkv) HS] qkv in double: out
   [B, T, H HS], lse [B, H, T], and from dout [B, T, H HS] the gradient of qkv. */
typedef struct ref { double out[B * T * H * HS], lse[B * H * T], dqkv[B * T * (3 * H) * HS]; } ref;

static void reference(ref *r, const float *qkv, const float *dout, int hkv) {
    int64_t Wd = (int64_t)(H + 2 * hkv) * HS, Cq = H * HS, Ckv = (int64_t)hkv * HS;
    double scale = 1.0 / sqrt((double)HS), P[T], dP[T];
    int b, h, p, j, c;
    memset(r, 0, sizeof *r);
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++) {
            int g = h / (H / hkv);
            for (p = 0; p < T; p++) {
                const float *q = qkv + (b * T + p) * Wd + h * HS;
                double m = -INFINITY, z = 0, D = 0;
                for (j = 0; j <= p; j++) {
                    const float *k = qkv + (b * T + j) * Wd + Cq + g * HS;
                    double s = 0;
                    for (c = 0; c < HS; c++) s += (double)q[c] * k[c];
                    P[j] = s * scale;
                    if (P[j] > m) m = P[j];
                }
                for (j = 0; j <= p; j++) z += exp(P[j] - m);
                r->lse[(b * H + h) * T + p] = m + log(z);
                for (j = 0; j <= p; j++) {
                    const float *v = qkv + (b * T + j) * Wd + Cq + Ckv + g * HS;
                    const float *go = dout + (b * T + p) * Cq + h * HS;
                    P[j] = exp(P[j] - m) / z;
                    dP[j] = 0;
                    for (c = 0; c < HS; c++) {
                        r->out[(b * T + p) * Cq + h * HS + c] += P[j] * v[c];
                        dP[j] += (double)go[c] * v[c];
                    }
                    D += P[j] * dP[j];
                }
                for (j = 0; j <= p; j++) {
                    const float *k = qkv + (b * T + j) * Wd + Cq + g * HS;
                    const float *go = dout + (b * T + p) * Cq + h * HS;
                    double ds = P[j] * (dP[j] - D) * scale;
                    for (c = 0; c < HS; c++) {
                        r->dqkv[(b * T + p) * Wd + h * HS + c] += ds * k[c];
                        r->dqkv[(b * T + j) * Wd + Cq + g * HS + c] += ds * q[c];
                        r->dqkv[(b * T + j) * Wd + Cq + Ckv + g * HS + c] += P[j] * go[c];
                    }
                }
            }
        }
}

/* Worst |got - want| / (abs + rel |want|) over n values; > 1 fails. */
static double worst(const float *got, const double *want, int64_t n, double abs_, double rel, int64_t *at) {
    double w = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (abs_ + rel * fabs(want[i]));
        if (!(e <= w)) { w = e; *at = i; } /* NaN counts as worst */
    }
    return w;
}

static dt_comm_stat stat_of(dt_comm *c, dt_coll k) {
    dt_comm_stat s;
    memset(&s, 0, sizeof s);
    dt_comm_stats(c, &s, k);
    return s;
}

/* One kind (ring: ulysses = 0) at n_kv_head hkv, cp = world. */
static void run_case(dt_layout *l, int ulysses, int hkv) {
    static ref rf;
    int cp = l->cp, r = l->cp_rank;
    int64_t Tl = T / cp, Wd = (int64_t)(H + 2 * hkv) * HS, Cq = H * HS, Ckv = (int64_t)hkv * HS, j, at = 0, i;
    dt_tensor full = mk(B, T, Wd, 0), dfull = mk(B, T, Cq, 0), qkv = mk(B, Tl, Wd, 0), dout = mk(B, Tl, Cq, 0);
    dt_tensor out = mk(B, Tl, Cq, 0), lse = mk(B, H, Tl, 0), dqkv = mk(B, Tl, Wd, 0), uqkv, att;
    float *got = (float *)malloc(sizeof(float) * B * T * 3 * H * HS);
    double *want = (double *)malloc(sizeof(double) * B * T * 3 * H * HS), w, bytes, formula;
    char name[160];
    int b;
    const char *kind = ulysses ? "ulysses" : "ring";
    for (i = 0; i < full.numel; i++) F(&full)[i] = dt_test_unit((uint64_t)i, 1 + (uint64_t)hkv);
    for (i = 0; i < dfull.numel; i++) F(&dfull)[i] = dt_test_unit((uint64_t)i, 100 + (uint64_t)hkv);
    reference(&rf, F(&full), F(&dfull), hkv);
    for (b = 0; b < B; b++) /* this rank's zigzag rows */
        for (j = 0; j < Tl; j++) {
            int64_t p = dt_cp_position(cp, r, T, j);
            memcpy(F(&qkv) + (b * Tl + j) * Wd, F(&full) + (b * T + p) * Wd, sizeof(float) * (size_t)Wd);
            memcpy(F(&dout) + (b * Tl + j) * Cq, F(&dfull) + (b * T + p) * Cq, sizeof(float) * (size_t)Cq);
        }
    OK(dt_tensor_fill(&C, &dqkv, 0.5)); /* the backward adds to it */
    OK(dt_tensor_fill(&C, &out, 7.0));  /* the forward writes it */
    uqkv = mk(B, T, Wd / cp, 0);
    att = mk(B, H / cp, T, T);
    dt_comm_stats_reset(l->cp_comm);
    if (ulysses) OK(dt_cp_ulysses_fwd(l, &out, &uqkv, &att, &qkv, H, hkv == H ? 0 : hkv));
    else OK(dt_cp_attention_fwd(l, &out, &lse, &qkv, H, hkv == H ? 0 : hkv));
    /* traffic of the forward, per rank, against the formula */
    if (ulysses) {
        bytes = stat_of(l->cp_comm, DT_COLL_ALLTOALL).bytes * (cp - 1) / cp; /* stats count the whole buffer */
        formula = (2.0 * Cq + 2.0 * Ckv) * ((double)T / cp) * (cp - 1) / cp * B * sizeof(float);
    } else {
        bytes = stat_of(l->cp_comm, DT_COLL_SEND).bytes;
        formula = 2.0 * T * Ckv * (cp - 1) / cp * B * sizeof(float);
    }
    snprintf(name, sizeof name, "%s_hkv%d_cp%d_forward_sends_the_formula_per_rank", kind, hkv, cp);
    dt_test_expect(name, fabs(bytes - formula) <= 0.5, "sent %.0f bytes, formula %.0f", bytes, formula);
    for (b = 0; b < B; b++)
        for (j = 0; j < Tl; j++) {
            int64_t p = dt_cp_position(cp, r, T, j), h;
            memcpy(got + (b * Tl + j) * Cq, F(&out) + (b * Tl + j) * Cq, sizeof(float) * (size_t)Cq);
            for (i = 0; i < Cq; i++) want[(b * Tl + j) * Cq + i] = rf.out[(b * T + p) * Cq + i];
            for (h = 0; h < H; h++) {
                got[B * Tl * Cq + (b * H + h) * Tl + j] = F(&lse)[(b * H + h) * Tl + j];
                want[B * Tl * Cq + (b * H + h) * Tl + j] = rf.lse[(b * H + h) * T + p];
            }
        }
    w = worst(got, want, B * Tl * Cq, 2e-6, 2e-5, &at);
    snprintf(name, sizeof name, "%s_hkv%d_cp%d_out_equals_whole_sequence_attention", kind, hkv, cp);
    dt_test_expect(name, w <= 1, "element %lld: %.9g, reference %.9g", (long long)at, got[at], want[at]);
    if (!ulysses) {
        w = worst(got + B * Tl * Cq, want + B * Tl * Cq, B * H * Tl, 1e-5, 1e-5, &at);
        snprintf(name, sizeof name, "ring_hkv%d_cp%d_lse_equals_double", hkv, cp);
        dt_test_expect(name, w <= 1, "element %lld: %.9g, reference %.9g", (long long)at, got[B * Tl * Cq + at],
                       want[B * Tl * Cq + at]);
        snprintf(name, sizeof name, "ring_hkv%d_cp%d_pairs_counted_equal_the_schedule_and_closed_form", hkv, cp);
        {
            int64_t c = T / cp / (cp > 1 ? 2 : 1), closed = cp > 1 ? (2 * cp - 1) * c * c + c * (c + 1) : T * (T + 1) / 2;
            dt_test_expect(name, dt_cp_pairs_done(l) == closed && dt_cp_attention_pairs(cp, r, T) == closed,
                           "rank %d counted %lld, dt_cp_attention_pairs %lld, closed form %lld", r,
                           (long long)dt_cp_pairs_done(l), (long long)dt_cp_attention_pairs(cp, r, T), (long long)closed);
        }
    }
    dt_comm_stats_reset(l->cp_comm);
    if (ulysses) OK(dt_cp_ulysses_bwd(l, &dqkv, &dout, &uqkv, &att, H, hkv == H ? 0 : hkv));
    else OK(dt_cp_attention_bwd(l, &dqkv, &dout, &qkv, &out, &lse, H, hkv == H ? 0 : hkv));
    if (ulysses) {
        bytes = stat_of(l->cp_comm, DT_COLL_ALLTOALL).bytes * (cp - 1) / cp;
        formula = (2.0 * Cq + 2.0 * Ckv) * ((double)T / cp) * (cp - 1) / cp * B * sizeof(float);
    } else { /* K/V again (cp - 1 hops) and the dK/dV sums (cp hops) */
        bytes = stat_of(l->cp_comm, DT_COLL_SEND).bytes;
        formula = cp > 1 ? 2.0 * T * Ckv * (2 * cp - 1) / cp * B * sizeof(float) : 0;
    }
    snprintf(name, sizeof name, "%s_hkv%d_cp%d_backward_sends_the_formula_per_rank", kind, hkv, cp);
    dt_test_expect(name, fabs(bytes - formula) <= 0.5, "sent %.0f bytes, formula %.0f", bytes, formula);
    for (b = 0; b < B; b++)
        for (j = 0; j < Tl; j++) {
            int64_t p = dt_cp_position(cp, r, T, j);
            for (i = 0; i < Wd; i++) {
                got[(b * Tl + j) * Wd + i] = F(&dqkv)[(b * Tl + j) * Wd + i] - 0.5f;
                want[(b * Tl + j) * Wd + i] = rf.dqkv[(b * T + p) * Wd + i];
            }
        }
    w = worst(got, want, B * Tl * Wd, 1e-5, 1e-4, &at);
    snprintf(name, sizeof name, "%s_hkv%d_cp%d_dqkv_equals_whole_sequence_gradient", kind, hkv, cp);
    dt_test_expect(name, w <= 1, "element %lld (column %lld): %.9g, reference %.9g", (long long)at,
                   (long long)(at % Wd), got[at], want[at]);
    free(got);
    free(want);
    dt_tensor_free(&C, &full); dt_tensor_free(&C, &dfull); dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &dout);
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &lse); dt_tensor_free(&C, &dqkv); dt_tensor_free(&C, &uqkv);
    dt_tensor_free(&C, &att);
}

/* The schedule's counts (no processes): equal on every rank at cp 2..16, summing to every causal
   pair once. */
static void balance(void) {
    int cp, c, r;
    for (cp = 2; cp <= 16; cp *= 2)
        for (c = 1; c <= 8; c += 7) {
            int64_t Tq = 2 * (int64_t)cp * c, sum = 0, lo = -1, hi = -1, closed = (2 * (int64_t)cp - 1) * c * c + (int64_t)c * (c + 1);
            char name[96];
            for (r = 0; r < cp; r++) {
                int64_t n = dt_cp_attention_pairs(cp, r, Tq);
                sum += n;
                if (lo < 0 || n < lo) lo = n;
                if (n > hi) hi = n;
            }
            snprintf(name, sizeof name, "pairs_equal_on_every_rank_cp%d_c%d", cp, c);
            dt_test_expect(name, lo == hi && lo == closed, "per rank %lld..%lld, closed form %lld", (long long)lo,
                           (long long)hi, (long long)closed);
            snprintf(name, sizeof name, "pairs_sum_to_every_causal_pair_once_cp%d_c%d", cp, c);
            dt_test_expect(name, sum == Tq * (Tq + 1) / 2, "sum %lld, T (T+1)/2 = %lld", (long long)sum,
                           (long long)(Tq * (Tq + 1) / 2));
        }
    { /* the count is closed-form: T = 2^31 at cp 4 is as quick, and still every pair once */
        int64_t Tb = (int64_t)1 << 31, sum = 0;
        for (r = 0; r < 4; r++) sum += dt_cp_attention_pairs(4, r, Tb);
        dt_test_expect("pairs_at_T_2pow31_sum_to_every_causal_pair", sum == Tb / 2 * (Tb + 1), "sum %lld", (long long)sum);
        DT_TEST_CHECK("pairs_above_2pow31_is_minus_1", dt_cp_attention_pairs(4, 0, Tb + 8) == -1);
    }
    DT_TEST_CHECK("position_cp2_r0_is_chunks_0_and_3", dt_cp_position(2, 0, 16, 3) == 3 && dt_cp_position(2, 0, 16, 4) == 12);
    DT_TEST_CHECK("position_cp2_r1_is_chunks_1_and_2", dt_cp_position(2, 1, 16, 0) == 4 && dt_cp_position(2, 1, 16, 7) == 11);
    DT_TEST_CHECK("position_cp1_is_the_row_any_T", dt_cp_position(1, 0, 7, 6) == 6);
    DT_TEST_CHECK("position_bad_arguments_are_minus_1",
                  dt_cp_position(2, 0, 18, 0) == -1 && dt_cp_position(2, 2, 16, 0) == -1 &&
                  dt_cp_position(2, 0, 16, 8) == -1 && dt_cp_position(0, 0, 16, 0) == -1 &&
                  dt_cp_position(2, 0, 16, -1) == -1 && dt_cp_attention_pairs(3, 0, 8) == -1 &&
                  dt_cp_attention_pairs(2, -1, 8) == -1);
}

/* One bad call on every rank: the status and a message naming the argument, no message sent. */
static void bad(const char *name, dt_status got, dt_status want, const char *needle) {
    dt_test_expect(name, got == want && strstr(dt_ctx_error(&C), needle), "status %d (want %d), message '%s' (want '%s')",
                   (int)got, (int)want, dt_ctx_error(&C), needle);
}

static void bad_inputs(dt_layout *l) {
    int cp = l->cp;
    int64_t Tl = T / cp, Wd = 3 * H * HS;
    dt_tensor qkv = mk(B, Tl, Wd, 0), out = mk(B, Tl, H * HS, 0), lse = mk(B, H, Tl, 0), odd = mk(B, 3, Wd, 0);
    dt_tensor lse_bad = mk(B, H, Tl + 1, 0), wbad = mk(B, Tl, Wd + 1, 0), u1 = mk(B, T, 3 * HS, 0);
    dt_tensor a1 = mk(B, 1, T, T), q1 = mk(B, Tl, 3 * HS, 0), o1 = mk(B, Tl, HS, 0);
    OK(dt_tensor_fill(&C, &qkv, 0.25));
    DT_TEST_CHECK("null_layout_is_arg", dt_cp_attention_fwd(NULL, &out, &lse, &qkv, H, 0) == DT_ERR_ARG);
    bad("kv_heads_not_dividing_heads_named", dt_cp_attention_fwd(l, &out, &lse, &qkv, H, 3), DT_ERR_ARG, "n_kv_head = 3");
    bad("qkv_width_not_heads_times_size_named", dt_cp_attention_fwd(l, &out, &lse, &wbad, H, 0), DT_ERR_SHAPE, "qkv shape");
    bad("lse_shape_named", dt_cp_attention_fwd(l, &out, &lse_bad, &qkv, H, 0), DT_ERR_SHAPE, "lse shape");
    bad("out_as_qkv_named", dt_cp_attention_fwd(l, &qkv, &lse, &qkv, H, 0), DT_ERR_SHAPE, "out shape");
    bad("bwd_dout_shape_named", dt_cp_attention_bwd(l, &qkv, &qkv, &qkv, &out, &lse, H, 0), DT_ERR_SHAPE, "dout shape");
    bad("zero_heads_named", dt_cp_attention_fwd(l, &out, &lse, &qkv, 0, 0), DT_ERR_ARG, "n_head = 0");
    if (cp > 1) {
        dt_tensor lo = mk(B, H, 3, 0), oo = mk(B, 3, H * HS, 0);
        bad("odd_rows_at_cp_named", dt_cp_attention_fwd(l, &oo, &lo, &odd, H, 0), DT_ERR_SHAPE, "expected an even number");
        bad("ulysses_heads_not_dividing_cp_named", dt_cp_ulysses_fwd(l, &o1, &u1, &a1, &q1, 1, 0), DT_ERR_ARG,
            "do not divide over cp");
        dt_tensor_free(&C, &lo);
        dt_tensor_free(&C, &oo);
    }
    { /* an output over an input or another output (the ring fills out and lse, adds into dqkv;
         Ulysses keeps uqkv and att for the backward): named on every rank, before any message */
        dt_tensor dq = mk(B, Tl, Wd, 0), uq = mk(B, T, Wd / cp, 0), at = mk(B, H / cp, T, T), lv, dv, ov;
        int64_t sl[3] = {B, H, Tl}, so[3] = {B, Tl, H * HS};
        OK(dt_tensor_view(&C, &lv, &out, 0, 3, sl));
        bad("ring_lse_inside_out_named", dt_cp_attention_fwd(l, &out, &lv, &qkv, H, 0), DT_ERR_ARG,
            "lse shares memory with out");
        OK(dt_tensor_view(&C, &ov, &qkv, 0, 3, so));
        bad("ring_out_inside_qkv_named", dt_cp_attention_fwd(l, &ov, &lse, &qkv, H, 0), DT_ERR_ARG,
            "out shares memory with qkv");
        OK(dt_tensor_view(&C, &dv, &dq, 0, 3, so));
        bad("ring_bwd_dout_inside_dqkv_named", dt_cp_attention_bwd(l, &dq, &dv, &qkv, &out, &lse, H, 0), DT_ERR_ARG,
            "dqkv shares memory with dout");
        bad("ring_bwd_dqkv_is_qkv_named", dt_cp_attention_bwd(l, &qkv, &out, &qkv, &out, &lse, H, 0), DT_ERR_ARG,
            "dqkv shares memory with");
        OK(dt_tensor_view(&C, &ov, &uq, 0, 3, so));
        bad("ulysses_out_inside_uqkv_named", dt_cp_ulysses_fwd(l, &ov, &uq, &at, &qkv, H, 0), DT_ERR_ARG,
            "out shares memory with uqkv");
        bad("ulysses_bwd_dout_inside_dqkv_named", dt_cp_ulysses_bwd(l, &dq, &dv, &uq, &at, H, 0), DT_ERR_ARG,
            "dqkv shares memory with dout");
        dt_tensor_free(&C, &dq); dt_tensor_free(&C, &uq); dt_tensor_free(&C, &at);
    }
    /* nothing was sent: a good call still pairs up with every other rank */
    DT_TEST_CHECK("ring_works_after_the_bad_calls", dt_cp_attention_fwd(l, &out, &lse, &qkv, H, 0) == DT_OK);
    dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &lse); dt_tensor_free(&C, &odd);
    dt_tensor_free(&C, &lse_bad); dt_tensor_free(&C, &wbad); dt_tensor_free(&C, &u1); dt_tensor_free(&C, &a1);
    dt_tensor_free(&C, &q1); dt_tensor_free(&C, &o1);
}

int main(void) {
    dt_layout *l;
    dt_layout_desc ld;
    int rc;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);
    memset(&ld, 0, sizeof ld);
    ld.cp = W;
    OK(dt_layout_create(world, &l, &ld));
    run_case(l, 0, H);
    run_case(l, 0, 2);
    run_case(l, 0, 1);
    run_case(l, 1, H);
    if (2 % W == 0) run_case(l, 1, 2); /* Ulysses with grouped-query heads: kv heads divide over cp */
    if (W == 1) run_case(l, 1, 1);
    balance();
    bad_inputs(l);
    dt_layout_free(l);
    rc = dt_test_finish();
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return rc;
}
