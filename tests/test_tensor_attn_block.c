/* tests/test_tensor_attn_block.c - dt_attention_block_fwd / _bwd (one block of the online softmax,
   with its logsumexp: what context parallelism computes on each ring step) against:
   (1) dt_attention_fwd / _bwd over the whole sequence (itself checked against the scalar loops
       and finite differences in test_tensor_attn.c): the rows of any split of [0, T) into query
       and key blocks, merged in a scrambled order, give its output and gradients within stated
       bounds; one block of every key gives its output bit for bit;
   (2) the logsumexp of each row computed in double from the scores;
   (3) grouped-query attention against dt_attention on K/V heads repeated H / Hkv times (and the
       K/V gradients summed over the query heads that share them);
   (4) context parallelism's zigzag: a tensor holding chunks r and 2P-1-r of the sequence, keys
       arriving a rank's two chunks at a time, equals those rows of the whole;
   (5) itself: blocks above the diagonal change nothing, bad inputs are named. */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_test.h"

static dt_ctx C;

#define DT_TEST_CHECK_MSG(name, cond, ...) ((cond) ? dt_test_pass(name) : dt_test_fail(name, __VA_ARGS__))

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return ((double)((rng_state * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}

static dt_tensor mk(int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.ndim = ndim;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2; d.shape[3] = d3;
    if (dt_tensor_create(&C, &t, &d)) { fprintf(stderr, "create: %s\n", dt_ctx_error(&C)); exit(2); }
    return t;
}
static float *F(const dt_tensor *t) { return (float *)t->data; }
static void rnd(dt_tensor *t, double lo, double hi) {
    int64_t i;
    for (i = 0; i < t->numel; i++) F(t)[i] = (float)(lo + (hi - lo) * urand());
}
static void fill(dt_tensor *t, float v) {
    int64_t i;
    for (i = 0; i < t->numel; i++) F(t)[i] = v;
}
static void ok(dt_status st, const char *what) {
    if (st) { fprintf(stderr, "%s: %s\n", what, dt_ctx_error(&C)); exit(2); }
}

/* max |got - want| / (atol + rtol |want|) over n strided elements (<= 1 passes); prints the worst */
static int close_enough(const char *name, const float *got, const float *want, int64_t n, double atol, double rtol) {
    int64_t i, at = 0;
    double worst = 0;
    for (i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]) / (atol + rtol * fabs((double)want[i]));
        if (!(e <= worst)) { worst = e; at = i; }
    }
    if (worst <= 1.0) { dt_test_pass(name); return 1; }
    dt_test_fail(name, "element %lld: got %.9g, want %.9g (%.3g of the bound %g + %g |want|)", (long long)at,
                 (double)got[at], (double)want[at], worst, atol, rtol);
    return 0;
}

/* kv [B, T, 2C] from qkv [B, T, 3C]: each row's k then v */
static void take_kv(dt_tensor *kv, const dt_tensor *qkv, int64_t Ckv, int64_t C3) {
    int64_t r, R = kv->shape[0] * kv->shape[1];
    for (r = 0; r < R; r++) memcpy(F(kv) + r * 2 * Ckv, F(qkv) + r * C3 + (C3 - 2 * Ckv), (size_t)(2 * Ckv) * sizeof(float));
}

/* The blocks of [0, T) cut at `cuts` (n cuts, increasing, inside (0, T)). */
static int blocks(int64_t T, const int64_t *cuts, int n, int64_t *lo, int64_t *len) {
    int i, k = 0;
    int64_t at = 0;
    for (i = 0; i <= n; i++) {
        int64_t end = i < n ? cuts[i] : T;
        lo[k] = at; len[k] = end - at; k++;
        at = end;
    }
    return k;
}

/* (1), (2): a split, merged in a scrambled order, against dt_attention; with the GQA reference
   when Hkv < H (3). */
