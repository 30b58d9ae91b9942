// np: 2 4
/* tests/mpi_parallel_cp_grid.c - the cp axis of the grid in dt_zero: cp ranks hold the same
   weights and see different tokens, so ZeRO stages 0-3 average the gradients over dp x cp
   (l->dpcp_comm) and shard over it. Each rank contributes a gradient that depends on its world
   rank: the replicated parameters' on its (dp, cp) place (tp ranks of a model agree on those),
   the tensor-parallel one's on its tp rank too; the coordinates come from the formula
   rank = tp + TP * (cp + CP * dp), not from the layout. After 2 steps of SGD (accumulation 1 and
   2) the weights of every rank equal w0 - 2 lr mean(g) over the dp x cp ranks of its tp place,
   computed here by hand; so does the grad norm (each tp slice's mean, summed over tp); the
   memory formula's N is dp x cp; and a ZeRO-3 checkpoint of the cp run loads on one rank at
   ZeRO-0 as the logical tensors. Layouts: cp 2 (np 2), cp 2 x tp 2, dp 2 x cp 2 and cp 4
   (np 4), and dp = world (cp 1) beside them as the control of the reference itself. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;
static dt_comm *world, *self;
static int W, R;

#define NPAR 4
#define TPAR 3     /* the tensor-parallel one: t.w, column-parallel, [4, 3] logical */
#define STEPS 2
#define LR 0.5
static const char *pname[NPAR] = {"a.w", "a.b", "c.w", "t.w"};
static const int64_t pshape[NPAR][2] = {{5, 3}, {3, 0}, {2, 4}, {4, 3}}; /* logical; 5 and 2 rows: uneven shards */
static const int punit[NPAR] = {0, 0, 1, 1};

typedef struct model {
    dt_params ps;
    dt_param *p[NPAR];
    float w0[NPAR][32]; /* this rank's initial values */
    dt_arena *arena;
    dt_layout *l;
    dt_zero *z;
} model;

static void die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", R, what, dt_ctx_error(&C));
    exit(2);
}
#define OK(x) do { if ((x) != DT_OK) die(#x); } while (0)

static void model_init(model *m, dt_comm *comm, const dt_layout_desc *ld, int stage, int accum) {
    dt_arena_desc ad;
    dt_zero_desc zd;
    int i;
    int64_t k;
    memset(m, 0, sizeof *m);
    OK(dt_layout_create(comm, &m->l, ld));
    for (i = 0; i < NPAR; i++) {
        dt_param_desc d;
        memset(&d, 0, sizeof d);
        d.name = pname[i];
        d.dtype = DT_F32;
        if (i == TPAR) OK(dt_tp_param_desc(m->l, &d, DT_TP_COLUMN, pshape[i][0], pshape[i][1]));
        else {
            d.shape[0] = pshape[i][0];
            d.shape[1] = pshape[i][1];
        }
        d.init.kind = DT_INIT_NORMAL;
        d.init.std = 0.5;
        d.init.seed = 5;
        OK(dt_params_add(&C, &m->ps, &m->p[i], &d));
        for (k = 0; k < m->p[i]->value.numel; k++) m->w0[i][k] = ((const float *)m->p[i]->value.data)[k];
    }
    memset(&ad, 0, sizeof ad);
    ad.units = punit;
    OK(dt_arena_create(&C, &m->arena, &m->ps, &ad));
    memset(&zd, 0, sizeof zd);
    zd.stage = stage;
    zd.bucket_bytes = 32; /* several buckets even for this small model */
    zd.opt.kind = DT_OPT_SGD;
    zd.opt.lr = LR;
    zd.opt.accum_steps = accum;
    OK(dt_zero_create(m->l, &m->z, m->arena, &zd));
}

static void model_free(model *m) {
    dt_zero_free(m->z);
    dt_arena_free(m->arena);
    dt_params_free(&C, &m->ps);
    dt_layout_free(m->l);
}

/* The gradient world rank w contributes to element k (of its own slice) of parameter i, under
   tp x cp x dp = TP x CP x DP: coordinates from the formula. */
static double grad_of(int w, int TP, int CP, int i, int64_t k) {
    int tp = w % TP, place = w / TP; /* place = cp + CP * dp, the rank in dp x cp */
    double g = 0.01 * (i + 1) * (double)(k % 7 + 1) + 0.1 * (place + 1) * (place + 1) + 0.03 * (place % CP);
    if (i == TPAR) g += 0.05 * (tp + 1) * (double)(k % 3 + 1);
    return (double)(float)g; /* what the rank adds, in f32 */
}

