/* tests/opt/mlp.h - the small model the dt_opt tests train (test_opt.c, mpi_opt_accum.c):
   a 6 -> 8 -> 3 MLP (linear, relu, linear, softmax cross entropy) on a synthetic task whose
   sample i is a pure function of (seed, i). f32 or bf16 parameter values; with bf16 the forward
   runs on f32 copies of the values and the grads are f32, as with master weights. */
#ifndef DT_TEST_OPT_MLP_H
#define DT_TEST_OPT_MLP_H

#if defined(__GNUC__) || defined(__clang__)
#define MLP_FN static __attribute__((unused))
#else
#define MLP_FN static
#endif

#define MLP_IN 6
#define MLP_HID 8
#define MLP_OUT 3
#define MLP_NPARAM (MLP_HID * MLP_IN + MLP_HID + MLP_OUT * MLP_HID + MLP_OUT)

typedef struct mlp {
    dt_ctx *ctx;
    dt_params ps;
    dt_param *w1, *b1, *w2, *b2;
} mlp;

MLP_FN void mlp_die(dt_ctx *ctx, const char *what) {
    fprintf(stderr, "%s: %s\n", what, dt_ctx_error(ctx));
    exit(2);
}

/* Weights w1, w2 (decayed), biases b1, b2 (no_decay), registered in that order. */
MLP_FN void mlp_init(mlp *m, dt_ctx *ctx, dt_dtype dt, uint64_t seed) {
    dt_param_desc d;
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.init.kind = DT_INIT_SCALED_NORMAL;
    d.init.seed = seed;
    d.name = "w1"; d.shape[0] = MLP_HID; d.shape[1] = MLP_IN;
    if (dt_params_add(ctx, &m->ps, &m->w1, &d)) mlp_die(ctx, "mlp_init");
    d.name = "w2"; d.shape[0] = MLP_OUT; d.shape[1] = MLP_HID;
    if (dt_params_add(ctx, &m->ps, &m->w2, &d)) mlp_die(ctx, "mlp_init");
    d.init.kind = DT_INIT_UNIFORM; d.init.low = -0.1; d.init.high = 0.1; d.no_decay = 1;
    d.name = "b1"; d.shape[0] = MLP_HID; d.shape[1] = 0;
    if (dt_params_add(ctx, &m->ps, &m->b1, &d)) mlp_die(ctx, "mlp_init");
    d.name = "b2"; d.shape[0] = MLP_OUT;
    if (dt_params_add(ctx, &m->ps, &m->b2, &d)) mlp_die(ctx, "mlp_init");
}

MLP_FN dt_tensor mlp_tensor(dt_ctx *ctx, dt_dtype dt, int64_t d0, int64_t d1) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.shape[0] = d0;
    d.shape[1] = d1;
    if (dt_tensor_create(ctx, &t, &d)) mlp_die(ctx, "mlp_tensor");
    return t;
}

/* An f32 view of a parameter's value: itself, or a cast copy of a bf16 value (*owned = 1). */
MLP_FN dt_tensor mlp_as_f32(dt_ctx *ctx, dt_param *p, int *owned) {
    dt_tensor t;
    if (p->value.dtype == DT_F32) { *owned = 0; return p->value; }
    t = mlp_tensor(ctx, DT_F32, p->value.shape[0], p->value.ndim > 1 ? p->value.shape[1] : 0);
    if (dt_tensor_cast(ctx, &t, &p->value)) mlp_die(ctx, "mlp_as_f32");
    *owned = 1;
    return t;
}

/* Samples [first, first + n): x ~ N(0, 1), the class drawn uniformly, both from (seed, index). */
MLP_FN void mlp_batch(dt_ctx *ctx, uint64_t seed, int64_t first, int n, dt_tensor *x, dt_tensor *y) {
    int i, k;
    *x = mlp_tensor(ctx, DT_F32, n, MLP_IN);
    *y = mlp_tensor(ctx, DT_I32, n, 0);
    for (i = 0; i < n; i++) {
        for (k = 0; k < MLP_IN; k++)
            ((float *)x->data)[i * MLP_IN + k] = dt_rng_normal(seed, 1, (uint64_t)((first + i) * MLP_IN + k));
        ((int32_t *)y->data)[i] = (int32_t)(dt_rng_uniform(seed, 2, (uint64_t)(first + i)) * MLP_OUT) % MLP_OUT;
    }
}

