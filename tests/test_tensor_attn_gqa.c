/* tests/test_tensor_attn_gqa.c - dt_attention_gqa_fwd / _bwd (grouped-query attention: n_kv_head K
   dividing n_head H, qkv rows [q of H heads | k of K | v of K]) against dt_attention_fwd / _bwd
   (multi-head, itself checked in test_tensor_attn.c) on the same queries with each K/V head
   repeated H / K times, the K/V gradients then summed over the query heads that share them:
   out and att bit for bit (the same GEMMs on the same numbers), dq bit for bit, dk and dv within
   1e-6 + 1e-5 |ref| (the sum over a group runs in another order). K = H is dt_attention itself,
   bit for bit. T 1, 5, 64 and 97 (the 64-row blocks and a ragged one); K in {1, 2, 4} of H 4, K 3
   of H 6; B 2; the backward adds to what dqkv held. Bad inputs (K not dividing H, K <= 0, a qkv
   width not (H + 2K) x head size, att of another H) are named errors. */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_test.h"

static dt_ctx C;

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float urand(void) {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (float)(((double)((rng_state * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0 * 2.0 - 1.0);
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

/* Worst |a - b| / (abs + rel |b|) over n; > 1 fails. */
static double worst(const float *a, const float *b, int64_t n, double abs_, double rel, int64_t *at) {
    double w = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / (abs_ + rel * fabs((double)b[i]));
        if (!(e <= w)) { w = e; *at = i; }
    }
    return w;
}

static void one(int64_t B, int64_t T, int H, int K, int64_t hs) {
    int64_t W = (H + 2 * (int64_t)K) * hs, C3 = 3 * H * hs, Cq = H * hs, Ckv = K * hs, b, t, i, at = 0;
    int h, grp = H / K;
    dt_tensor qkv = mk(3, B, T, W, 0), full = mk(3, B, T, C3, 0), out = mk(3, B, T, Cq, 0), ref = mk(3, B, T, Cq, 0);
    dt_tensor att = mk(4, B, H, T, T), aref = mk(4, B, H, T, T), dout = mk(3, B, T, Cq, 0);
    dt_tensor dqkv = mk(3, B, T, W, 0), dfull = mk(3, B, T, C3, 0), want = mk(3, B, T, W, 0);
    char name[128];
    double w;
    for (i = 0; i < qkv.numel; i++) F(&qkv)[i] = urand();
    for (i = 0; i < dout.numel; i++) F(&dout)[i] = urand();
    for (b = 0; b < B; b++) /* the MHA twin: query head h gets kv head h / grp */
        for (t = 0; t < T; t++) {
            const float *src = F(&qkv) + (b * T + t) * W;
            float *dst = F(&full) + (b * T + t) * C3;
            memcpy(dst, src, sizeof(float) * (size_t)Cq);
            for (h = 0; h < H; h++) {
                memcpy(dst + Cq + h * hs, src + Cq + (h / grp) * hs, sizeof(float) * (size_t)hs);
                memcpy(dst + 2 * Cq + h * hs, src + Cq + Ckv + (h / grp) * hs, sizeof(float) * (size_t)hs);
            }
        }
    if (dt_attention_gqa_fwd(&C, &out, &att, &qkv, H, K) || dt_attention_fwd(&C, &ref, &aref, &full, H)) {
        dt_test_fail("gqa_fwd_runs", "%s", dt_ctx_error(&C));
        return;
    }
    snprintf(name, sizeof name, "gqa_fwd_equals_mha_on_repeated_kv_bitwise_B%lld_T%lld_H%d_K%d", (long long)B,
             (long long)T, H, K);
    dt_test_expect(name, !memcmp(out.data, ref.data, dt_tensor_bytes(&out)) && !memcmp(att.data, aref.data,
                   dt_tensor_bytes(&att)), "out or att differs");
    dt_tensor_fill(&C, &dqkv, 0.25); /* the backward adds */
    dt_tensor_fill(&C, &dfull, 0.0);
    if (dt_attention_gqa_bwd(&C, &dqkv, &dout, &qkv, &att, H, K) || dt_attention_bwd(&C, &dfull, &dout, &full, &aref, H)) {
        dt_test_fail("gqa_bwd_runs", "%s", dt_ctx_error(&C));
        return;
    }
    dt_tensor_fill(&C, &want, 0.0);
    for (b = 0; b < B; b++) /* dq as it is; dk, dv summed over each group, in head order */
        for (t = 0; t < T; t++) {
            const float *src = F(&dfull) + (b * T + t) * C3;
            float *dst = F(&want) + (b * T + t) * W;
            for (i = 0; i < Cq; i++) dst[i] = 0.25f + src[i];
            for (h = 0; h < H; h++)
                for (i = 0; i < hs; i++) {
                    dst[Cq + (h / grp) * hs + i] += src[Cq + h * hs + i];
                    dst[Cq + Ckv + (h / grp) * hs + i] += src[2 * Cq + h * hs + i];
                }
            for (i = Cq; i < W; i++) dst[i] += 0.25f;
        }
    w = worst(F(&dqkv), F(&want), dqkv.numel, 1e-6, 1e-5, &at);
    snprintf(name, sizeof name, "gqa_bwd_equals_mha_summed_over_groups_B%lld_T%lld_H%d_K%d", (long long)B, (long long)T,
             H, K);
    dt_test_expect(name, w <= 1, "element %lld (column %lld): %.9g, reference %.9g", (long long)at, (long long)(at % W),
                   F(&dqkv)[at], F(&want)[at]);
    dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &full); dt_tensor_free(&C, &out); dt_tensor_free(&C, &ref);
    dt_tensor_free(&C, &att); dt_tensor_free(&C, &aref); dt_tensor_free(&C, &dout); dt_tensor_free(&C, &dqkv);
    dt_tensor_free(&C, &dfull); dt_tensor_free(&C, &want);
}

static void bad(const char *name, dt_status got, dt_status want, const char *needle) {
    dt_test_expect(name, got == want && strstr(dt_ctx_error(&C), needle), "status %d (want %d), message '%s' (want '%s')",
                   (int)got, (int)want, dt_ctx_error(&C), needle);
}

int main(void) {
    static const int64_t Ts[4] = {1, 5, 64, 97};
    int i;
    dt_ctx_init(&C, NULL);
    for (i = 0; i < 4; i++) {
        one(2, Ts[i], 4, 1, 8);
        one(2, Ts[i], 4, 2, 8);
        one(2, Ts[i], 4, 4, 8);
        one(1, Ts[i], 6, 3, 4);
    }
    {
        dt_tensor qkv = mk(3, 1, 4, 6 * 8, 0), out = mk(3, 1, 4, 4 * 8, 0), att = mk(4, 1, 4, 4, 4), att3 = mk(4, 1, 3, 4, 4);
        dt_tensor odd = mk(3, 1, 4, 6 * 8 + 1, 0);
        bad("gqa_kv_heads_not_dividing_named", dt_attention_gqa_fwd(&C, &out, &att, &qkv, 4, 3), DT_ERR_ARG, "n_kv_head = 3");
        bad("gqa_kv_heads_zero_named", dt_attention_gqa_fwd(&C, &out, &att, &qkv, 4, 0), DT_ERR_ARG, "n_kv_head = 0");
        bad("gqa_width_named", dt_attention_gqa_fwd(&C, &out, &att, &odd, 4, 1), DT_ERR_SHAPE, "is not (n_head + 2 n_kv_head)");
        bad("gqa_att_heads_named", dt_attention_gqa_fwd(&C, &out, &att3, &qkv, 4, 1), DT_ERR_SHAPE, "att shape");
        bad("gqa_bwd_kv_heads_named", dt_attention_gqa_bwd(&C, &odd, &out, &qkv, &att, 4, 3), DT_ERR_ARG, "n_kv_head = 3");
        bad("gqa_bwd_dqkv_is_qkv_named", dt_attention_gqa_bwd(&C, &qkv, &out, &qkv, &att, 4, 1), DT_ERR_ARG,
            "dqkv shares memory with qkv");
        dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &att); dt_tensor_free(&C, &att3);
        dt_tensor_free(&C, &odd);
    }
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
