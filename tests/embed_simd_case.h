/* tests/embed_simd_case.h - one training run of dt_embed.h that touches every pooling path the
   SIMD code and the prefetches sit in (f32 sum, weighted, mean, sequence, bf16; dims 1, 5, 7, 13,
   16, 64; SGD, Adagrad, row-wise Adagrad, Adam; one accumulated step), and the DLRM dot
   interaction, written once and included by tests/test_embed_simd.c (SSE2) and
   tests/embed_nosimd.c (DT_EMBED_NO_SIMD, DT_TENSOR_NO_SIMD): both must give the same bits.
   Needs dt_tensor.h, dt_comm.h, dt_opt.h and dt_embed.h (with their implementation) included. */
#ifndef EMBED_SIMD_CASE_H
#define EMBED_SIMD_CASE_H
#include <string.h>

#define ESC_T 6       /* tables */
#define ESC_F 8       /* features */
#define ESC_B 37      /* samples */
#define ESC_STEPS 4
#define ESC_MAX_FLOATS (1 << 20)

/* Runs ESC_STEPS forward + backward steps (step 1 accumulates: dt_embed_set_sync 0) and writes
   every pooled output, every sequence row, and at the end every table's rows (as f32) to out.
   Returns the floats written, or -1 on an error (the message in ctx). */
static int64_t esc_run(dt_ctx *ctx, float *out) {
    static const int dims[ESC_T] = {13, 16, 7, 8, 5, 64};
    static const int feat_tab[ESC_F] = {0, 1, 2, 3, 4, 5, 0, 1};
    static const char *names[ESC_T] = {"sum13", "wsum16", "mean7", "bf8", "seq5", "sum64"};
    dt_embed_table_desc t[ESC_T];
    dt_embed_feature_desc fd[ESC_F];
    dt_embed_desc d;
    dt_embed *e = NULL;
    int64_t lengths[ESC_F * ESC_B], ids[ESC_F * ESC_B * 6], n = 0, i, o = 0, pd, s;
    float wts[ESC_F * ESC_B * 6];
    dt_kjt k;
    dt_tensor pooled, dout;
    dt_tensor_desc td;
    int f;
    memset(t, 0, sizeof t);
    for (i = 0; i < ESC_T; i++) {
        t[i].name = names[i]; t[i].rows = 50 + 17 * i; t[i].dim = dims[i];
        t[i].init.kind = DT_INIT_NORMAL; t[i].init.std = 1;
        t[i].optim.kind = (dt_embed_optim)(DT_EMBED_SGD + i % 4); t[i].optim.lr = 0.05;
    }
    t[1].weighted = 1;
    t[5].weighted = 1; /* a weighted table wider than 32 columns: the pooling's register path */
    t[0].sharding = t[1].sharding = t[3].sharding = t[5].sharding = DT_SHARD_TABLE; /* the owner's gather pass
                                                          (the planner would make these small tables data-parallel) */
    t[2].pooling = DT_POOL_MEAN;
    t[3].dtype = DT_BF16; t[3].optim.kind = DT_EMBED_ROWWISE_ADAGRAD;
    t[4].pooling = DT_POOL_NONE;
    for (f = 0; f < ESC_F; f++) { fd[f].name = names[feat_tab[f]]; fd[f].table = feat_tab[f]; }
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = ESC_T; d.features = fd; d.n_features = ESC_F; d.seed = 11;
    if (dt_embed_create(ctx, &e, &d)) return -1;
    pd = dt_embed_pooled_dim(e);
    memset(&td, 0, sizeof td);
    td.shape[0] = ESC_B; td.shape[1] = pd; td.ndim = 2;
    if (dt_tensor_create(ctx, &pooled, &td)) { dt_embed_free(e); return -1; }
    if (dt_tensor_create(ctx, &dout, &td)) { dt_tensor_free(ctx, &pooled); dt_embed_free(e); return -1; }
    for (s = 0; s < ESC_STEPS; s++) {
        n = 0;
        for (i = 0; i < ESC_F * ESC_B; i++) {   /* bags of 0..5 ids, duplicates common */
            int64_t j, len = (int64_t)(dt_rng_uniform(77, (uint64_t)s, (uint64_t)i) * 6.0f);
            lengths[i] = len > 5 ? 5 : len;
            for (j = 0; j < lengths[i]; j++, n++) {
                int64_t rows = t[feat_tab[i / ESC_B]].rows;
                ids[n] = (int64_t)(dt_rng_uniform(78, (uint64_t)s, (uint64_t)n) * (float)rows) % rows;
                wts[n] = dt_rng_normal(79, (uint64_t)s, (uint64_t)n);
            }
        }
        memset(&k, 0, sizeof k);
        k.n_features = ESC_F; k.batch = ESC_B; k.lengths = lengths; k.ids = ids; k.weights = wts;
        for (i = 0; i < ESC_B * pd; i++) ((float *)dout.data)[i] = dt_rng_normal(80, (uint64_t)s, (uint64_t)i);
        if (dt_embed_set_sync(e, s == 1 ? 0 : 1) || dt_embed_forward(e, &pooled, &k)) goto fail;
        if (o + ESC_B * pd > ESC_MAX_FLOATS) goto fail;
        memcpy(out + o, pooled.data, (size_t)(ESC_B * pd) * sizeof(float));
        o += ESC_B * pd;
        {   /* the sequence feature: its rows out, a gradient in */
            dt_tensor sv, sg;
            if (dt_embed_sequence(e, &sv, 4) || dt_embed_sequence_grad(e, &sg, 4)) goto fail;
            if (o + sv.numel > ESC_MAX_FLOATS) goto fail;
            memcpy(out + o, sv.data, (size_t)sv.numel * sizeof(float));
            o += sv.numel;
            for (i = 0; i < sg.numel; i++) ((float *)sg.data)[i] = dt_rng_normal(81, (uint64_t)s, (uint64_t)i);
        }
        if (dt_embed_backward(e, &dout)) goto fail;
    }
    for (i = 0; i < ESC_T; i++) {
        dt_tensor w;
        int64_t r0, c0, j;
        memset(&w, 0, sizeof w);
        if (dt_embed_local_shard(e, &w, &r0, &c0, (int)i)) goto fail;
        if (o + w.numel > ESC_MAX_FLOATS) goto fail;
        for (j = 0; j < w.numel; j++)
            out[o + j] = w.dtype == DT_BF16 ? dt_bf16_to_f32(((const uint16_t *)w.data)[j]) : ((const float *)w.data)[j];
        o += w.numel;
    }
    dt_tensor_free(ctx, &pooled); dt_tensor_free(ctx, &dout);
    dt_embed_free(e);
    return o;
fail:
    dt_tensor_free(ctx, &pooled); dt_tensor_free(ctx, &dout);
    dt_embed_free(e);
    return -1;
}