/* Forward + backward of the samples in x, y; grads += d(dloss * mean loss). Returns the loss. */
MLP_FN float mlp_step(mlp *m, const dt_tensor *x, const dt_tensor *y, float dloss) {
    dt_ctx *ctx = m->ctx;
    int n = (int)x->shape[0], o1, o2, o3, o4;
    dt_tensor w1 = mlp_as_f32(ctx, m->w1, &o1), b1 = mlp_as_f32(ctx, m->b1, &o2);
    dt_tensor w2 = mlp_as_f32(ctx, m->w2, &o3), b2 = mlp_as_f32(ctx, m->b2, &o4);
    dt_tensor h = mlp_tensor(ctx, DT_F32, n, MLP_HID), a = mlp_tensor(ctx, DT_F32, n, MLP_HID);
    dt_tensor lg = mlp_tensor(ctx, DT_F32, n, MLP_OUT), pr = mlp_tensor(ctx, DT_F32, n, MLP_OUT);
    dt_tensor dlg = mlp_tensor(ctx, DT_F32, n, MLP_OUT), da = mlp_tensor(ctx, DT_F32, n, MLP_HID);
    dt_tensor dh = mlp_tensor(ctx, DT_F32, n, MLP_HID);
    float loss = 0;
    dt_status st = dt_linear_fwd(ctx, &h, x, &w1, &b1);
    if (!st) st = dt_relu_fwd(ctx, &a, &h);
    if (!st) st = dt_linear_fwd(ctx, &lg, &a, &w2, &b2);
    if (!st) st = dt_softmax_xent_fwd(ctx, &loss, NULL, &pr, &lg, y, -1);
    if (!st) st = dt_softmax_xent_bwd(ctx, &dlg, &pr, y, -1, dloss);
    if (!st) st = dt_linear_bwd(ctx, &da, &m->w2->grad, &m->b2->grad, &dlg, &a, &w2);
    if (!st) st = dt_relu_bwd(ctx, &dh, &da, &h);
    if (!st) st = dt_linear_bwd(ctx, NULL, &m->w1->grad, &m->b1->grad, &dh, x, &w1);
    if (st) mlp_die(ctx, "mlp_step");
    if (o1) dt_tensor_free(ctx, &w1);
    if (o2) dt_tensor_free(ctx, &b1);
    if (o3) dt_tensor_free(ctx, &w2);
    if (o4) dt_tensor_free(ctx, &b2);
    dt_tensor_free(ctx, &h); dt_tensor_free(ctx, &a); dt_tensor_free(ctx, &lg); dt_tensor_free(ctx, &pr);
    dt_tensor_free(ctx, &dlg); dt_tensor_free(ctx, &da); dt_tensor_free(ctx, &dh);
    return loss;
}

/* Samples [first, first + n) through mlp_step, then the tensors freed. */
MLP_FN float mlp_run(mlp *m, uint64_t seed, int64_t first, int n, float dloss) {
    dt_tensor x, y;
    float loss;
    mlp_batch(m->ctx, seed, first, n, &x, &y);
    loss = mlp_step(m, &x, &y, dloss);
    dt_tensor_free(m->ctx, &x);
    dt_tensor_free(m->ctx, &y);
    return loss;
}

/* Every grad (or value, when values = 1, f32 params only) in registration order into out. */
MLP_FN void mlp_flat(mlp *m, float *out, int values) {
    int64_t off = 0;
    int i;
    for (i = 0; i < m->ps.count; i++) {
        dt_tensor *t = values ? &m->ps.items[i]->value : &m->ps.items[i]->grad;
        memcpy(out + off, t->data, dt_tensor_bytes(t));
        off += t->numel;
    }
}

#endif /* DT_TEST_OPT_MLP_H */
