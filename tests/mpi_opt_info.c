// np: 2 4
/* tests/mpi_opt_info.c - whether dt_opt_step runs a collective never depends on its info
   argument, which a trainer passes where it logs (rank 0) and leaves NULL elsewhere.

   The world trains AdamW with dynamic loss scaling on a parameter sharded over the world (its
   grad norm is summed over the world: desc.norm.shard_comm) and a replicated one, without
   clipping; step 3 overflows on the last rank only, so every rank skips it. Four runs of the
   same 6 steps: info NULL on every rank, info on rank 0 only, on every rank, on the odd ranks
   only. Every step of every run completes (the world's timeout is 20 s: a rank left alone in
   the norm's all-reduce fails instead of hanging the test), the weights, the optimizer state,
   the step and the scale of every run equal the all-NULL run's bitwise, and the grad norm
   rank 0 logs equals the norm of the whole logical grads computed here in double. Dynamic
   scaling with the norm summed over the world but no desc.comm to agree on skips is a named
   error (a step skipped on one rank only would stall the others in the norm). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"
#include "opt/sharded.h"

static dt_ctx C;
static int R, W;

enum { STEPS = 6, BAD_STEP = 3, NORM_STEP = 4, ROWS = 4, COLS = 3, REP = 5 };
enum { INFO_NONE, INFO_RANK0, INFO_ALL, INFO_ODD, N_RUNS };
static const char *const RUN_NAMES[N_RUNS] = {"none", "rank0_only", "every_rank", "odd_ranks_only"};

/* S [ROWS * W, COLS] split by rows, R [REP] whole on every rank; the same initial values in
   every run. */