/* dot interaction forward then backward (grads accumulate onto the given values) on [B, D] and
   [B, F, D]; out [B, D + (F+1)F/2], ddense [B, D], demb [B, F, D] hold the results. */
static int esc_dot(dt_ctx *ctx, float *out, float *ddense, float *demb, const float *dense, const float *emb,
                   const float *dout, int64_t B, int64_t F, int64_t D) {
    dt_tensor a, b, o, da, db, g;
    dt_tensor_desc td;
    int st = 0;
    int64_t W = D + (F + 1) * F / 2;
    memset(&td, 0, sizeof td);
    td.ndim = 2; td.shape[0] = B; td.shape[1] = D;
    if (dt_tensor_create(ctx, &a, &td) || dt_tensor_create(ctx, &da, &td)) return 1;
    td.ndim = 3; td.shape[1] = F; td.shape[2] = D;
    if (dt_tensor_create(ctx, &b, &td) || dt_tensor_create(ctx, &db, &td)) return 1;
    td.ndim = 2; td.shape[1] = W; td.shape[2] = 0;
    if (dt_tensor_create(ctx, &o, &td) || dt_tensor_create(ctx, &g, &td)) return 1;
    memcpy(a.data, dense, (size_t)(B * D) * sizeof(float));
    memcpy(b.data, emb, (size_t)(B * F * D) * sizeof(float));
    memcpy(g.data, dout, (size_t)(B * W) * sizeof(float));
    memcpy(da.data, ddense, (size_t)(B * D) * sizeof(float));
    memcpy(db.data, demb, (size_t)(B * F * D) * sizeof(float));
    st = dt_dot_interaction_fwd(ctx, &o, &a, &b) || dt_dot_interaction_bwd(ctx, &da, &db, &g, &a, &b);
    memcpy(out, o.data, (size_t)(B * W) * sizeof(float));
    memcpy(ddense, da.data, (size_t)(B * D) * sizeof(float));
    memcpy(demb, db.data, (size_t)(B * F * D) * sizeof(float));
    dt_tensor_free(ctx, &a); dt_tensor_free(ctx, &b); dt_tensor_free(ctx, &o);
    dt_tensor_free(ctx, &da); dt_tensor_free(ctx, &db); dt_tensor_free(ctx, &g);
    return st;
}
#endif