static void split_case(int64_t B, int64_t T, int H, int Hkv, int64_t hs, const int64_t *cuts, int ncuts) {
    char name[128];
    int64_t C3, Cq = H * hs, Ckv = Hkv * hs, b, t, i, c, lo[16], len[16];
    int h, nb, qi, ki, rep = H / Hkv;
    dt_tensor qkv, kv, out, lse, rqkv, rout, ratt, dout, rdq, dq, dkv;
    dt_attn_block d;
    double worst_lse = 0;
    C3 = Cq + 2 * Ckv;
    snprintf(name, sizeof name, "B%lld_T%lld_H%d_Hkv%d_hs%lld_%dblocks", (long long)B, (long long)T, H, Hkv, (long long)hs, ncuts + 1);
    qkv = mk(3, B, T, C3, 0); rnd(&qkv, -1.5, 1.5);
    kv = mk(3, B, T, 2 * Ckv, 0); take_kv(&kv, &qkv, Ckv, C3);
    out = mk(3, B, T, Cq, 0); lse = mk(3, B, H, T, 0);
    fill(&lse, -INFINITY);
    nb = blocks(T, cuts, ncuts, lo, len);
    memset(&d, 0, sizeof d);
    d.n_head = H; d.n_kv_head = Hkv;
    for (qi = 0; qi < nb; qi++)
        for (ki = 0; ki < nb; ki++) { /* keys in the order nb-1, 0, nb-2, 1, ...: not the sequence's */
            int kb = ki % 2 ? ki / 2 : nb - 1 - ki / 2;
            d.q_row = lo[qi]; d.q_rows = len[qi]; d.q_pos = lo[qi];
            d.k_row = lo[kb]; d.k_rows = len[kb]; d.k_pos = lo[kb];
            ok(dt_attention_block_fwd(&C, &out, &lse, &qkv, &kv, &d), "block fwd");
        }
    /* the reference: the K/V heads repeated (GQA) into a plain qkv */
    rqkv = mk(3, B, T, 3 * Cq, 0);
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++) {
            const float *src = F(&qkv) + (b * T + t) * C3;
            float *dst = F(&rqkv) + (b * T + t) * 3 * Cq;
            memcpy(dst, src, (size_t)Cq * sizeof(float));
            for (h = 0; h < H; h++) {
                memcpy(dst + Cq + h * hs, src + Cq + (h / rep) * hs, (size_t)hs * sizeof(float));
                memcpy(dst + 2 * Cq + h * hs, src + Cq + Ckv + (h / rep) * hs, (size_t)hs * sizeof(float));
            }
        }
    rout = mk(3, B, T, Cq, 0); ratt = mk(4, B, H, T, T);
    ok(dt_attention_fwd(&C, &rout, &ratt, &rqkv, H), "attention fwd");
    snprintf(name + strlen(name), sizeof name - strlen(name), "_fwd_equals_dt_attention");
    close_enough(name, F(&out), F(&rout), out.numel, 2e-6, 2e-5);
    /* lse in double from the scores */
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++)
            for (t = 0; t < T; t++) {
                const float *q = F(&qkv) + (b * T + t) * C3 + h * hs;
                double mx = -INFINITY, s = 0, sc[512], l;
                for (i = 0; i <= t; i++) {
                    const float *k = F(&qkv) + (b * T + i) * C3 + Cq + (h / rep) * hs;
                    double dot = 0;
                    for (c = 0; c < hs; c++) dot += (double)q[c] * (double)k[c];
                    sc[i] = dot / sqrt((double)hs);
                    if (sc[i] > mx) mx = sc[i];
                }
                for (i = 0; i <= t; i++) s += exp(sc[i] - mx);
                l = mx + log(s);
                if (fabs(F(&lse)[(b * H + h) * T + t] - l) / (1e-6 + 1e-6 * fabs(l)) > worst_lse)
                    worst_lse = fabs(F(&lse)[(b * H + h) * T + t] - l) / (1e-6 + 1e-6 * fabs(l));
            }
    name[strlen(name) - strlen("_fwd_equals_dt_attention")] = 0;
    strcat(name, "_lse_equals_double");
    DT_TEST_CHECK_MSG(name, worst_lse <= 1.0, "worst |lse - double| is %.3g of 1e-6 + 1e-6 |lse|", worst_lse);
    /* the backward: every pair's gradients added up against dt_attention_bwd's */
    dout = mk(3, B, T, Cq, 0); rnd(&dout, -1, 1);
    rdq = mk(3, B, T, 3 * Cq, 0);
    ok(dt_attention_bwd(&C, &rdq, &dout, &rqkv, &ratt, H), "attention bwd");
    dq = mk(3, B, T, C3, 0); dkv = mk(3, B, T, 2 * Ckv, 0);
    for (ki = 0; ki < nb; ki++)
        for (qi = nb - 1; qi >= 0; qi--) {
            d.q_row = lo[qi]; d.q_rows = len[qi]; d.q_pos = lo[qi];
            d.k_row = lo[ki]; d.k_rows = len[ki]; d.k_pos = lo[ki];
            ok(dt_attention_block_bwd(&C, &dq, &dkv, &dout, &qkv, &kv, &out, &lse, &d), "block bwd");
        }
    {   /* the reference's grads in dq's / dkv's layout: dk, dv summed over the heads that share them */
        float *wq = (float *)calloc((size_t)(B * T * Cq), sizeof(float)), *gq = (float *)calloc((size_t)(B * T * Cq), sizeof(float));
        float *wkv = (float *)calloc((size_t)(B * T * 2 * Ckv), sizeof(float)), *gkv = (float *)calloc((size_t)(B * T * 2 * Ckv), sizeof(float));
        char n2[160];
        if (!wq || !gq || !wkv || !gkv) exit(2);
        for (b = 0; b < B * T; b++) {
            memcpy(wq + b * Cq, F(&rdq) + b * 3 * Cq, (size_t)Cq * sizeof(float));
            memcpy(gq + b * Cq, F(&dq) + b * C3, (size_t)Cq * sizeof(float));
            memcpy(gkv + b * 2 * Ckv, F(&dkv) + b * 2 * Ckv, (size_t)(2 * Ckv) * sizeof(float));
            for (h = 0; h < H; h++)
                for (c = 0; c < hs; c++) {
                    wkv[b * 2 * Ckv + (h / rep) * hs + c] += F(&rdq)[b * 3 * Cq + Cq + h * hs + c];
                    wkv[b * 2 * Ckv + Ckv + (h / rep) * hs + c] += F(&rdq)[b * 3 * Cq + 2 * Cq + h * hs + c];
                }
        }
        snprintf(n2, sizeof n2, "%s", name);
        n2[strlen(n2) - strlen("_lse_equals_double")] = 0;
        strcat(n2, "_dq_equals_dt_attention");
        close_enough(n2, gq, wq, B * T * Cq, 1e-5, 1e-4);
        n2[strlen(n2) - strlen("_dq_equals_dt_attention")] = 0;
        strcat(n2, "_dkv_equals_dt_attention");
        close_enough(n2, gkv, wkv, B * T * 2 * Ckv, 1e-5, 1e-4);
        free(wq); free(gq); free(wkv); free(gkv);
    }
    dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &kv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &lse);
    dt_tensor_free(&C, &rqkv); dt_tensor_free(&C, &rout); dt_tensor_free(&C, &ratt); dt_tensor_free(&C, &dout);
    dt_tensor_free(&C, &rdq); dt_tensor_free(&C, &dq); dt_tensor_free(&C, &dkv);
}

