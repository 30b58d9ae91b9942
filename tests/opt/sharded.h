/* tests/opt/sharded.h - what the multi-rank checkpoint tests (mpi_opt_ckpt.c, mpi_opt_kill.c)
   train: AdamW steps whose gradients are a pure function of (tensor number, global element
   index, step). Any layout of the same logical tensors (rows or columns split over ranks, or
   whole on one process) therefore reaches the same state bit for bit, and a test can compare
   a sharded, saved and reloaded state with a 1-process run. Each test makes its own tensors
   (dt_param_desc with global_shape and start); 1-d or 2-d, split on one dimension. */
#ifndef DT_TEST_OPT_SHARDED_H
#define DT_TEST_OPT_SHARDED_H

#if defined(__GNUC__) || defined(__clang__)
#define SH_FN static __attribute__((unused))
#else
#define SH_FN static
#endif

/* The gradient of element k (global, row-major) of tensor number `which` at step t. */
SH_FN float sh_grad(int which, int64_t k, int t) { return (float)(0.3 * sin(0.41 * (double)k + 0.9 * which + 0.5 * t)); }

/* The global row-major index of element `local` of p's slice. */
SH_FN int64_t sh_global_index(const dt_param *p, int64_t local) {
    if (p->value.ndim == 1) return p->start[0] + local;
    return (p->start[0] + local / p->value.shape[1]) * p->global_shape[1] + p->start[1] + local % p->value.shape[1];
}

/* AdamW, lr 0.01; c (NULL: this process) is the comm of the loss-scale and norm agreement. */
SH_FN dt_optimizer *sh_adamw(dt_ctx *ctx, dt_params *ps, dt_comm *c) {
    dt_opt_desc d;
    dt_optimizer *o = NULL;
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW;
    d.lr = 0.01;
    d.comm = c;
    d.norm.shard_comm = c;
    if (dt_opt_create(ctx, &o, ps, &d)) { fprintf(stderr, "dt_opt_create: %s\n", dt_ctx_error(ctx)); exit(2); }
    return o;
}

/* Steps first..last: every grad set from sh_grad, then dt_opt_step. */
SH_FN void sh_train(dt_ctx *ctx, dt_params *ps, dt_optimizer *o, int first, int last) {
    int t, i;
    int64_t k;
    for (t = first; t <= last; t++) {
        for (i = 0; i < ps->count; i++) {
            dt_param *p = ps->items[i];
            for (k = 0; k < p->grad.numel; k++) ((float *)p->grad.data)[k] = sh_grad(i, sh_global_index(p, k), t);
        }
        if (dt_opt_step(o, NULL)) { fprintf(stderr, "dt_opt_step: %s\n", dt_ctx_error(ctx)); exit(2); }
    }
}

#endif