/* The mean over the dp x cp ranks of tp place tp of that gradient: the reference. */
static double mean_grad(int tp, int DP, int CP, int TP, int i, int64_t k) {
    double s = 0;
    int place;
    for (place = 0; place < DP * CP; place++) s += grad_of(tp + TP * place, TP, CP, i, k);
    return s / (DP * CP);
}

/* One step: every unit's grads += seed x g (last unit first, the ZeRO call order), then step. */
static void train_step(model *m, dt_opt_step_info *info) {
    int micro, u, i, A = dt_zero_optimizer(m->z)->desc.accum_steps;
    for (micro = 0; micro < A; micro++) {
        float seed = 0;
        OK(dt_zero_micro_begin(m->z, &seed, micro));
        OK(dt_zero_backward_begin(m->z));
        for (u = 1; u >= 0; u--) {
            OK(dt_zero_gather(m->z, u));
            for (i = 0; i < NPAR; i++) {
                int64_t k;
                if (punit[i] != u) continue;
                for (k = 0; k < m->p[i]->grad.numel; k++)
                    ((float *)m->p[i]->grad.data)[k] += seed * (float)grad_of(R, m->l->tp, m->l->cp, i, k);
            }
            OK(dt_zero_grad_ready(m->z, u));
            OK(dt_zero_release(m->z, u));
        }
    }
    OK(dt_zero_step(m->z, info));
}

/* PASS iff every weight of this rank is w0 - STEPS lr mean(g) within 1e-6 + 1e-5 |want|. */
static void check_weights(const char *name, model *m, int DP, int CP, int TP) {
    int i, u, bad_i = -1;
    int64_t k, bad_k = -1;
    double got = 0, want = 0;
    int tp = R % TP;
    for (u = 0; u < 2; u++) {
        OK(dt_zero_gather(m->z, u));
        for (i = 0; i < NPAR; i++) {
            if (punit[i] != u) continue;
            for (k = 0; k < m->p[i]->value.numel && bad_i < 0; k++) {
                double g = ((const float *)m->p[i]->value.data)[k];
                double w = m->w0[i][k] - STEPS * LR * mean_grad(tp, DP, CP, TP, i, k);
                if (!(fabs(g - w) <= 1e-6 + 1e-5 * fabs(w))) { bad_i = i; bad_k = k; got = g; want = w; }
            }
        }
        OK(dt_zero_release(m->z, u));
    }
    dt_test_check_all(name, bad_i < 0, "%s[%lld]: got %.9g, want %.9g (w0 - %d x %g x the mean over dp x cp = %d)",
                      bad_i >= 0 ? pname[bad_i] : "-", (long long)bad_k, got, want, STEPS, LR, DP * CP);
}

/* The grad norm: the replicated parameters' mean grads once, the tp slices' each of its own
   dp x cp group, summed over tp. */
static double want_norm(model *m, int DP, int CP, int TP) {
    double s = 0;
    int i, t;
    int64_t k;
    for (i = 0; i < NPAR; i++)
        for (t = 0; t < (i == TPAR ? TP : 1); t++)
            for (k = 0; k < m->p[i]->value.numel; k++) {
                double g = mean_grad(i == TPAR ? t : R % TP, DP, CP, TP, i, k);
                s += g * g;
            }
    return sqrt(s);
}

/* The checkpoint of a ZeRO-3 run loads on one rank (ZeRO-0, dp = cp = tp = 1) as the logical
   tensors: each tp slice of t.w from its own group's mean. */
static void check_checkpoint(const char *name, const char *dir, int DP, int CP, int TP) {
    model m;
    dt_layout_desc one;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    dt_status st;
    int i, bad_i = -1;
    int64_t k, bad_k = -1;
    double got = 0, want = 0;
    memset(&one, 0, sizeof one);
    model_init(&m, self, &one, 0, 1);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    memset(&ts, 0, sizeof ts);
    st = dt_zero_checkpoint_load(m.z, &ts, &cd);
    for (i = 0; i < NPAR && !st; i++)
        for (k = 0; k < m.p[i]->value.numel && bad_i < 0; k++) {
            /* t.w [4, 3]: row r is tp rank r / (4 / TP)'s, element k of its slice */
            int64_t rows = pshape[TPAR][0] / TP, cols = pshape[TPAR][1];
            int tp = i == TPAR ? (int)(k / cols / rows) : 0;
            int64_t kl = i == TPAR ? k - (int64_t)tp * rows * cols : k;
            double g = ((const float *)m.p[i]->value.data)[k];
            double w = m.w0[i][k] - STEPS * LR * mean_grad(tp, DP, CP, TP, i, kl);
            if (!(fabs(g - w) <= 1e-6 + 1e-5 * fabs(w))) { bad_i = i; bad_k = k; got = g; want = w; }
        }
    dt_test_check_all(name, st == DT_OK && ts.step == STEPS && bad_i < 0, "status %d step %lld (%.60s); %s[%lld]: got "
                      "%.9g, want %.9g", (int)st, (long long)ts.step, st ? dt_ctx_error(&C) : "ok",
                      bad_i >= 0 ? pname[bad_i] : "-", (long long)bad_k, got, want);
    model_free(&m);
}