/* One block of every key: dt_attention_fwd's bits (the same GEMMs and softmax rows). */
static void one_block_bitwise(void) {
    int64_t B = 2, T = 150, H = 3, hs = 8, Cq = H * hs;
    dt_tensor qkv = mk(3, B, T, 3 * Cq, 0), kv = mk(3, B, T, 2 * Cq, 0), out = mk(3, B, T, Cq, 0), lse = mk(3, B, H, T, 0);
    dt_tensor rout = mk(3, B, T, Cq, 0), att = mk(4, B, H, T, T);
    dt_attn_block d;
    memset(&d, 0, sizeof d);
    rnd(&qkv, -2, 2);
    take_kv(&kv, &qkv, Cq, 3 * Cq);
    fill(&lse, -INFINITY);
    d.n_head = (int)H; d.q_rows = T; d.k_rows = T;
    ok(dt_attention_block_fwd(&C, &out, &lse, &qkv, &kv, &d), "block fwd");
    ok(dt_attention_fwd(&C, &rout, &att, &qkv, (int)H), "attention fwd");
    DT_TEST_CHECK_MSG("one_block_of_every_key_is_dt_attention_bit_for_bit",
                      memcmp(out.data, rout.data, dt_tensor_bytes(&out)) == 0, "outputs differ (first %.9g vs %.9g)",
                      (double)F(&out)[0], (double)F(&rout)[0]);
    /* a block above the diagonal (keys after every query): nothing changes, lse included */
    {
        float *save = (float *)malloc(dt_tensor_bytes(&out)), *save_l = (float *)malloc(dt_tensor_bytes(&lse));
        if (!save || !save_l) exit(2);
        memcpy(save, out.data, dt_tensor_bytes(&out));
        memcpy(save_l, lse.data, dt_tensor_bytes(&lse));
        d.q_row = 0; d.q_rows = 40; d.q_pos = 0; d.k_row = 50; d.k_rows = 30; d.k_pos = 40;
        ok(dt_attention_block_fwd(&C, &out, &lse, &qkv, &kv, &d), "block fwd");
        DT_TEST_CHECK("block_above_the_diagonal_changes_nothing",
                      !memcmp(save, out.data, dt_tensor_bytes(&out)) && !memcmp(save_l, lse.data, dt_tensor_bytes(&lse)));
        free(save); free(save_l);
    }
    dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &kv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &lse);
    dt_tensor_free(&C, &rout); dt_tensor_free(&C, &att);
}