static void make(dt_params *ps) {
    dt_param_desc pd;
    memset(ps, 0, sizeof *ps);
    memset(&pd, 0, sizeof pd);
    pd.name = "S";
    pd.global_shape[0] = ROWS * W; pd.global_shape[1] = COLS;
    pd.shape[0] = ROWS; pd.shape[1] = COLS;
    pd.start[0] = ROWS * R;
    pd.init.kind = DT_INIT_NORMAL; pd.init.seed = 3; pd.init.std = 1;
    if (dt_params_add(&C, ps, NULL, &pd)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    memset(&pd, 0, sizeof pd);
    pd.name = "R";
    pd.shape[0] = REP;
    pd.init.kind = DT_INIT_NORMAL; pd.init.seed = 3; pd.init.std = 1;
    if (dt_params_add(&C, ps, NULL, &pd)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
}

static void desc_of(dt_opt_desc *d, dt_comm *world) {
    memset(d, 0, sizeof *d);
    d->kind = DT_OPT_ADAMW;
    d->lr = 0.01;
    d->loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
    d->loss_scale.init_scale = 1024; /* powers of two: the unscaled grads are exact */
    d->loss_scale.growth_interval = 2;
    d->comm = world;
    d->norm.shard_comm = world;
}

/* The global norm of the step-t grads of the whole logical tensors, in double, in the order of
   the global index (not the order dt sums in). */
static double ref_norm(int t) {
    double s = 0;
    int64_t k;
    for (k = 0; k < (int64_t)ROWS * W * COLS; k++) s += (double)sh_grad(0, k, t) * (double)sh_grad(0, k, t);
    for (k = 0; k < REP; k++) s += (double)sh_grad(1, k, t) * (double)sh_grad(1, k, t);
    return sqrt(s);
}

/* This rank's bytes of the run's end state: values, exp_avg, exp_avg_sq, step, scale. */
typedef struct snapshot {
    unsigned char bytes[3 * (ROWS * COLS + REP) * 4 + 16];
    size_t n;
} snapshot;

static void snap(snapshot *s, dt_params *ps, dt_optimizer *o) {
    int i, k;
    s->n = 0;
    for (i = 0; i < ps->count; i++) {
        const dt_tensor *t[3];
        t[0] = &ps->items[i]->value; t[1] = &o->slots[i].state[0]; t[2] = &o->slots[i].state[1];
        for (k = 0; k < 3; k++) {
            memcpy(s->bytes + s->n, t[k]->data, dt_tensor_bytes(t[k]));
            s->n += dt_tensor_bytes(t[k]);
        }
    }
    memcpy(s->bytes + s->n, &o->step, 8);
    memcpy(s->bytes + s->n + 8, &o->scaler.scale, 8);
    s->n += 16;
}

/* One run; *norm4 = the grad norm info reported at NORM_STEP on this rank (-1: no info here). */
static void run(dt_comm *world, int mode, snapshot *out, double *norm4) {
    dt_params ps;
    dt_optimizer *o = NULL;
    dt_opt_desc d;
    dt_opt_step_info info;
    dt_status st = DT_OK;
    char name[96], why[160] = "";
    int t, i, use_info, steps_ok = 1;
    int64_t k;
    use_info = mode == INFO_ALL || (mode == INFO_RANK0 && R == 0) || (mode == INFO_ODD && R % 2 == 1);
    *norm4 = -1;
    make(&ps);
    desc_of(&d, world);
    if (dt_opt_create(&C, &o, &ps, &d)) { fprintf(stderr, "opt_create: %s\n", dt_ctx_error(&C)); exit(2); }
    for (t = 1; t <= STEPS && steps_ok; t++) {
        float seed = 0;
        dt_opt_micro_begin(o, &seed, NULL, 0);
        for (i = 0; i < ps.count; i++) { /* a backward seeded with the scale; R's grads are the replicas' mean */
            dt_param *p = ps.items[i];
            for (k = 0; k < p->grad.numel; k++) ((float *)p->grad.data)[k] = sh_grad(i, sh_global_index(p, k), t) * seed;
        }
        if (t == BAD_STEP && R == W - 1) ((float *)ps.items[0]->grad.data)[1] = INFINITY;
        memset(&info, 0, sizeof info);
        st = dt_opt_step(o, use_info ? &info : NULL);
        if (st) {
            steps_ok = 0;
            snprintf(why, sizeof why, "step %d: %.120s", t, dt_ctx_error(&C));
        }
        if (use_info && t == NORM_STEP) *norm4 = info.grad_norm;
    }
    snprintf(name, sizeof name, "opt_step_completes_with_info_on_%s", RUN_NAMES[mode]);
    dt_test_check_all(name, steps_ok, "%s", why);
    snap(out, &ps, o);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
}

int main(void) {
    dt_comm *world;
    dt_comm_desc wd;
    snapshot base, got;
    double norm4, want;
    char name[128];
    int mode;
    dt_ctx_init(&C, NULL);
    memset(&wd, 0, sizeof wd);
    wd.timeout_s = 20;
    if (dt_comm_create_world(&C, &world, &wd)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    want = ref_norm(NORM_STEP);

    run(world, INFO_NONE, &base, &norm4);
    for (mode = INFO_RANK0; mode < N_RUNS; mode++) {
        run(world, mode, &got, &norm4);
        snprintf(name, sizeof name, "info_on_%s_gives_the_all_null_state_bitwise", RUN_NAMES[mode]);
        dt_test_check_all(name, got.n == base.n && memcmp(got.bytes, base.bytes, base.n) == 0,
                          "%zu vs %zu bytes, %s", got.n, base.n,
                          got.n == base.n ? "contents differ" : "sizes differ");
        if (mode != INFO_ODD) {
            snprintf(name, sizeof name, "info_on_%s_logs_the_global_norm_on_rank0", RUN_NAMES[mode]);
            dt_test_check_all(name, R != 0 || fabs(norm4 - want) <= 1e-12 * want, "got %.17g, want %.17g", norm4,
                              want);
        }
    }
    { /* the step skipped at BAD_STEP: 5 updates; the scale grew to 2048 at step 2, backed off to
         1024 at step 3 and grew again at step 5 */
        double scale;
        int64_t step;
        memcpy(&step, base.bytes + base.n - 16, 8);
        memcpy(&scale, base.bytes + base.n - 8, 8);
        dt_test_check_all("overflow_on_last_rank_skips_one_step_everywhere", step == STEPS - 1 && scale == 2048,
                          "step %lld (want %d), scale %g (want 2048)", (long long)step, STEPS - 1, scale);
    }
    { /* scaling + a norm over the world, but nothing to agree on skips with */
        dt_params ps;
        dt_optimizer *o = NULL;
        dt_opt_desc d;
        dt_status st;
        make(&ps);
        desc_of(&d, world);
        d.comm = NULL;
        st = dt_opt_create(&C, &o, &ps, &d);
        dt_test_check_all("scaling_with_world_norm_but_no_comm_is_named",
                          st == DT_ERR_ARG && strstr(dt_ctx_error(&C), "desc.comm is NULL") != NULL, "status %d: %.120s",
                          (int)st, st ? dt_ctx_error(&C) : "created");
        dt_opt_free(o);
        dt_params_free(&C, &ps);
    }
    {
        int rc = dt_test_finish();
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