static void run_layout(int DP, int CP, int TP) {
    dt_layout_desc ld;
    char lay[64], name[160], dir[512];
    int stage, accum;
    memset(&ld, 0, sizeof ld);
    ld.dp = DP;
    ld.cp = CP;
    ld.tp = TP;
    snprintf(lay, sizeof lay, "dp%d_cp%d_tp%d", DP, CP, TP);
    for (stage = 0; stage <= 3; stage++)
        for (accum = 1; accum <= 2; accum++) {
            model m;
            dt_opt_step_info info;
            double wn;
            int s;
            model_init(&m, world, &ld, stage, accum);
            if (stage == 0 && accum == 1) { /* the group itself */
                snprintf(name, sizeof name, "%s_zero_group_is_dp_x_cp", lay);
                dt_test_check_all(name, m.l->dpcp == DP * CP && dt_comm_size(m.l->dpcp_comm) == DP * CP &&
                                  dt_comm_rank(m.l->dpcp_comm) == (R / TP) % (DP * CP), "dpcp %d, comm size %d rank %d,"
                                  " want %d %d", m.l->dpcp, dt_comm_size(m.l->dpcp_comm), dt_comm_rank(m.l->dpcp_comm),
                                  DP * CP, (R / TP) % (DP * CP));
            }
            memset(&info, 0, sizeof info);
            for (s = 0; s < STEPS; s++) train_step(&m, &info);
            snprintf(name, sizeof name, "%s_zero%d_accum%d_weights_are_the_mean_over_dp_x_cp", lay, stage, accum);
            check_weights(name, &m, DP, CP, TP);
            wn = want_norm(&m, DP, CP, TP);
            snprintf(name, sizeof name, "%s_zero%d_accum%d_grad_norm_is_of_the_mean_over_dp_x_cp", lay, stage, accum);
            dt_test_check_all(name, fabs(info.grad_norm - wn) <= 1e-5 * wn, "got %.9g, want %.9g", info.grad_norm, wn);
            if (accum == 1) { /* the memory formula's N */
                dt_zero_memory mem;
                double psi_bytes;
                OK(dt_zero_memory_get(m.z, &mem));
                /* f32 SGD without momentum: 4 bytes of value and 4 of grad a parameter, no state */
                psi_bytes = stage == 0 ? 8.0 * mem.psi : stage == 1 ? 8.0 * mem.psi : stage == 2 ?
                            4.0 * mem.psi + 4.0 * mem.psi / (DP * CP) : 8.0 * mem.psi / (DP * CP);
                snprintf(name, sizeof name, "%s_zero%d_memory_formula_has_N_dp_x_cp", lay, stage);
                dt_test_check_all(name, fabs(mem.formula_bytes - psi_bytes) <= 1e-9 * psi_bytes, "formula %s = %.1f "
                                  "bytes, want %.1f (psi %lld, N = %d)", mem.formula, mem.formula_bytes, psi_bytes,
                                  (long long)mem.psi, DP * CP);
            }
            if (stage == 3 && accum == 1) {
                dt_checkpoint_desc cd;
                dt_train_state ts;
                snprintf(dir, sizeof dir, "%s/cp_grid_%s_np%d", dt_test_tmpdir(), lay, W);
                memset(&cd, 0, sizeof cd);
                cd.dir = dir;
                memset(&ts, 0, sizeof ts);
                ts.step = STEPS;
                OK(dt_zero_checkpoint_save(m.z, &ts, &cd));
            }
            model_free(&m);
        }
    snprintf(name, sizeof name, "%s_zero3_checkpoint_loads_at_zero0_np1_as_the_logical_tensors", lay);
    check_checkpoint(name, dir, DP, CP, TP);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);
    OK(dt_comm_split(world, &self, R, 0));
    run_layout(W, 1, 1); /* the control: cp 1 */
    if (W >= 2 && W % 2 == 0) run_layout(W / 2, 2, 1);
    if (W == 4) {
        run_layout(1, 2, 2);
        run_layout(1, 4, 1);
    }
    {
        int rc = dt_test_finish();
        dt_comm_free(self);
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