/* (4) the zigzag of context parallelism at P ranks: rank r's tensor holds chunks r and 2P-1-r
   (c rows each); it sees every rank's two chunks of K/V in ring order. */
static void zigzag_case(int P, int64_t c) {
    int64_t B = 2, H = 2, hs = 4, Cq = H * hs, T = 2 * P * c, t, b;
    dt_tensor qkv = mk(3, B, T, 3 * Cq, 0), rout = mk(3, B, T, Cq, 0), att = mk(4, B, H, T, T);
    dt_tensor lq = mk(3, B, 2 * c, 3 * Cq, 0), lkv = mk(3, B, 2 * c, 2 * Cq, 0), out = mk(3, B, 2 * c, Cq, 0);
    dt_tensor lse = mk(3, B, H, 2 * c, 0);
    dt_attn_block d;
    double worst = 0;
    int r, s, i, j, k;
    char name[96];
    rnd(&qkv, -1.5, 1.5);
    ok(dt_attention_fwd(&C, &rout, &att, &qkv, (int)H), "attention fwd");
    memset(&d, 0, sizeof d);
    d.n_head = (int)H;
    for (r = 0; r < P; r++) {
        int64_t qc[2] = {r, 2 * P - 1 - r};
        for (b = 0; b < B; b++)
            for (i = 0; i < 2; i++)
                memcpy(F(&lq) + (b * 2 * c + i * c) * 3 * Cq, F(&qkv) + (b * T + qc[i] * c) * 3 * Cq,
                       (size_t)(c * 3 * Cq) * sizeof(float));
        fill(&out, 0);
        fill(&lse, -INFINITY);
        for (k = 0; k < P; k++) {
            int64_t kc[2];
            s = (r - k + P) % P; /* the ring: own chunks first, then from r-1, r-2, ... */
            kc[0] = s; kc[1] = 2 * P - 1 - s;
            for (b = 0; b < B; b++)
                for (i = 0; i < 2; i++)
                    for (t = 0; t < c; t++)
                        memcpy(F(&lkv) + (b * 2 * c + i * c + t) * 2 * Cq, F(&qkv) + (b * T + kc[i] * c + t) * 3 * Cq + Cq,
                               (size_t)(2 * Cq) * sizeof(float));
            for (i = 0; i < 2; i++)
                for (j = 0; j < 2; j++) {
                    d.q_row = i * c; d.q_rows = c; d.q_pos = qc[i] * c;
                    d.k_row = j * c; d.k_rows = c; d.k_pos = kc[j] * c;
                    ok(dt_attention_block_fwd(&C, &out, &lse, &lq, &lkv, &d), "block fwd");
                }
        }
        for (b = 0; b < B; b++)
            for (i = 0; i < 2; i++)
                for (t = 0; t < c * Cq; t++) {
                    double g = F(&out)[(b * 2 * c + i * c) * Cq + t], w = F(&rout)[(b * T + qc[i] * c) * Cq + t];
                    double e = fabs(g - w) / (2e-6 + 2e-5 * fabs(w));
                    if (e > worst) worst = e;
                }
    }
    snprintf(name, sizeof name, "zigzag_P%d_chunk%lld_rows_equal_dt_attention", P, (long long)c);
    DT_TEST_CHECK_MSG(name, worst <= 1.0, "worst element is %.3g of the bound 2e-6 + 2e-5 |want|", worst);
    dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &rout); dt_tensor_free(&C, &att); dt_tensor_free(&C, &lq);
    dt_tensor_free(&C, &lkv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &lse);
}

static void bad_inputs(void) {
    dt_tensor q = mk(3, 2, 8, 24, 0), kv = mk(3, 2, 8, 16, 0), out = mk(3, 2, 8, 8, 0), lse = mk(3, 2, 2, 8, 0);
    dt_tensor lse_bad = mk(3, 2, 3, 8, 0), dq = mk(3, 2, 8, 24, 0), dkv_bad = mk(3, 2, 8, 12, 0);
    dt_attn_block d;
    dt_status st;
    memset(&d, 0, sizeof d);
    d.n_head = 2; d.q_rows = 8; d.k_rows = 8;
    fill(&lse, -INFINITY);
    st = dt_attention_block_fwd(&C, &out, &lse, &q, &kv, NULL);
    dt_test_error("null_desc_is_named", st, dt_ctx_error(&C), "d is NULL");
    d.n_kv_head = 3;
    st = dt_attention_block_fwd(&C, &out, &lse, &q, &kv, &d);
    dt_test_error("kv_heads_not_dividing_heads_is_named", st, dt_ctx_error(&C), "n_kv_head = 3");
    d.n_kv_head = 0;
    d.q_row = 4; /* rows [4, 12) of 8 */
    st = dt_attention_block_fwd(&C, &out, &lse, &q, &kv, &d);
    dt_test_error("query_rows_past_the_tensor_are_named", st, dt_ctx_error(&C), "q_row = 4");
    d.q_row = 0; d.k_pos = -1;
    st = dt_attention_block_fwd(&C, &out, &lse, &q, &kv, &d);
    dt_test_error("negative_position_is_named", st, dt_ctx_error(&C), "k_pos = -1");
    d.k_pos = 0;
    st = dt_attention_block_fwd(&C, &out, &lse_bad, &q, &kv, &d);
    dt_test_error("lse_shape_is_named", st, dt_ctx_error(&C), "lse shape");
    {
        dt_tensor out_bad = mk(3, 2, 8, 6, 0); /* 2 heads of 4 columns: out rows of 8 */
        st = dt_attention_block_fwd(&C, &out_bad, &lse, &q, &kv, &d);
        dt_test_error("out_shape_is_named", st, dt_ctx_error(&C), "out shape");
        dt_tensor_free(&C, &out_bad);
    }
    d.n_head = 2; d.n_kv_head = 2;
    {
        dt_tensor kv_wide = mk(3, 2, 8, 64, 0); /* head size 16: queries need 32 columns of 24 */
        st = dt_attention_block_fwd(&C, &out, &lse, &q, &kv_wide, &d);
        dt_test_error("query_rows_too_narrow_are_named", st, dt_ctx_error(&C), "q.shape[2] = 24");
        dt_tensor_free(&C, &kv_wide);
    }
    st = dt_attention_block_bwd(&C, &dq, &dkv_bad, &out, &q, &kv, &out, &lse, &d);
    dt_test_error("dkv_shape_is_named", st, dt_ctx_error(&C), "dkv shape");
    dt_tensor_free(&C, &q); dt_tensor_free(&C, &kv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &lse);
    dt_tensor_free(&C, &lse_bad); dt_tensor_free(&C, &dq); dt_tensor_free(&C, &dkv_bad);
}

int main(void) {
    static const int64_t c1[1] = {64}, c2[2] = {37, 101}, c3[3] = {1, 2, 70}, c4[1] = {5};
    if (dt_ctx_init(&C, NULL)) return 2;
    split_case(2, 150, 3, 3, 8, c2, 2);   /* blocks across the 64-row tiles */
    split_case(1, 65, 2, 2, 3, c1, 1);    /* a tail of one row; head size 3 (the 4-lane tails) */
    split_case(2, 80, 4, 2, 5, c3, 3);    /* GQA 4 / 2, blocks of 1 and 1 row */
    split_case(1, 13, 4, 1, 16, c4, 1);   /* GQA 4 / 1 (multi-query) */
    one_block_bitwise();
    zigzag_case(2, 5);
    zigzag_case(4, 17);
    bad_inputs();
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
