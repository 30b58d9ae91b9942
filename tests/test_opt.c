/* tests/test_opt.c - unit tests of dt_opt.h on one process: each optimizer against its
   documented formula computed here in double, schedules at hand-derived points, loss-scaler
   dynamics with injected inf/NaN, bf16 master weights, gradient accumulation equal to one big
   batch, clipping, bitwise resume (fp32 and bf16 master), checkpoint crash safety (a child
   killed by SIGKILL inside save), truncated / corrupt / foreign / mismatched checkpoints, and
   the named errors of bad arguments. */
#define _POSIX_C_SOURCE 200809L /* fork, waitpid: the crash test */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"
#include "opt/mlp.h"

#include <dirent.h>
#include <float.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static dt_ctx C;

/* ---------------------------------------------------------------- helpers */

static dt_param *add(dt_params *ps, const char *name, dt_dtype dt, int64_t d0, int64_t d1) {
    dt_param_desc d;
    dt_param *p = NULL;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.dtype = dt;
    d.shape[0] = d0;
    d.shape[1] = d1;
    if (dt_params_add(&C, ps, &p, &d)) { fprintf(stderr, "params_add: %s\n", dt_ctx_error(&C)); exit(2); }
    return p;
}

static float *F(dt_tensor *t) { return (float *)t->data; }

static dt_optimizer *mkopt(dt_params *ps, const dt_opt_desc *d) {
    dt_optimizer *o = NULL;
    if (dt_opt_create(&C, &o, ps, d)) { fprintf(stderr, "opt_create: %s\n", dt_ctx_error(&C)); exit(2); }
    return o;
}

static int ok(dt_status st, const char *what) {
    if (st) fprintf(stderr, "%s: %s\n", what, dt_ctx_error(&C));
    return st == DT_OK;
}

/* The gradient of element i at step t (1-based): varied signs and sizes, exact in float. */
static float grad_at(int i, int t) { return (float)(0.25 * sin(1.3 * i + 0.7 * t) + 0.01 * (i - 2)); }

static const float W0[5] = {0.5f, -1.0f, 2.0f, 0.0f, -0.25f};

/* ---------------------------------------------------------------- optimizers vs formulas */

typedef struct ref_cfg {
    dt_opt_kind kind;
    double lr, wd, mom, damp, b1, b2, eps, lr_decay, init_acc;
    int nesterov;
} ref_cfg;

/* PyTorch's documented algorithms, in double, written out independently of dt_opt.h. */
static void ref_step(const ref_cfg *c, double *w, double *s0, double *s1, const double *g_in, int n, int t) {
    int i;
    for (i = 0; i < n; i++) {
        double g = g_in[i];
        if (c->kind == DT_OPT_SGD) {
            if (c->wd != 0) g += c->wd * w[i];
            if (c->mom != 0) {
                s0[i] = t > 1 ? c->mom * s0[i] + (1 - c->damp) * g : g;
                g = c->nesterov ? g + c->mom * s0[i] : s0[i];
            }
            w[i] -= c->lr * g;
        } else if (c->kind == DT_OPT_ADAM || c->kind == DT_OPT_ADAMW) {
            double mh, vh;
            if (c->kind == DT_OPT_ADAMW) w[i] -= c->lr * c->wd * w[i];
            else if (c->wd != 0) g += c->wd * w[i];
            s0[i] = c->b1 * s0[i] + (1 - c->b1) * g;
            s1[i] = c->b2 * s1[i] + (1 - c->b2) * g * g;
            mh = s0[i] / (1 - pow(c->b1, t));
            vh = s1[i] / (1 - pow(c->b2, t));
            w[i] -= c->lr * mh / (sqrt(vh) + c->eps);
        } else { /* Adagrad */
            double clr = c->lr / (1 + (t - 1) * c->lr_decay);
            if (c->wd != 0) g += c->wd * w[i];
            s0[i] += g * g;
            w[i] -= clr * g / (sqrt(s0[i]) + c->eps);
        }
    }
}

/* 3 steps of dt_opt_step against ref_step; desc fields as given, ref_cfg with the resolved
   PyTorch defaults written by hand. */
static void check_opt(const char *name, const dt_opt_desc *d, const ref_cfg *c) {
    dt_params ps;
    dt_param *p;
    dt_optimizer *o;
    double w[5], s0[5], s1[5], g[5];
    float want[5];
    int i, t, bad_step = 0;
    memset(&ps, 0, sizeof ps);
    p = add(&ps, "w", DT_F32, 5, 0);
    memcpy(p->value.data, W0, sizeof W0);
    o = mkopt(&ps, d);
    for (i = 0; i < 5; i++) { w[i] = W0[i]; s0[i] = c->init_acc; s1[i] = 0; }
    for (t = 1; t <= 3; t++) {
        for (i = 0; i < 5; i++) { F(&p->grad)[i] = grad_at(i, t); g[i] = F(&p->grad)[i]; }
        if (dt_opt_step(o, NULL)) bad_step = 1;
        ref_step(c, w, s0, s1, g, 5, t);
    }
    for (i = 0; i < 5; i++) want[i] = (float)w[i];
    if (bad_step) dt_test_fail(name, "dt_opt_step failed: %s", dt_ctx_error(&C));
    else dt_test_allclose(name, F(&p->value), want, 5, 2e-7, 2e-6);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
}

static void test_optimizers(void) {
    dt_opt_desc d;
    ref_cfg c;
    /* SGD, PyTorch defaults but lr; momentum 0 */
    memset(&d, 0, sizeof d); memset(&c, 0, sizeof c);
    d.kind = DT_OPT_SGD; d.lr = 0.1;
    c.kind = DT_OPT_SGD; c.lr = 0.1;
    check_opt("sgd_plain_matches_formula_3_steps", &d, &c);
    /* SGD with momentum, dampening and L2 weight decay */
    d.momentum = 0.9; d.dampening = 0.1; d.weight_decay = 0.01;
    c.mom = 0.9; c.damp = 0.1; c.wd = 0.01;
    check_opt("sgd_momentum_dampening_decay_matches_formula_3_steps", &d, &c);
    /* Nesterov */
    d.dampening = 0; d.nesterov = 1;
    c.damp = 0; c.nesterov = 1;
    check_opt("sgd_nesterov_matches_formula_3_steps", &d, &c);
    /* Adam with its defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8) and L2 decay */
    memset(&d, 0, sizeof d); memset(&c, 0, sizeof c);
    d.kind = DT_OPT_ADAM; d.lr = 0.05; d.weight_decay = 0.1;
    c.kind = DT_OPT_ADAM; c.lr = 0.05; c.wd = 0.1; c.b1 = 0.9; c.b2 = 0.999; c.eps = 1e-8;
    check_opt("adam_l2_matches_formula_3_steps", &d, &c);
    /* AdamW with every default (lr 1e-3, weight_decay 1e-2) */
    memset(&d, 0, sizeof d); memset(&c, 0, sizeof c);
    d.kind = DT_OPT_ADAMW;
    c.kind = DT_OPT_ADAMW; c.lr = 1e-3; c.wd = 1e-2; c.b1 = 0.9; c.b2 = 0.999; c.eps = 1e-8;
    check_opt("adamw_defaults_match_formula_3_steps", &d, &c);
    /* AdamW, other betas, large lr so decoupled decay shows */
    d.lr = 0.1; d.weight_decay = 0.5; d.beta1 = 0.8; d.beta2 = 0.99; d.eps = 1e-6;
    c.lr = 0.1; c.wd = 0.5; c.b1 = 0.8; c.b2 = 0.99; c.eps = 1e-6;
    check_opt("adamw_decoupled_decay_matches_formula_3_steps", &d, &c);
    /* DT_OPT_ZERO: beta1 = 0 and no decay for AdamW */
    d.beta1 = DT_OPT_ZERO; d.weight_decay = DT_OPT_ZERO;
    c.b1 = 0; c.wd = 0;
    check_opt("adamw_explicit_zero_beta1_and_decay", &d, &c);
    /* Adagrad with lr_decay, weight decay and an initial accumulator */
    memset(&d, 0, sizeof d); memset(&c, 0, sizeof c);
    d.kind = DT_OPT_ADAGRAD; d.lr = 0.2; d.lr_decay = 0.1; d.weight_decay = 0.05; d.initial_accumulator_value = 0.3;
    c.kind = DT_OPT_ADAGRAD; c.lr = 0.2; c.lr_decay = 0.1; c.wd = 0.05; c.init_acc = 0.3; c.eps = 1e-10;
    check_opt("adagrad_matches_formula_3_steps", &d, &c);

    /* A literal derived by hand: Adam's first step moves each weight by lr * g / (|g| + eps),
       i.e. lr against the sign of g: 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.9 (to float). */
    {
        dt_params ps;
        dt_param *p;
        dt_optimizer *o;
        memset(&ps, 0, sizeof ps);
        p = add(&ps, "w", DT_F32, 2, 0);
        F(&p->value)[0] = 1.0f; F(&p->value)[1] = 1.0f;
        F(&p->grad)[0] = 0.5f; F(&p->grad)[1] = -2.0f;
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_ADAM; d.lr = 0.1;
        o = mkopt(&ps, &d);
        dt_opt_step(o, NULL);
        dt_test_close("adam_first_step_is_lr_times_sign", F(&p->value)[0], 0.9, 1e-7);
        dt_test_close("adam_first_step_negative_grad", F(&p->value)[1], 1.1, 1e-7);
        dt_opt_free(o);
        dt_params_free(&C, &ps);
    }
}

/* The update functions give every element the same float operations wherever it sits (a
   vector lane or the tail): 11 elements in one call equal 11 calls of one element, bitwise, and
   equal the documented operations in float, in this order (what the CUDA kernels mirror). */
static void test_update_lanes(void) {
    float w[11], g[11], m[11], v[11], w1[11], m1[11], v1[11], wr[11], mr[11], vr[11];
    const double lr = 0.03, b1 = 0.85, b2 = 0.995, eps = 1e-7, wd = 0.2;
    const float step = (float)(lr / (1 - pow(b1, 3))), bc2 = (float)sqrt(1 - pow(b2, 3));
    const float clr = (float)(lr / (1 + 2 * 0.1));
    int i;
    for (i = 0; i < 11; i++) {
        w[i] = w1[i] = wr[i] = 0.1f * (float)(i - 5);
        g[i] = grad_at(i, 1);
        m[i] = m1[i] = mr[i] = 0.01f * (float)i;
        v[i] = v1[i] = vr[i] = 0.001f * (float)(i + 1);
    }
    dt_adam_update(w, g, m, v, 11, lr, b1, b2, eps, wd, 1, 3);
    for (i = 0; i < 11; i++) dt_adam_update(w1 + i, g + i, m1 + i, v1 + i, 1, lr, b1, b2, eps, wd, 1, 3);
    for (i = 0; i < 11; i++) { /* AdamW in float, the documented order */
        float wi = wr[i] * (float)(1 - lr * wd), gi = g[i];
        mr[i] = (float)b1 * mr[i] + (float)(1 - b1) * gi;
        vr[i] = (float)b2 * vr[i] + (float)(1 - b2) * (gi * gi);
        wr[i] = wi - step * (mr[i] / (sqrtf(vr[i]) / bc2 + (float)eps));
    }
    dt_test_equal_bytes("adam_update_same_bits_in_any_lane", w, w1, sizeof w);
    DT_TEST_CHECK("adam_state_same_bits_in_any_lane", memcmp(m, m1, sizeof m) == 0 && memcmp(v, v1, sizeof v) == 0);
    dt_test_equal_bytes("adam_update_is_the_documented_float_ops", w, wr, sizeof w);
    for (i = 0; i < 11; i++) { w1[i] = wr[i] = w[i]; m1[i] = mr[i] = 0.5f; }
    memcpy(w, w1, sizeof w);
    for (i = 0; i < 11; i++) m[i] = 0.5f;
    dt_adagrad_update(w, g, m, 11, lr, 0.1, wd, 1e-10, 3);
    for (i = 0; i < 11; i++) dt_adagrad_update(w1 + i, g + i, m1 + i, 1, lr, 0.1, wd, 1e-10, 3);
    for (i = 0; i < 11; i++) {
        float gi = g[i] + (float)wd * wr[i];
        mr[i] = mr[i] + gi * gi;
        wr[i] = wr[i] - clr * (gi / (sqrtf(mr[i]) + (float)1e-10));
    }
    dt_test_equal_bytes("adagrad_update_same_bits_in_any_lane", w, w1, sizeof w);
    dt_test_equal_bytes("adagrad_update_is_the_documented_float_ops", w, wr, sizeof w);
}

/* Groups: group 1 at half the lr and its own decay; a no_decay parameter gets none. */
static void test_groups(void) {
    dt_params ps;
    dt_param *a, *b, *nd;
    dt_optimizer *o;
    dt_opt_desc d;
    ref_cfg ca, cb, cn;
    double wa[5], wb[5], wn[5], ma[5] = {0}, va[5] = {0}, mb[5] = {0}, vb[5] = {0}, mn[5] = {0}, vn[5] = {0}, g[5];
    float fa[5], fb[5], fn_[5];
    int i, t;
    memset(&ps, 0, sizeof ps);
    a = add(&ps, "a", DT_F32, 5, 0);
    b = add(&ps, "b", DT_F32, 5, 0);
    nd = add(&ps, "bias", DT_F32, 5, 0);
    b->group = 1;
    nd->no_decay = 1;
    memcpy(a->value.data, W0, sizeof W0); memcpy(b->value.data, W0, sizeof W0); memcpy(nd->value.data, W0, sizeof W0);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.1; d.weight_decay = 0.2;
    d.groups[1].lr_scale = 0.5; d.groups[1].weight_decay = 0.4;
    o = mkopt(&ps, &d);
    memset(&ca, 0, sizeof ca);
    ca.kind = DT_OPT_ADAMW; ca.lr = 0.1; ca.wd = 0.2; ca.b1 = 0.9; ca.b2 = 0.999; ca.eps = 1e-8;
    cb = ca; cb.lr = 0.05; cb.wd = 0.4;
    cn = ca; cn.wd = 0;
    for (i = 0; i < 5; i++) wa[i] = wb[i] = wn[i] = W0[i];
    for (t = 1; t <= 3; t++) {
        for (i = 0; i < 5; i++) {
            F(&a->grad)[i] = F(&b->grad)[i] = F(&nd->grad)[i] = grad_at(i, t);
            g[i] = grad_at(i, t);
        }
        dt_opt_step(o, NULL);
        ref_step(&ca, wa, ma, va, g, 5, t);
        ref_step(&cb, wb, mb, vb, g, 5, t);
        ref_step(&cn, wn, mn, vn, g, 5, t);
    }
    for (i = 0; i < 5; i++) { fa[i] = (float)wa[i]; fb[i] = (float)wb[i]; fn_[i] = (float)wn[i]; }
    dt_test_allclose("group0_uses_base_lr_and_decay", F(&a->value), fa, 5, 2e-7, 2e-6);
    dt_test_allclose("group1_uses_lr_scale_and_own_decay", F(&b->value), fb, 5, 2e-7, 2e-6);
    dt_test_allclose("no_decay_param_gets_no_weight_decay", F(&nd->value), fn_, 5, 2e-7, 2e-6);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
}

/* ---------------------------------------------------------------- schedules */

static void test_schedules(void) {
    dt_lr_schedule s;
    double got[6];
    memset(&s, 0, sizeof s);
    s.lr = 0.3;
    dt_test_close("lr_constant", dt_lr_at(&s, 12345), 0.3, 0);
    s.kind = DT_LR_COSINE; s.lr = 1.0; s.min_lr = 0.1; s.warmup_steps = 10; s.total_steps = 100;
    /* warmup (s+1)/10; r = (s-10)/90; cos(pi/2) = 0 at s = 55 -> 0.1 + 0.9 * 0.5 */
    got[0] = dt_lr_at(&s, 0); got[1] = dt_lr_at(&s, 9); got[2] = dt_lr_at(&s, 10);
    got[3] = dt_lr_at(&s, 55); got[4] = dt_lr_at(&s, 100); got[5] = dt_lr_at(&s, 1000);
    dt_test_close("lr_warmup_first_step", got[0], 0.1, 1e-15);
    dt_test_close("lr_warmup_last_step_reaches_peak", got[1], 1.0, 1e-15);
    dt_test_close("lr_cosine_starts_at_peak", got[2], 1.0, 1e-15);
    dt_test_close("lr_cosine_halfway", got[3], 0.55, 1e-12);
    dt_test_close("lr_cosine_ends_at_floor", got[4], 0.1, 1e-15);
    dt_test_close("lr_cosine_stays_at_floor", got[5], 0.1, 1e-15);
    /* cos(pi/4): r = 22.5/90 at s = 32.5 is not a step; s = 28 -> r = 0.2 */
    dt_test_close("lr_cosine_at_r_0.2", dt_lr_at(&s, 28), 0.1 + 0.9 * 0.5 * (1 + cos(3.14159265358979323846 * 0.2)),
                  1e-12);
    s.kind = DT_LR_LINEAR;
    dt_test_close("lr_linear_halfway", dt_lr_at(&s, 55), 0.55, 1e-12);
    dt_test_close("lr_linear_end", dt_lr_at(&s, 100), 0.1, 1e-15);
    s.kind = DT_LR_WSD; s.decay_steps = 20;
    dt_test_close("lr_wsd_stable", dt_lr_at(&s, 50), 1.0, 0);
    dt_test_close("lr_wsd_decay_start", dt_lr_at(&s, 80), 1.0, 0);
    dt_test_close("lr_wsd_decay_halfway", dt_lr_at(&s, 90), 0.55, 1e-12);
    dt_test_close("lr_wsd_end", dt_lr_at(&s, 100), 0.1, 1e-15);
    s.decay_steps = 0; /* default 10% = 10 steps: decay from 90 */
    dt_test_close("lr_wsd_default_decay_is_10_percent", dt_lr_at(&s, 95), 0.55, 1e-12);
    s.kind = DT_LR_COSINE; s.total_steps = 10;
    DT_TEST_CHECK("lr_invalid_schedule_is_nan", isnan(dt_lr_at(&s, 3)));
    dt_test_error("lr_invalid_schedule_named", dt_lr_schedule_check(&C, &s), dt_ctx_error(&C), "total_steps = 10");
    /* the optimizer follows its schedule, step by step */
    {
        dt_params ps;
        dt_param *p;
        dt_optimizer *o;
        dt_opt_desc d;
        dt_opt_step_info info;
        memset(&ps, 0, sizeof ps);
        p = add(&ps, "w", DT_F32, 1, 0);
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_SGD; d.lr = 2.0;
        d.schedule.kind = DT_LR_LINEAR; d.schedule.warmup_steps = 2; d.schedule.total_steps = 6;
        o = mkopt(&ps, &d);
        F(&p->grad)[0] = 1.0f;
        dt_opt_step(o, &info); /* lr 1 */
        dt_opt_step(o, &info); /* lr 2 */
        dt_opt_step(o, &info); /* lr 2 (r = 0) */
        dt_test_close("opt_follows_schedule_lr", info.lr, 2.0, 0);
        dt_test_close("opt_schedule_updates_sum", F(&p->value)[0], -5.0, 1e-6);
        dt_test_close("opt_next_lr", dt_opt_lr(o), 1.5, 1e-12);
        dt_opt_free(o);
        dt_params_free(&C, &ps);
    }
}

/* ---------------------------------------------------------------- loss scaling */

static void test_loss_scaler(void) {
    dt_params ps, ref_ps;
    dt_param *p, *r;
    dt_optimizer *o, *ro;
    dt_opt_desc d;
    dt_opt_step_info info;
    float before[4];
    int i, step, ok_unscaled = 1;
    double scales[8];
    int skipped[8];
    memset(&ps, 0, sizeof ps);
    memset(&ref_ps, 0, sizeof ref_ps);
    p = add(&ps, "w", DT_F32, 4, 0);
    r = add(&ref_ps, "w", DT_F32, 4, 0);
    memcpy(p->value.data, W0, 16);
    memcpy(r->value.data, W0, 16);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.01;
    d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC; d.loss_scale.init_scale = 1024; d.loss_scale.growth_interval = 3;
    o = mkopt(&ps, &d);
    d.loss_scale.mode = DT_LOSS_SCALE_NONE;
    ro = mkopt(&ref_ps, &d);
    /* step 0 clean, step 1 inf, step 2 NaN, steps 3..5 clean: the scale goes 1024 -> 512 -> 256,
       stays for two clean steps and grows to 512 after the third */
    for (step = 0; step < 6; step++) {
        float seed = 0;
        dt_opt_micro_begin(o, &seed, NULL, 0);
        for (i = 0; i < 4; i++) F(&p->grad)[i] = grad_at(i, step) * seed; /* a backward seeded with the scale */
        if (step == 1) F(&p->grad)[2] = INFINITY;
        if (step == 2) F(&p->grad)[0] = NAN;
        memcpy(before, p->value.data, 16);
        dt_opt_step(o, &info);
        scales[step] = o->scaler.scale;
        skipped[step] = info.skipped;
        if (step == 1) {
            DT_TEST_CHECK("inf_step_is_skipped", info.skipped == 1);
            dt_test_equal_bytes("inf_step_leaves_weights", p->value.data, before, 16);
        }
        if (!info.skipped) { /* the unscaled update equals an unscaled run's */
            for (i = 0; i < 4; i++) F(&r->grad)[i] = grad_at(i, step);
            dt_opt_step(ro, NULL);
            if (memcmp(p->value.data, r->value.data, 16) != 0) ok_unscaled = 0;
        }
    }
    DT_TEST_CHECK("nan_step_is_skipped", skipped[2] == 1 && skipped[0] == 0 && skipped[3] == 0);
    dt_test_close("scale_backs_off_on_inf", scales[1], 512, 0);
    dt_test_close("scale_backs_off_on_nan", scales[2], 256, 0);
    dt_test_close("scale_holds_before_interval", scales[4], 256, 0);
    dt_test_close("scale_grows_after_interval_clean_steps", scales[5], 512, 0);
    DT_TEST_CHECK("skipped_steps_do_not_count", o->step == 4 && o->scaler.skipped == 2);
    DT_TEST_CHECK("scaled_grads_give_the_unscaled_update_bitwise", ok_unscaled);
    dt_opt_free(o);
    dt_opt_free(ro);

    /* static: the scale never moves, an overflow still skips */
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_SGD; d.lr = 0.1;
    d.loss_scale.mode = DT_LOSS_SCALE_STATIC; d.loss_scale.init_scale = 128;
    o = mkopt(&ps, &d);
    F(&p->grad)[0] = INFINITY;
    dt_opt_step(o, &info);
    DT_TEST_CHECK("static_scale_skips_overflow", info.skipped == 1 && o->scaler.scale == 128);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
    dt_params_free(&C, &ref_ps);

    /* DEFAULT: dynamic for f16 parameters, none for bf16 */
    {
        dt_params hp;
        memset(&hp, 0, sizeof hp);
        add(&hp, "h", DT_F16, 2, 0);
        memset(&d, 0, sizeof d);
        o = mkopt(&hp, &d);
        DT_TEST_CHECK("f16_params_get_dynamic_scaling", o->scaler.mode == DT_LOSS_SCALE_DYNAMIC &&
                                                            o->scaler.scale == 65536 && o->scaler.growth_interval == 2000);
        dt_opt_free(o);
        dt_params_free(&C, &hp);
        add(&hp, "b", DT_BF16, 2, 0);
        o = mkopt(&hp, &d);
        DT_TEST_CHECK("bf16_params_need_no_scaling", o->scaler.mode == DT_LOSS_SCALE_NONE && o->scaler.scale == 1);
        dt_opt_free(o);
        dt_params_free(&C, &hp);
    }
}

/* The scale at the ends of the float range. Growing every step from 2^126 stops at 2^127 (the
   next product, 2^128, is not a float: seeding the backward with it gives inf grads and a
   wasted step every growth interval); every step is taken and equals an unscaled run's bitwise
   (the scales are powers of two, so scale and unscale are exact). Backing off stops at FLT_MIN,
   where 1 / scale is still a float. Scales a float cannot hold are named errors. */
static void test_loss_scale_limits(void) {
    dt_params ps, rps;
    dt_param *p, *r;
    dt_optimizer *o, *ro;
    dt_opt_desc d;
    dt_loss_scaler sc;
    dt_loss_scale_desc sd;
    float seed = 0;
    int i, t, seeds_finite = 1, same = 1, found = -1;
    dt_status st;
    memset(&ps, 0, sizeof ps);
    memset(&rps, 0, sizeof rps);
    p = add(&ps, "w", DT_F32, 4, 0);
    r = add(&rps, "w", DT_F32, 4, 0);
    memcpy(p->value.data, W0, 16);
    memcpy(r->value.data, W0, 16);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.01;
    d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC; d.loss_scale.init_scale = ldexp(1, 126); d.loss_scale.growth_interval = 1;
    o = mkopt(&ps, &d);
    d.loss_scale.mode = DT_LOSS_SCALE_NONE;
    ro = mkopt(&rps, &d);
    for (t = 1; t <= 6; t++) {
        dt_opt_micro_begin(o, &seed, NULL, 0);
        if (!isfinite(seed)) seeds_finite = 0;
        for (i = 0; i < 4; i++) {
            F(&p->grad)[i] = grad_at(i, t) * seed; /* a backward seeded with the scale */
            F(&r->grad)[i] = grad_at(i, t);
        }
        dt_opt_step(o, NULL);
        dt_opt_step(ro, NULL);
        if (memcmp(p->value.data, r->value.data, 16) != 0) same = 0;
    }
    dt_test_close("scale_growth_stops_at_2_to_127", o->scaler.scale, ldexp(1, 127), 0);
    DT_TEST_CHECK("scale_at_float_max_seeds_finite", seeds_finite);
    if (o->scaler.skipped != 0 || o->step != 6)
        dt_test_fail("scale_at_float_max_wastes_no_step", "skipped %lld, step %lld; want 0 and 6",
                     (long long)o->scaler.skipped, (long long)o->step);
    else dt_test_pass("scale_at_float_max_wastes_no_step");
    DT_TEST_CHECK("scale_at_float_max_updates_as_unscaled_bitwise", same);
    dt_opt_free(o);
    dt_opt_free(ro);
    dt_params_free(&C, &ps);
    dt_params_free(&C, &rps);

    /* back-off floor: the unscale multiplier 1 / scale = 2^126 stays finite */
    memset(&sd, 0, sizeof sd);
    sd.mode = DT_LOSS_SCALE_DYNAMIC;
    sd.init_scale = FLT_MIN;
    st = dt_loss_scaler_init(&C, &sc, &sd);
    dt_loss_scaler_update(&sc, 1);
    dt_loss_scaler_update(&sc, 1);
    dt_test_close("scale_backoff_stops_at_flt_min", st == DT_OK ? sc.scale : -1, FLT_MIN, 0);
    memset(&ps, 0, sizeof ps);
    p = add(&ps, "g", DT_F32, 1, 0);
    F(&p->grad)[0] = 3.0f * FLT_MIN;
    st = dt_loss_scaler_unscale(&C, &sc, &ps, &found, NULL);
    dt_test_close("unscale_at_flt_min_is_finite", st == DT_OK && found == 0 ? F(&p->grad)[0] : -1, 3.0, 0);
    sd.init_scale = 1e39;
    st = dt_loss_scaler_init(&C, &sc, &sd);
    dt_test_error("init_scale_beyond_float_max_is_named", st, dt_ctx_error(&C), "desc.init_scale = 1e+39");
    sd.init_scale = 1e-300;
    st = dt_loss_scaler_init(&C, &sc, &sd);
    dt_test_error("init_scale_below_flt_min_is_named", st, dt_ctx_error(&C), "desc.init_scale = 1e-300");
    memset(&sc, 0, sizeof sc); /* never initialised: mode DEFAULT, scale 0 */
    st = dt_loss_scaler_unscale(&C, &sc, &ps, &found, NULL);
    dt_test_error("uninitialised_scaler_is_named", st, dt_ctx_error(&C), "s->scale = 0");
    sc.mode = (dt_loss_scale_mode)7;
    st = dt_loss_scaler_unscale(&C, &sc, &ps, &found, NULL);
    dt_test_error("scaler_mode_out_of_range_is_named", st, dt_ctx_error(&C), "s->mode = 7");
    dt_params_free(&C, &ps);
}

/* lr DT_OPT_ZERO (as the header documents) is lr 0, not an error: the weights stay bitwise,
   the optimizer state moves exactly as with any lr (AdamW's exp_avg does not depend on the
   weights; SGD's momentum buffer does not without weight decay), the step advances. */
static void test_lr_zero(void) {
    static const dt_opt_kind kinds[2] = {DT_OPT_ADAMW, DT_OPT_SGD};
    int k, i, t;
    for (k = 0; k < 2; k++) {
        dt_params ps, rps;
        dt_param *p, *r;
        dt_optimizer *o = NULL, *ro;
        dt_opt_desc d;
        dt_opt_step_info info;
        char name[96];
        const char *tag = k == 0 ? "adamw" : "sgd_momentum";
        dt_status st;
        memset(&ps, 0, sizeof ps);
        memset(&rps, 0, sizeof rps);
        p = add(&ps, "w", DT_F32, 5, 0);
        r = add(&rps, "w", DT_F32, 5, 0);
        memcpy(p->value.data, W0, sizeof W0);
        memcpy(r->value.data, W0, sizeof W0);
        memset(&d, 0, sizeof d);
        d.kind = kinds[k];
        d.momentum = k == 1 ? 0.9 : 0;
        d.lr = DT_OPT_ZERO;
        st = dt_opt_create(&C, &o, &ps, &d);
        snprintf(name, sizeof name, "lr_zero_is_accepted_%s", tag);
        if (!DT_TEST_CHECK(name, st == DT_OK)) {
            fprintf(stderr, "%s\n", dt_ctx_error(&C));
            dt_params_free(&C, &ps);
            dt_params_free(&C, &rps);
            continue;
        }
        d.lr = 0.01;
        ro = mkopt(&rps, &d);
        for (t = 1; t <= 3; t++) {
            for (i = 0; i < 5; i++) F(&p->grad)[i] = F(&r->grad)[i] = grad_at(i, t);
            dt_opt_step(o, &info);
            dt_opt_step(ro, NULL);
        }
        snprintf(name, sizeof name, "lr_zero_leaves_weights_bitwise_%s", tag);
        dt_test_equal_bytes(name, p->value.data, W0, sizeof W0);
        snprintf(name, sizeof name, "lr_zero_moves_the_state_as_lr_0.01_does_%s", tag);
        dt_test_equal_bytes(name, o->slots[0].state[0].data, ro->slots[0].state[0].data, sizeof W0);
        snprintf(name, sizeof name, "lr_zero_reports_lr_0_and_counts_steps_%s", tag);
        DT_TEST_CHECK(name, info.lr == 0 && dt_opt_lr(o) == 0 && o->step == 3);
        dt_opt_free(o);
        dt_opt_free(ro);
        dt_params_free(&C, &ps);
        dt_params_free(&C, &rps);
    }
}

/* bf16 master weights: the master follows the f32 run bitwise; the value is its bf16 rounding. */
static void test_master_weights(void) {
    dt_params bp, fp;
    dt_param *b, *f;
    dt_optimizer *bo, *fo;
    dt_opt_desc d;
    uint16_t want[6];
    int i, t;
    memset(&bp, 0, sizeof bp);
    memset(&fp, 0, sizeof fp);
    b = add(&bp, "w", DT_BF16, 6, 0);
    f = add(&fp, "w", DT_F32, 6, 0);
    for (i = 0; i < 6; i++) {
        ((uint16_t *)b->value.data)[i] = dt_f32_to_bf16(0.37f * (float)(i - 2));
        F(&f->value)[i] = dt_bf16_to_f32(((uint16_t *)b->value.data)[i]);
    }
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 1e-3;
    bo = mkopt(&bp, &d);
    fo = mkopt(&fp, &d);
    for (t = 1; t <= 3; t++) {
        for (i = 0; i < 6; i++) F(&b->grad)[i] = F(&f->grad)[i] = grad_at(i, t);
        dt_opt_step(bo, NULL);
        dt_opt_step(fo, NULL);
    }
    dt_test_equal_bytes("bf16_master_equals_f32_run", bo->slots[0].master.data, f->value.data, 24);
    for (i = 0; i < 6; i++) want[i] = dt_f32_to_bf16(F(&f->value)[i]);
    dt_test_equal_bytes("bf16_value_is_master_rounded_to_nearest_even", b->value.data, want, 12);
    /* lr 1e-3 steps are below bf16's resolution at these magnitudes: without the master the
       weights would not move at all */
    DT_TEST_CHECK("master_accumulates_updates_below_bf16_resolution",
                  F(&bo->slots[0].master)[1] != dt_bf16_to_f32(dt_f32_to_bf16(-0.37f)));
    dt_opt_free(bo);
    dt_opt_free(fo);
    dt_params_free(&C, &bp);
    dt_params_free(&C, &fp);
}

/* ---------------------------------------------------------------- stochastic rounding

   Each test sets the f32 masters by hand and takes one SGD step with lr 0 (the masters stay),
   so the values are exactly the rounding of the masters. */

/* The master of element g of the whole tensor: 1 + frac(g) bf16 steps, frac(g) = k / 2^16 with
   k = (g * 7919 + 1) mod 2^16 (every fraction, none zero). */
static float sr_master(int64_t g) { return 1.0f + (float)(((g * 7919 + 1) & 0xFFFF)) * 0x1p-23f; }

/* A bf16 parameter (shape / global shape / start of nd dims; gshape NULL = whole) given masters
   by sr_master of each element's index in the whole tensor, after one step: its values. */
static int sr_round(const char *name, int nd, const int64_t *shape, const int64_t *gshape, const int64_t *start,
                    const dt_opt_desc *od, uint16_t *out, dt_status *st_out) {
    dt_params ps;
    dt_param_desc pd;
    dt_param *p = NULL;
    dt_optimizer *o = NULL;
    dt_status st;
    int64_t k, n = 1, idx[4] = {0, 0, 0, 0}, gs[4];
    int d;
    memset(&ps, 0, sizeof ps);
    memset(&pd, 0, sizeof pd);
    pd.name = name; pd.dtype = DT_BF16; pd.ndim = nd;
    for (d = 0; d < nd; d++) {
        pd.shape[d] = shape[d];
        if (gshape) { pd.global_shape[d] = gshape[d]; pd.start[d] = start[d]; }
        gs[d] = gshape ? gshape[d] : shape[d];
        n *= shape[d];
    }
    st = dt_params_add(&C, &ps, &p, &pd);
    if (!st) st = dt_opt_create(&C, &o, &ps, od);
    if (st_out) *st_out = st;
    if (st) { dt_params_free(&C, &ps); return 0; }
    for (k = 0; k < n; k++) { /* the odometer over the local shape, its global index */
        int64_t g = 0;
        for (d = 0; d < nd; d++) g = g * gs[d] + (gshape ? start[d] : 0) + idx[d];
        F(&o->slots[0].master)[k] = sr_master(g);
        for (d = nd - 1; d >= 0; d--) { if (++idx[d] < shape[d]) break; idx[d] = 0; }
    }
    dt_params_zero_grad(&C, &ps);
    st = dt_opt_step(o, NULL);
    if (st_out) *st_out = st;
    if (!st) memcpy(out, p->value.data, (size_t)n * 2);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
    return !st;
}

static void test_stochastic_rounding(void) {
    enum { N = 65536 };
    static uint16_t v[N], v2[N], whole[4 * 3 * 5];
    static const int64_t one[1] = {N};
    dt_params ps;
    dt_param *p;
    dt_optimizer *o;
    dt_opt_desc d;
    dt_status st;
    double up = 0, mean = 0, sd;
    int64_t i, bad = 0, differ = 0;
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_SGD; d.lr = DT_OPT_ZERO; d.stochastic_rounding = 1; d.rounding_seed = 5;

    /* 1. unbiased: 2^16 masters 1 + 0.30000305 steps (k = 19661) round up 19661 times in
       expectation (binomial, sd 117); each value is one of the two neighbours. Nearest even
       rounds every one down: a bias of -0.3 steps. */
    memset(&ps, 0, sizeof ps);
    p = add(&ps, "w", DT_BF16, N, 0);
    o = mkopt(&ps, &d);
    for (i = 0; i < N; i++) F(&o->slots[0].master)[i] = 1.0f + 19661.0f * 0x1p-23f;
    dt_params_zero_grad(&C, &ps);
    if (!ok(dt_opt_step(o, NULL), "step")) dt_test_fail("stochastic_rounding_step", "%s", dt_ctx_error(&C));
    for (i = 0; i < N; i++) {
        uint16_t b = ((uint16_t *)p->value.data)[i];
        up += b == 0x3F81; /* 1 + 2^-7 */
        bad += b != 0x3F80 && b != 0x3F81;
    }
    sd = sqrt(N * 0.30000305 * (1 - 0.30000305));
    DT_TEST_CHECK("stochastic_rounding_gives_a_neighbour", bad == 0);
    if (!DT_TEST_CHECK("stochastic_rounding_up_with_the_fraction_as_probability", fabs(up - 19661.0) <= 5 * sd))
        printf("  rounded up %.0f of %d times; expected 19661 (sd %.1f)\n", up, N, sd);
    dt_opt_free(o);
    dt_params_free(&C, &ps);

    /* 2. every fraction (sr_master): the mean of the values is the mean of the masters within 5 sd
       of the sum of rounding errors (var sum f (1 - f) steps^2, f = k / 2^16: about N / 6) */
    if (sr_round("w", 1, one, NULL, NULL, &d, v, NULL)) {
        for (i = 0; i < N; i++) mean += (double)dt_bf16_to_f32(v[i]) - (double)sr_master(i);
        sd = ldexp(sqrt(N / 6.0), -7);
        if (!DT_TEST_CHECK("stochastic_rounding_is_unbiased_over_every_fraction", fabs(mean) <= 5 * sd))
            printf("  sum of (value - master) %.4g; expected 0 within 5 sd = %.4g\n", mean, 5 * sd);
    }

    /* 3. a pure function of (seed, step, name, index): again the same bits; another seed, name or
       step other bits */
    if (sr_round("w", 1, one, NULL, NULL, &d, v2, NULL)) dt_test_equal_bytes("stochastic_rounding_repeats", v2, v, sizeof v);
    d.rounding_seed = 6;
    if (sr_round("w", 1, one, NULL, NULL, &d, v2, NULL)) {
        for (differ = 0, i = 0; i < N; i++) differ += v2[i] != v[i];
        if (!DT_TEST_CHECK("stochastic_rounding_depends_on_the_seed", differ > N / 8))
            printf("  %lld of %d values differ\n", (long long)differ, N);
    }
    d.rounding_seed = 5;
    if (sr_round("w2", 1, one, NULL, NULL, &d, v2, NULL)) {
        for (differ = 0, i = 0; i < N; i++) differ += v2[i] != v[i];
        DT_TEST_CHECK("stochastic_rounding_depends_on_the_name", differ > N / 8);
    }
    { /* step 2 with lr 0: the same masters, other bits */
        memset(&ps, 0, sizeof ps);
        p = add(&ps, "w", DT_BF16, N, 0);
        o = mkopt(&ps, &d);
        for (i = 0; i < N; i++) F(&o->slots[0].master)[i] = sr_master(i);
        dt_params_zero_grad(&C, &ps);
        dt_opt_step(o, NULL);
        dt_test_equal_bytes("stochastic_rounding_step1_as_above", p->value.data, v, sizeof v);
        dt_opt_step(o, NULL);
        for (differ = 0, i = 0; i < N; i++) differ += ((uint16_t *)p->value.data)[i] != v[i];
        DT_TEST_CHECK("stochastic_rounding_depends_on_the_step", differ > N / 8);
        dt_opt_free(o);
        dt_params_free(&C, &ps);
    }

    /* 4. shards round as the whole tensor: a 3-D [4, 3, 5] whole, and shards split along dim 0 only
       (rows: ZeRO), along a later dim (a column shard: tensor parallel), and along all three (the
       norm's shard comm: a world of this one process) */
    if (dt_comm_create_world(&C, &d.norm.shard_comm, NULL)) dt_test_fail("stochastic_rounding_world", "%s", dt_ctx_error(&C));
    {
        static const int64_t g3[3] = {4, 3, 5};
        static const struct { int64_t shape[3], start[3]; const char *tag; } sh[] = {
            {{2, 3, 5}, {1, 0, 0}, "rows"}, {{4, 3, 2}, {0, 0, 3}, "columns"}, {{4, 1, 5}, {0, 2, 0}, "middle_dim"},
            {{2, 2, 3}, {2, 1, 1}, "every_dim"}, {{1, 1, 1}, {3, 2, 4}, "last_element"}};
        uint16_t part[60], want[60];
        char name[96];
        int k;
        if (sr_round("t", 3, g3, NULL, NULL, &d, whole, NULL))
            for (k = 0; k < (int)(sizeof sh / sizeof sh[0]); k++) {
                int64_t a, b, c, n = 0;
                for (a = 0; a < sh[k].shape[0]; a++)
                    for (b = 0; b < sh[k].shape[1]; b++)
                        for (c = 0; c < sh[k].shape[2]; c++)
                            want[n++] = whole[((sh[k].start[0] + a) * 3 + sh[k].start[1] + b) * 5 + sh[k].start[2] + c];
                snprintf(name, sizeof name, "stochastic_rounding_shard_%s_equals_whole", sh[k].tag);
                if (sr_round("t", 3, sh[k].shape, g3, sh[k].start, &d, part, &st))
                    dt_test_equal_bytes(name, part, want, (size_t)n * 2);
                else dt_test_fail(name, "%s", dt_ctx_error(&C));
            }
    }
    { /* a shard split along three dims besides its first has no 3-level form: a named error */
        static const int64_t g4[4] = {2, 3, 4, 5}, s4[4] = {2, 2, 2, 2}, st4[4] = {0, 1, 1, 1};
        sr_round("q", 4, s4, g4, st4, &d, v2, &st);
        dt_test_error("stochastic_rounding_shard_split_four_ways_is_named", st, dt_ctx_error(&C),
                      "\"q\" is a shard split along 3 dims besides its first");
    }
    dt_comm_free(d.norm.shard_comm);
    d.norm.shard_comm = NULL;

    /* 5. NaN stays NaN, infinities stay, and f16 values round to nearest even either way */
    {
        static const float sp[6] = {NAN, INFINITY, -INFINITY, -0.0f, FLT_MAX, -1.0f - 0x1p-22f};
        uint16_t want16[6];
        memset(&ps, 0, sizeof ps);
        p = add(&ps, "s", DT_BF16, 6, 0);
        o = mkopt(&ps, &d);
        memcpy(o->slots[0].master.data, sp, sizeof sp);
        dt_params_zero_grad(&C, &ps);
        dt_opt_step(o, NULL);
        {
            const uint16_t *b = (const uint16_t *)p->value.data;
            int fine = (b[0] & 0x7FFF) > 0x7F80 && b[1] == 0x7F80 && b[2] == 0xFF80 && b[3] == 0x8000 &&
                       (b[4] == 0x7F7F || b[4] == 0x7F80) && (b[5] == 0xBF80 || b[5] == 0xBF81);
            if (!DT_TEST_CHECK("stochastic_rounding_of_nan_inf_zero_max_negative", fine))
                printf("  %04x %04x %04x %04x %04x %04x\n", b[0], b[1], b[2], b[3], b[4], b[5]);
        }
        dt_opt_free(o);
        dt_params_free(&C, &ps);
        memset(&ps, 0, sizeof ps);
        p = add(&ps, "h", DT_F16, 6, 0);
        o = mkopt(&ps, &d);
        for (i = 0; i < 6; i++) F(&o->slots[0].master)[i] = 1.0f + (float)i * 0x1p-13f;
        dt_convert(&C, want16, DT_F16, o->slots[0].master.data, DT_F32, 6);
        dt_params_zero_grad(&C, &ps);
        dt_opt_step(o, NULL);
        dt_test_equal_bytes("stochastic_rounding_leaves_f16_to_nearest_even", p->value.data, want16, sizeof want16);
        dt_opt_free(o);
        dt_params_free(&C, &ps);
    }

    /* 6. a flag is 0 or 1 */
    memset(&ps, 0, sizeof ps);
    add(&ps, "w", DT_BF16, 4, 0);
    o = NULL;
    d.stochastic_rounding = 2;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("stochastic_rounding_not_0_or_1_is_named", st, dt_ctx_error(&C),
                  "desc.stochastic_rounding = 2; expected 0 or 1");
    if (!st) dt_opt_free(o);
    dt_params_free(&C, &ps);
}

/* ---------------------------------------------------------------- gradient accumulation */

#define NPARAM MLP_NPARAM

static void test_accumulation(void) {
    mlp big, acc;
    dt_optimizer *ob, *oa;
    dt_opt_desc d;
    float gb[NPARAM], ga[NPARAM], vb[NPARAM], va[NPARAM], maxg = 0, seed = 0;
    int micro, i;
    mlp_init(&big, &C, DT_F32, 7);
    mlp_init(&acc, &C, DT_F32, 7);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_SGD; d.lr = 0.5; d.momentum = 0.9;
    ob = mkopt(&big.ps, &d);
    d.accum_steps = 4;
    oa = mkopt(&acc.ps, &d);
    mlp_run(&big, 99, 0, 32, 1.0f); /* one batch of 32 */
    for (micro = 0; micro < 4; micro++) { /* four micro-batches of 8, each seeded with 1/4 */
        dt_opt_micro_begin(oa, &seed, NULL, micro);
        mlp_run(&acc, 99, 8 * micro, 8, seed);
    }
    dt_test_close("accum_seed_is_one_over_micro_steps", seed, 0.25, 0);
    mlp_flat(&big, gb, 0);
    mlp_flat(&acc, ga, 0);
    for (i = 0; i < NPARAM; i++) maxg = fabsf(gb[i]) > maxg ? fabsf(gb[i]) : maxg;
    dt_test_allclose("accum_4x8_grads_equal_batch_32", ga, gb, NPARAM, 1e-6 * maxg, 1e-6);
    dt_opt_step(ob, NULL);
    dt_opt_step(oa, NULL);
    mlp_flat(&big, vb, 1);
    mlp_flat(&acc, va, 1);
    dt_test_allclose("accum_4x8_step_equals_batch_32_step", va, vb, NPARAM, 1e-7, 1e-6);
    dt_opt_free(ob);
    dt_opt_free(oa);
    dt_params_free(&C, &big.ps);
    dt_params_free(&C, &acc.ps);
}

/* ---------------------------------------------------------------- clipping (one rank) */

static void test_clipping(void) {
    dt_params ps;
    dt_param *a, *b;
    dt_optimizer *o;
    dt_opt_desc d;
    dt_opt_step_info info;
    dt_param_desc pd;
    double norm = 0;
    dt_status st;
    memset(&ps, 0, sizeof ps);
    a = add(&ps, "a", DT_F32, 2, 0);
    b = add(&ps, "b", DT_F32, 2, 0);
    /* |(3, 4, 12, 0)| = 13 */
    F(&a->grad)[0] = 3; F(&a->grad)[1] = 4; F(&b->grad)[0] = 12; F(&b->grad)[1] = 0;
    dt_grad_norm(&C, &norm, &ps, NULL);
    dt_test_close("grad_norm_by_hand", norm, 13.0, 1e-12);
    dt_clip_grad_norm(&C, &ps, &norm, 6.5, NULL);
    /* coef = 6.5 / (13 + 1e-6) */
    dt_test_close("clip_scales_grads", F(&a->grad)[1], 4 * 6.5 / (13 + 1e-6), 1e-6);
    dt_clip_grad_norm(&C, &ps, &norm, 100, NULL);
    dt_test_close("clip_below_max_leaves_grads", F(&a->grad)[1], 4 * 6.5 / (13 + 1e-6), 1e-6);
    /* inside the step: SGD lr 1 moves a[0] by the clipped grad */
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_SGD; d.lr = 1; d.clip_norm = 1.3;
    o = mkopt(&ps, &d);
    F(&a->grad)[0] = 3; F(&a->grad)[1] = 4; F(&b->grad)[0] = 12; F(&b->grad)[1] = 0;
    dt_opt_step(o, &info);
    dt_test_close("step_reports_norm_before_clipping", info.grad_norm, 13.0, 1e-12);
    dt_test_close("step_applies_clipped_grad", F(&a->value)[0], -3 * 1.3 / (13 + 1e-6), 1e-6);
    dt_opt_free(o);
    /* a sharded parameter without the comm it is split over */
    memset(&pd, 0, sizeof pd);
    pd.name = "shard"; pd.shape[0] = 2; pd.global_shape[0] = 4;
    dt_params_add(&C, &ps, NULL, &pd);
    st = dt_grad_norm(&C, &norm, &ps, NULL);
    dt_test_error("sharded_norm_without_comm_is_named", st, dt_ctx_error(&C), "\"shard\" is sharded");
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("opt_with_sharded_param_needs_shard_comm", st, dt_ctx_error(&C), "shard_comm");
    dt_params_free(&C, &ps);
}

/* ---------------------------------------------------------------- checkpoints */

static char ROOT[1024];

static void rm_tree(const char *path) { /* the scratch checkpoint dirs: two levels of files */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "rm -rf %s failed\n", path);
}

static void ck_dir(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", ROOT, name);
    rm_tree(out);
}

typedef struct run {
    mlp m;
    dt_optimizer *o;
    int64_t cursor;
} run;

static int run_sr; /* 1: the runs round their bf16 values stochastically */

static void run_init(run *r, dt_dtype dt, uint64_t init_seed) {
    dt_opt_desc d;
    mlp_init(&r->m, &C, dt, init_seed);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.02; d.clip_norm = 1.0;
    d.stochastic_rounding = run_sr; d.rounding_seed = 77;
    d.schedule.kind = DT_LR_COSINE; d.schedule.warmup_steps = 3; d.schedule.total_steps = 10;
    if (dt == DT_F32) { /* scaling on, with a short interval so the scale moves across the save */
        d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
        d.loss_scale.init_scale = 256;
        d.loss_scale.growth_interval = 3;
    }
    r->o = mkopt(&r->m.ps, &d);
    r->cursor = 0;
}

static void run_free(run *r) {
    dt_opt_free(r->o);
    dt_params_free(&C, &r->m.ps);
}

static void run_train(run *r, int steps, float *losses) {
    int s;
    for (s = 0; s < steps; s++) {
        float seed = 0;
        dt_params_zero_grad(&C, &r->m.ps);
        dt_opt_micro_begin(r->o, &seed, NULL, 0);
        losses[s] = mlp_run(&r->m, 5, r->cursor, 8, seed);
        dt_opt_step(r->o, NULL);
        r->cursor += 8;
    }
}

static void bytes_of(run *r, unsigned char *out, size_t *n) {
    int i;
    size_t off = 0;
    for (i = 0; i < r->m.ps.count; i++) {
        dt_opt_slot *s = &r->o->slots[i];
        memcpy(out + off, r->m.ps.items[i]->value.data, dt_tensor_bytes(&r->m.ps.items[i]->value));
        off += dt_tensor_bytes(&r->m.ps.items[i]->value);
        if (s->master.data) { memcpy(out + off, s->master.data, dt_tensor_bytes(&s->master)); off += dt_tensor_bytes(&s->master); }
        memcpy(out + off, s->state[0].data, dt_tensor_bytes(&s->state[0]));
        off += dt_tensor_bytes(&s->state[0]);
        memcpy(out + off, s->state[1].data, dt_tensor_bytes(&s->state[1]));
        off += dt_tensor_bytes(&s->state[1]);
    }
    *n = off;
}

static void test_resume(dt_dtype dt, const char *tag) {
    run a, b;
    float la[10], lb[10];
    unsigned char ba[4 * 4 * NPARAM], bb[4 * 4 * NPARAM];
    size_t na, nb;
    dt_checkpoint_desc cd;
    dt_train_state ts, got;
    char dir[1200], name[96];
    dt_status st;
    ck_dir(dir, sizeof dir, tag);
    run_init(&a, dt, 11);
    run_train(&a, 10, la);
    bytes_of(&a, ba, &na);
    run_init(&b, dt, 11);
    run_train(&b, 5, lb);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.layout = "single";
    memset(&ts, 0, sizeof ts);
    ts.step = 5; ts.rng_seed = 0xFEEDFACECAFEBEEFull; ts.rng_offset = 12345678901234ull; ts.data_cursor = b.cursor;
    dt_train_state_set(&C, &ts, "run", "resume \"test\"");
    st = dt_checkpoint_save(&C, &b.m.ps, b.o, &ts, &cd);
    snprintf(name, sizeof name, "%s_checkpoint_save", tag);
    if (!ok(st, "save")) dt_test_fail(name, "%s", dt_ctx_error(&C));
    run_free(&b);
    run_init(&b, dt, 999); /* different initial weights: the load must overwrite everything */
    memset(&got, 0, sizeof got);
    st = dt_checkpoint_load(&C, &b.m.ps, b.o, &got, &cd);
    snprintf(name, sizeof name, "%s_checkpoint_load", tag);
    if (!ok(st, "load")) dt_test_fail(name, "%s", dt_ctx_error(&C));
    else dt_test_pass(name);
    snprintf(name, sizeof name, "%s_train_state_restored", tag);
    DT_TEST_CHECK(name, got.step == 5 && got.rng_seed == ts.rng_seed && got.rng_offset == ts.rng_offset &&
                            got.data_cursor == 40 && dt_train_state_get(&got, "run") &&
                            strcmp(dt_train_state_get(&got, "run"), "resume \"test\"") == 0);
    b.cursor = got.data_cursor;
    run_train(&b, 5, lb + 5);
    bytes_of(&b, bb, &nb);
    snprintf(name, sizeof name, "%s_resume_losses_bitwise", tag);
    dt_test_equal_bytes(name, lb + 5, la + 5, 5 * sizeof(float));
    snprintf(name, sizeof name, "%s_resume_weights_and_state_bitwise", tag);
    if (na != nb) dt_test_fail(name, "%zu bytes vs %zu", nb, na);
    else dt_test_equal_bytes(name, bb, ba, na);
    snprintf(name, sizeof name, "%s_resume_step_and_scaler", tag);
    DT_TEST_CHECK(name, b.o->step == a.o->step && b.o->scaler.scale == a.o->scaler.scale &&
                            b.o->scaler.growth_tracker == a.o->scaler.growth_tracker);
    run_free(&a);
    run_free(&b);
}

/* The rank file is plain safetensors (dt's own reader opens it) and the manifest says what it should. */
static void test_format(void) {
    dt_params ps;
    dt_param *p;
    dt_optimizer *o;
    dt_opt_desc d;
    dt_checkpoint_desc cd;
    dt_st_file f;
    dt_tensor t;
    dt_tensor_desc td;
    dt_json *man = NULL;
    char dir[1200], path[1400], *text;
    long n;
    FILE *fp;
    int i;
    ck_dir(dir, sizeof dir, "format");
    memset(&ps, 0, sizeof ps);
    p = add(&ps, "layer.w", DT_BF16, 3, 2);
    for (i = 0; i < 6; i++) ((uint16_t *)p->value.data)[i] = dt_f32_to_bf16((float)i);
    memset(&d, 0, sizeof d);
    o = mkopt(&ps, &d);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.layout = "dp=1";
    dt_checkpoint_save(&C, &ps, o, NULL, &cd);
    snprintf(path, sizeof path, "%s/step_00000000/rank_00000.safetensors", dir);
    if (!ok(dt_safetensors_open(&C, &f, path), "open")) {
        dt_test_fail("rank_file_is_safetensors", "%s", dt_ctx_error(&C));
    } else {
        DT_TEST_CHECK("rank_file_is_safetensors", dt_safetensors_find(&f, "param/layer.w") &&
                                                      dt_safetensors_find(&f, "master/layer.w") &&
                                                      dt_safetensors_find(&f, "state/layer.w/exp_avg") &&
                                                      dt_safetensors_find(&f, "state/layer.w/exp_avg_sq"));
        memset(&td, 0, sizeof td);
        td.shape[0] = 3; td.shape[1] = 2;
        dt_tensor_create(&C, &t, &td);
        dt_safetensors_read(&C, &f, &t, "master/layer.w");
        dt_test_close("rank_file_master_value", F(&t)[5], 5.0, 0);
        dt_tensor_free(&C, &t);
        dt_safetensors_close(&C, &f);
    }
    snprintf(path, sizeof path, "%s/step_00000000/manifest.json", dir);
    fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    text = (char *)malloc((size_t)n);
    if (fread(text, 1, (size_t)n, fp) != (size_t)n) n = 0;
    fclose(fp);
    if (dt_json_parse(&C, &man, text, (size_t)n)) {
        dt_test_fail("manifest_is_json", "%s", dt_ctx_error(&C));
    } else {
        const dt_json *tw = dt_json_get(dt_json_get(man, "tensors"), "param/layer.w");
        const dt_json *files = dt_json_get(man, "files");
        DT_TEST_CHECK("manifest_names_format_version_world_layout",
                      strcmp(dt_json_get(man, "format")->string, "dt-checkpoint") == 0 &&
                          dt_json_get(man, "version")->number == 1 && dt_json_get(man, "world_size")->number == 1 &&
                          strcmp(dt_json_get(man, "layout")->string, "dp=1") == 0);
        DT_TEST_CHECK("manifest_has_global_shape_and_shards",
                      tw && dt_json_get(tw, "global_shape")->count == 2 &&
                          dt_json_get(tw, "global_shape")->items[0].number == 3 &&
                          dt_json_get(tw, "shards")->count == 1 && strcmp(dt_json_get(tw, "dtype")->string, "BF16") == 0);
        DT_TEST_CHECK("manifest_has_file_checksum", files && files->count == 1 &&
                                                        strlen(dt_json_get(&files->items[0], "xxh64")->string) == 16);
    }
    dt_json_free(&C, man);
    free(text);
    snprintf(path, sizeof path, "%s/latest", dir);
    fp = fopen(path, "rb");
    {
        char buf[64] = {0};
        if (fp && fread(buf, 1, sizeof buf - 1, fp) > 0) {}
        if (fp) fclose(fp);
        DT_TEST_CHECK("latest_names_the_step_dir", strcmp(buf, "step_00000000\n") == 0);
    }
    dt_opt_free(o);
    dt_params_free(&C, &ps);
}

/* Across precision modes: an f32 checkpoint loads into bf16 parameters (master = the f32
   values exactly, value = their bf16 rounding) and a bf16-master checkpoint into f32 parameters
   (value = the master). */
static void test_cross_precision(void) {
    dt_params fp, bp;
    dt_param *f, *b;
    dt_optimizer *fo, *bo;
    dt_opt_desc d;
    dt_checkpoint_desc cd;
    char dir[1200];
    uint16_t want[8];
    int i, ok_v = 1;
    dt_status st;
    memset(&fp, 0, sizeof fp);
    memset(&bp, 0, sizeof bp);
    f = add(&fp, "w", DT_F32, 8, 0);
    b = add(&bp, "w", DT_BF16, 8, 0);
    for (i = 0; i < 8; i++) { F(&f->value)[i] = 0.1234567f * (float)(i + 1); want[i] = dt_f32_to_bf16(F(&f->value)[i]); }
    memset(&d, 0, sizeof d);
    fo = mkopt(&fp, &d);
    bo = mkopt(&bp, &d);
    ck_dir(dir, sizeof dir, "cross");
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    dt_checkpoint_save(&C, &fp, fo, NULL, &cd);
    st = dt_checkpoint_load(&C, &bp, bo, NULL, &cd);
    DT_TEST_CHECK("f32_checkpoint_loads_into_bf16_params", st == DT_OK);
    dt_test_equal_bytes("bf16_load_master_is_the_f32_value", bo->slots[0].master.data, f->value.data, 32);
    dt_test_equal_bytes("bf16_load_value_is_its_rounding", b->value.data, want, 16);
    /* a bf16 run moves its master; an f32 parameter loads the master, not the rounded value */
    for (i = 0; i < 8; i++) F(&b->grad)[i] = grad_at(i, 1);
    dt_opt_step(bo, NULL);
    ck_dir(dir, sizeof dir, "cross2");
    dt_checkpoint_save(&C, &bp, bo, NULL, &cd);
    st = dt_checkpoint_load(&C, &fp, fo, NULL, &cd);
    for (i = 0; i < 8; i++) ok_v &= F(&f->value)[i] == F(&bo->slots[0].master)[i];
    DT_TEST_CHECK("bf16_master_checkpoint_loads_master_into_f32_params", st == DT_OK && ok_v && fo->step == 1);
    dt_opt_free(fo);
    dt_opt_free(bo);
    dt_params_free(&C, &fp);
    dt_params_free(&C, &bp);
}

/* The load converts straight out of the file's mapping, where entries are packed: a 7-element
   bf16 value (14 bytes) puts the f32 master after it at an offset of 2 mod 4. Loading that into
   an f16 model converts the master from the misaligned address (the sanitizer build traps a
   misaligned float load); the values must be the f16 rounding of the master. */
static void test_misaligned_convert(void) {
    dt_params bp, hp;
    dt_param *b, *h;
    dt_optimizer *bo, *ho;
    dt_opt_desc d;
    dt_checkpoint_desc cd;
    dt_st_file sf;
    const dt_st_entry *m;
    char dir[1200], path[1300];
    uint16_t want[7];
    int i;
    dt_status st;
    memset(&bp, 0, sizeof bp);
    memset(&hp, 0, sizeof hp);
    b = add(&bp, "w", DT_BF16, 7, 0);
    h = add(&hp, "w", DT_F16, 7, 0);
    memset(&d, 0, sizeof d);
    bo = mkopt(&bp, &d);
    ho = mkopt(&hp, &d);
    for (i = 0; i < 7; i++) F(&bo->slots[0].master)[i] = 0.3183099f * (float)(i + 1);
    for (i = 0; i < 7; i++) want[i] = dt_f32_to_f16(F(&bo->slots[0].master)[i]);
    ck_dir(dir, sizeof dir, "misaligned");
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    st = dt_checkpoint_save(&C, &bp, bo, NULL, &cd);
    snprintf(path, sizeof path, "%s/step_00000000/rank_00000.safetensors", dir);
    memset(&sf, 0, sizeof sf);
    if (st || dt_safetensors_open(&C, &sf, path) || !(m = dt_safetensors_find(&sf, "master/w"))) {
        dt_test_fail("misaligned_master_setup", "%s", dt_ctx_error(&C));
    } else {
        DT_TEST_CHECK("misaligned_master_is_misaligned", (8 + sf.header_len + m->begin) % 4 != 0);
        dt_safetensors_close(&C, &sf);
        st = dt_checkpoint_load(&C, &hp, ho, NULL, &cd);
        DT_TEST_CHECK("misaligned_master_loads", st == DT_OK);
        dt_test_equal_bytes("misaligned_master_converts_to_f16", h->value.data, want, sizeof want);
        dt_test_equal_bytes("misaligned_master_loads_bitwise", ho->slots[0].master.data, bo->slots[0].master.data, 28);
    }
    (void)b;
    dt_opt_free(bo);
    dt_opt_free(ho);
    dt_params_free(&C, &bp);
    dt_params_free(&C, &hp);
}

/* A small state to save and load in the fault tests. */
typedef struct small {
    dt_params ps;
    dt_param *p;
    dt_optimizer *o;
} small;

static void small_init(small *s, float v) {
    dt_opt_desc d;
    int i;
    memset(s, 0, sizeof *s);
    s->p = add(&s->ps, "w", DT_F32, 64, 16);
    for (i = 0; i < 64 * 16; i++) F(&s->p->value)[i] = v + 0.001f * (float)i;
    add(&s->ps, "b", DT_F32, 16, 0);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW;
    s->o = mkopt(&s->ps, &d);
}

static void small_free(small *s) {
    dt_opt_free(s->o);
    dt_params_free(&C, &s->ps);
}

static dt_status small_save(small *s, const char *dir, int64_t step, int keep, dt_ckpt_hook_fn hook, void *user) {
    dt_checkpoint_desc cd;
    dt_train_state ts;
    memset(&cd, 0, sizeof cd);
    memset(&ts, 0, sizeof ts);
    cd.dir = dir;
    cd.keep = keep;
    cd.hook = hook;
    cd.hook_user = user;
    ts.step = step;
    return dt_checkpoint_save(&C, &s->ps, s->o, &ts, &cd);
}

static dt_status small_load(small *s, const char *dir, dt_train_state *ts) {
    dt_checkpoint_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    return dt_checkpoint_load(&C, &s->ps, s->o, ts, &cd);
}

typedef struct crash_at {
    const char *point;
    int index;
} crash_at;

static void crash_hook(const char *point, int index, void *user) {
    const crash_at *c = (const crash_at *)user;
    if (strcmp(point, c->point) == 0 && index == c->index) raise(SIGKILL);
}

static void read_latest(const char *dir, char *buf, size_t n) {
    char path[1400];
    FILE *fp;
    size_t k = 0;
    snprintf(path, sizeof path, "%s/latest", dir);
    if ((fp = fopen(path, "rb")) != NULL) { k = fread(buf, 1, n - 1, fp); fclose(fp); }
    buf[k] = 0;
}

/* A child saves step 10 over a directory whose latest is step 5 and is killed at `point`. */
static void crash_case(const char *dir, const char *point, int index, int64_t want_step) {
    small s;
    crash_at at;
    dt_train_state ts;
    char name[128], latest[64], want[64];
    pid_t pid;
    int status = 0;
    at.point = point;
    at.index = index;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        small_init(&s, 10.0f);
        small_save(&s, dir, 10, 0, crash_hook, &at);
        _exit(0); /* not reached when the hook fired */
    }
    waitpid(pid, &status, 0);
    snprintf(name, sizeof name, "crash_at_%s_%d_killed_the_child", point, index);
    DT_TEST_CHECK(name, WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    small_init(&s, 0.0f);
    memset(&ts, 0, sizeof ts);
    snprintf(name, sizeof name, "crash_at_%s_%d_leaves_a_loadable_checkpoint", point, index);
    if (!ok(small_load(&s, dir, &ts), name)) dt_test_fail(name, "%s", dt_ctx_error(&C));
    else DT_TEST_CHECK(name, ts.step == want_step && F(&s.p->value)[1] == (want_step == 5 ? 5.001f : 10.001f));
    read_latest(dir, latest, sizeof latest);
    snprintf(want, sizeof want, "step_%08lld\n", (long long)want_step);
    snprintf(name, sizeof name, "crash_at_%s_%d_latest_names_step_%lld", point, index, (long long)want_step);
    DT_TEST_CHECK(name, strcmp(latest, want) == 0);
    small_free(&s);
}

static void test_crash_safety(void) {
    small s;
    dt_train_state ts;
    char dir[1200];
    ck_dir(dir, sizeof dir, "crash");
    small_init(&s, 5.0f);
    if (!ok(small_save(&s, dir, 5, 0, NULL, NULL), "save 5")) dt_test_fail("crash_baseline_save", "%s", dt_ctx_error(&C));
    small_free(&s);
    crash_case(dir, "tensor", 0, 5);    /* inside the rank file */
    crash_case(dir, "tensor", 2, 5);
    crash_case(dir, "rank_file", 0, 5); /* file complete, no manifest */
    crash_case(dir, "manifest", 0, 5);  /* manifest written, directory not renamed */
    crash_case(dir, "renamed", 0, 5);   /* step_10 in place, latest not updated */
    /* after all that debris, a clean save of step 10 works and wins */
    small_init(&s, 10.0f);
    if (!ok(small_save(&s, dir, 10, 0, NULL, NULL), "save 10"))
        dt_test_fail("save_after_crashes_succeeds", "%s", dt_ctx_error(&C));
    else dt_test_pass("save_after_crashes_succeeds");
    small_free(&s);
    small_init(&s, 0.0f);
    memset(&ts, 0, sizeof ts);
    DT_TEST_CHECK("load_after_resave_gives_step_10", small_load(&s, dir, &ts) == DT_OK && ts.step == 10);
    small_free(&s);
    crash_case(dir, "latest", 0, 10); /* killed after latest: the new checkpoint is the one */
}

/* The step `latest` names saved again: replaced in place, and a crash in the middle of the
   replacement still leaves `latest` naming a complete checkpoint. */
static void test_resave_same_step(void) {
    small s;
    dt_train_state ts;
    crash_at at;
    char dir[1200], latest[64];
    pid_t pid;
    int status = 0;
    ck_dir(dir, sizeof dir, "resave");
    small_init(&s, 5.0f);
    small_save(&s, dir, 5, 0, NULL, NULL);
    small_free(&s);
    small_init(&s, 7.0f);
    small_save(&s, dir, 7, 0, NULL, NULL);
    F(&s.p->value)[0] = 77.0f;
    DT_TEST_CHECK("resave_of_latest_step_succeeds", small_save(&s, dir, 7, 0, NULL, NULL) == DT_OK);
    small_free(&s);
    small_init(&s, 0.0f);
    DT_TEST_CHECK("resave_replaces_the_step", small_load(&s, dir, &ts) == DT_OK && ts.step == 7 &&
                                                   F(&s.p->value)[0] == 77.0f);
    small_free(&s);
    at.point = "renamed"; /* killed after the old step_7 is gone and the new one is in place */
    at.index = 0;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        small_init(&s, 7.0f);
        small_save(&s, dir, 7, 0, crash_hook, &at);
        _exit(0);
    }
    waitpid(pid, &status, 0);
    small_init(&s, 0.0f);
    read_latest(dir, latest, sizeof latest);
    DT_TEST_CHECK("crash_inside_resave_leaves_a_loadable_latest",
                  WIFSIGNALED(status) && small_load(&s, dir, &ts) == DT_OK && (ts.step == 5 || ts.step == 7) &&
                      strcmp(latest, "step_00000005\n") == 0);
    small_free(&s);
}

/* A save that fails part-way (a write refused, as on a full disk) returns DT_ERR_IO and
   removes what it made: step_N.tmp/ and latest.tmp are gone, `latest` and the previous
   checkpoint are as they were. The failure is a real one: at the hook's point the test lowers
   RLIMIT_FSIZE to 0, so the next write(2) fails (EFBIG, SIGXFSZ ignored) as it would with
   ENOSPC. The limit is restored before the test prints anything (stdout may be a file). */
typedef struct fail_at {
    const char *point;
    int index, fired;
} fail_at;

static void fail_hook(const char *point, int index, void *user) {
    fail_at *f = (fail_at *)user;
    struct rlimit rl;
    if (strcmp(point, f->point) != 0 || index != f->index || getrlimit(RLIMIT_FSIZE, &rl) != 0) return;
    rl.rlim_cur = 0;
    f->fired = setrlimit(RLIMIT_FSIZE, &rl) == 0;
}

static int path_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void failed_save_case(const char *dir, const char *point, int index) {
    small s;
    fail_at f;
    struct rlimit saved;
    dt_train_state ts;
    char name[128], tmp[1400], ltmp[1400], latest[64], err[DT_ERROR_MAX];
    int have_limit;
    dt_status st;
    f.point = point;
    f.index = index;
    f.fired = 0;
    small_init(&s, 10.0f);
    have_limit = getrlimit(RLIMIT_FSIZE, &saved) == 0;
    st = small_save(&s, dir, 10, 0, fail_hook, &f);
    if (have_limit) setrlimit(RLIMIT_FSIZE, &saved);
    snprintf(err, sizeof err, "%s", dt_ctx_error(&C));
    small_free(&s);
    snprintf(name, sizeof name, "failed_save_at_%s_%d_is_an_io_error", point, index);
    if (!f.fired) dt_test_fail(name, "the hook could not lower RLIMIT_FSIZE");
    else if (st != DT_ERR_IO || !strstr(err, "File too large"))
        dt_test_fail(name, "status %d (want %d, DT_ERR_IO): %s", (int)st, (int)DT_ERR_IO, err);
    else dt_test_pass(name);
    snprintf(tmp, sizeof tmp, "%s/step_00000010.tmp", dir);
    snprintf(ltmp, sizeof ltmp, "%s/latest.tmp", dir);
    snprintf(name, sizeof name, "failed_save_at_%s_%d_removes_step_tmp_and_latest_tmp", point, index);
    if (path_exists(tmp) || path_exists(ltmp))
        dt_test_fail(name, "%s %s, %s %s", tmp, path_exists(tmp) ? "exists" : "is gone", ltmp,
                     path_exists(ltmp) ? "exists" : "is gone");
    else dt_test_pass(name);
    read_latest(dir, latest, sizeof latest);
    small_init(&s, 0.0f);
    memset(&ts, 0, sizeof ts);
    st = small_load(&s, dir, &ts);
    snprintf(name, sizeof name, "failed_save_at_%s_%d_keeps_latest_and_step_5", point, index);
    if (strcmp(latest, "step_00000005\n") != 0 || st != DT_OK || ts.step != 5 || F(&s.p->value)[1] != 5.001f)
        dt_test_fail(name, "latest \"%.20s\", load status %d, step %lld, w[1] %.9g; want step_00000005, 0, 5, 5.001",
                     latest, (int)st, (long long)ts.step, (double)F(&s.p->value)[1]);
    else dt_test_pass(name);
    small_free(&s);
}

static void test_failed_save(void) {
    small s;
    char dir[1200];
    ck_dir(dir, sizeof dir, "failed_save");
    signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead of killing the process */
    small_init(&s, 5.0f);
    if (!ok(small_save(&s, dir, 5, 0, NULL, NULL), "save 5")) dt_test_fail("failed_save_baseline", "%s", dt_ctx_error(&C));
    small_free(&s);
    failed_save_case(dir, "tensor", 0);    /* inside the rank file */
    failed_save_case(dir, "rank_file", 0); /* the manifest cannot be written */
    failed_save_case(dir, "manifest", 0);  /* after the rename: latest.tmp cannot be written */
    signal(SIGXFSZ, SIG_DFL);
}

static void test_keep(void) {
    small s;
    char dir[1200], path[1400];
    int64_t step;
    int present = 0, absent = 0;
    ck_dir(dir, sizeof dir, "keep");
    small_init(&s, 1.0f);
    for (step = 1; step <= 5; step++) small_save(&s, dir, step * 100, 2, NULL, NULL);
    for (step = 1; step <= 5; step++) {
        DIR *d;
        snprintf(path, sizeof path, "%s/step_%08lld", dir, (long long)step * 100);
        d = opendir(path);
        if (d) closedir(d);
        if (step >= 4) present += d != NULL;
        else absent += d == NULL;
    }
    DT_TEST_CHECK("keep_2_keeps_the_newest_two", present == 2 && absent == 3);
    small_free(&s);
}

/* Corrupt, truncated, foreign and mismatched checkpoints: named errors, nothing changed. */
/* Replaces the file at path by text (a test's forged manifest or latest). */
static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fputs(text, fp) < 0) dt_test_fail("write_text", "cannot write %s", path);
    if (fp) fclose(fp);
}

static void test_bad_checkpoints(void) {
    small s, t;
    dt_params other;
    dt_param_desc pd;
    dt_train_state ts;
    dt_checkpoint_desc cd;
    dt_optimizer *sgd;
    dt_opt_desc od;
    char dir[1200], path[1400], cmd[3000];
    unsigned char before[64 * 16 * 4];
    FILE *fp;
    long size;
    dt_status st;
    ck_dir(dir, sizeof dir, "bad");
    small_init(&s, 3.0f);
    small_save(&s, dir, 7, 0, NULL, NULL);
    small_init(&t, 0.0f);
    memcpy(before, t.p->value.data, sizeof before);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;

    /* mismatches first, while the files are good */
    memset(&other, 0, sizeof other);
    add(&other, "w", DT_F32, 64, 17);
    st = dt_checkpoint_load(&C, &other, NULL, NULL, &cd);
    dt_test_error("load_wrong_global_shape_is_named", st, dt_ctx_error(&C), "global shape [64, 16]");
    add(&other, "extra", DT_F32, 3, 0);
    dt_params_free(&C, &other);
    memset(&other, 0, sizeof other);
    add(&other, "extra", DT_F32, 3, 0);
    st = dt_checkpoint_load(&C, &other, NULL, NULL, &cd);
    dt_test_error("load_missing_tensor_is_named", st, dt_ctx_error(&C), "no tensor \"param/extra\"");
    dt_params_free(&C, &other);
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_SGD; od.momentum = 0.9;
    sgd = mkopt(&t.ps, &od);
    st = dt_checkpoint_load(&C, &t.ps, sgd, NULL, &cd);
    dt_test_error("load_other_optimizer_is_named", st, dt_ctx_error(&C), "adamw");
    dt_opt_free(sgd);
    memset(&pd, 0, sizeof pd);
    st = dt_checkpoint_load(&C, &t.ps, NULL, NULL, &cd); /* parameters only: fine */
    DT_TEST_CHECK("load_params_only_works", st == DT_OK && F(&t.p->value)[0] == 3.0f);
    memcpy(t.p->value.data, before, sizeof before);

    /* a flipped byte in the data */
    snprintf(path, sizeof path, "%s/step_00000007/rank_00000.safetensors", dir);
    fp = fopen(path, "r+b");
    fseek(fp, 0, SEEK_END);
    size = ftell(fp);
    fseek(fp, size - 100, SEEK_SET);
    {
        int c = fgetc(fp);
        fseek(fp, size - 100, SEEK_SET);
        fputc(c ^ 0x10, fp);
        fclose(fp);
        st = small_load(&t, dir, &ts);
        dt_test_error("flipped_byte_is_a_checksum_error", st, dt_ctx_error(&C), "checksum mismatch");
        dt_test_equal_bytes("failed_load_changes_nothing", t.p->value.data, before, sizeof before);
        fp = fopen(path, "r+b");
        fseek(fp, size - 100, SEEK_SET);
        fputc(c, fp);
        fclose(fp);
    }
    DT_TEST_CHECK("restored_file_loads_again", small_load(&t, dir, &ts) == DT_OK && ts.step == 7);
    memcpy(t.p->value.data, before, sizeof before);
    /* truncated */
    if (truncate(path, size - 10) != 0) perror("truncate");
    st = small_load(&t, dir, &ts);
    dt_test_error("truncated_file_is_named", st, dt_ctx_error(&C), "truncated");
    dt_test_equal_bytes("truncated_load_changes_nothing", t.p->value.data, before, sizeof before);
    /* foreign manifest, non-JSON manifest, foreign latest, missing dir */
    snprintf(path, sizeof path, "%s/step_00000007/manifest.json", dir);
    write_text(path, "{\"format\": \"something-else\", \"version\": 1}");
    st = small_load(&t, dir, &ts);
    dt_test_error("foreign_manifest_is_named", st, dt_ctx_error(&C), "not a dt checkpoint");
    write_text(path, "\x89PNG\r\n\x1a\n binary");
    st = small_load(&t, dir, &ts);
    dt_test_error("non_json_manifest_is_named", st, dt_ctx_error(&C), "not JSON");
    snprintf(path, sizeof path, "%s/latest", dir);
    write_text(path, "../../etc");
    st = small_load(&t, dir, &ts);
    dt_test_error("foreign_latest_is_named", st, dt_ctx_error(&C), "not a step directory name");
    snprintf(cmd, sizeof cmd, "%s/does_not_exist", dir);
    st = small_load(&t, cmd, &ts);
    dt_test_error("missing_checkpoint_dir_is_named", st, dt_ctx_error(&C), "does_not_exist");
    DT_TEST_CHECK("missing_dir_is_io_error", st == DT_ERR_IO);
    snprintf(cmd, sizeof cmd, "%s/empty", dir);
    mkdir(cmd, 0777);
    st = small_load(&t, cmd, &ts);
    dt_test_error("dir_without_latest_is_named", st, dt_ctx_error(&C), "latest does not exist");
    dt_test_equal_bytes("bad_loads_change_nothing", t.p->value.data, before, sizeof before);
    small_free(&s);
    small_free(&t);
}

/* ---------------------------------------------------------------- bad arguments, helpers */

/* A group changed after dt_opt_create is named by the next step (it indexes desc.groups); the
   update functions leave their arrays as they were outside their contract (they return nothing). */
static void test_contract(void) {
    dt_params ps;
    dt_param *p;
    dt_optimizer *o;
    dt_opt_desc d;
    dt_status st;
    float w[5], g[5] = {1, 2, 3, 4, 5}, m[5] = {0}, v[5] = {0}, want[5];
    int i;
    memset(&ps, 0, sizeof ps);
    p = add(&ps, "w", DT_F32, 3, 0);
    memset(&d, 0, sizeof d);
    o = mkopt(&ps, &d);
    p->group = 200;
    st = dt_opt_step(o, NULL);
    dt_test_error("group_changed_after_create_is_named", st, dt_ctx_error(&C), "\"w\" has group 200 since dt_opt_create");
    p->group = 0;
    DT_TEST_CHECK("group_restored_steps", dt_opt_step(o, NULL) == DT_OK);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
    for (i = 0; i < 5; i++) w[i] = want[i] = W0[i];
    dt_adam_update(w, g, m, v, 5, 1e-3, 0.9, 0.999, 1e-8, 0, 0, 0); /* t 0: the bias corrections are 0 */
    dt_test_equal_bytes("adam_update_t0_writes_nothing", w, want, sizeof w);
    dt_adagrad_update(w, g, m, 5, 1e-2, 1.0, 0, 1e-10, 0);
    dt_test_equal_bytes("adagrad_update_t0_writes_nothing", w, want, sizeof w);
    dt_sgd_update(w, g, NULL, 5, 0.1, 0.9, 0, 0, 0, 1); /* momentum without its buffer */
    dt_test_equal_bytes("sgd_update_momentum_without_buf_writes_nothing", w, want, sizeof w);
    for (st = DT_OK, i = 0; i < 5; i++) st |= m[i] != 0 || v[i] != 0;
    DT_TEST_CHECK("update_state_untouched_outside_the_contract", st == DT_OK);
}

static void test_bad_args(void) {
    dt_params ps;
    dt_param *p;
    dt_optimizer *o = NULL;
    dt_opt_desc d;
    dt_status st;
    float seed;
    memset(&ps, 0, sizeof ps);
    p = add(&ps, "w", DT_F32, 2, 0);
    memset(&d, 0, sizeof d);
    d.lr = -0.1;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("negative_lr_is_named", st, dt_ctx_error(&C), "desc.lr = -0.1");
    d.lr = NAN;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("nan_lr_is_named", st, dt_ctx_error(&C), "desc.lr = nan");
    d.lr = 0;
    d.beta1 = 1.5;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("beta1_out_of_range_is_named", st, dt_ctx_error(&C), "desc.beta1 = 1.5; expected 0 <= beta1 < 1");
    d.beta1 = 0;
    d.beta2 = 1.0;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("beta2_equal_one_is_named", st, dt_ctx_error(&C), "desc.beta2 = 1");
    d.beta2 = 0;
    d.eps = -1e-8;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("negative_eps_is_named", st, dt_ctx_error(&C), "desc.eps");
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_SGD; d.nesterov = 1;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("nesterov_without_momentum_is_named", st, dt_ctx_error(&C), "nesterov needs momentum > 0");
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_SGD; d.momentum = 0.9; d.nesterov = 2; /* a flag is 0 or 1, never a silent "on" */
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("nesterov_not_0_or_1_is_named", st, dt_ctx_error(&C), "desc.nesterov = 2; expected 0 or 1");
    if (!st) dt_opt_free(o); /* only when the check failed */
    memset(&d, 0, sizeof d);
    p->no_decay = -1;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("no_decay_not_0_or_1_is_named", st, dt_ctx_error(&C), "\"w\" has no_decay = -1; expected 0 or 1");
    if (!st) dt_opt_free(o); /* only when the check failed */
    p->no_decay = 0;
    d.lr = 1e39; /* (float)lr would be undefined */
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("lr_beyond_float_is_named", st, dt_ctx_error(&C), "desc.lr = 1e+39");
    if (!st) dt_opt_free(o); /* only when the check failed */
    d.lr = 0;
    d.groups[3].weight_decay = 1e300;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("group_decay_beyond_float_is_named", st, dt_ctx_error(&C), "desc.groups[3].weight_decay = 1e+300");
    if (!st) dt_opt_free(o); /* only when the check failed */
    memset(&d, 0, sizeof d);
    d.loss_scale.mode = (dt_loss_scale_mode)9;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("unknown_loss_scale_mode_is_named", st, dt_ctx_error(&C), "desc.mode = 9 is not a dt_loss_scale_mode");
    if (!st) dt_opt_free(o); /* only when the check failed */
    memset(&d, 0, sizeof d);
    d.schedule.kind = (dt_lr_kind)9;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("unknown_schedule_kind_is_named", st, dt_ctx_error(&C), "desc.schedule.kind = 9 is not a dt_lr_kind");
    if (!st) dt_opt_free(o); /* only when the check failed */
    memset(&d, 0, sizeof d);
    d.kind = (dt_opt_kind)42;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("unknown_kind_is_named", st, dt_ctx_error(&C), "desc.kind = 42");
    memset(&d, 0, sizeof d);
    d.schedule.kind = DT_LR_COSINE; d.schedule.warmup_steps = 5; d.schedule.total_steps = 5;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("bad_schedule_is_named", st, dt_ctx_error(&C), "desc.schedule.total_steps = 5");
    memset(&d, 0, sizeof d);
    d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC; d.loss_scale.backoff_factor = 2;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("bad_backoff_is_named", st, dt_ctx_error(&C), "backoff_factor = 2");
    memset(&d, 0, sizeof d);
    p->group = DT_OPT_MAX_GROUPS;
    st = dt_opt_create(&C, &o, &ps, &d);
    dt_test_error("group_out_of_range_is_named", st, dt_ctx_error(&C), "has group 16");
    p->group = 0;
    d.accum_steps = 2;
    o = mkopt(&ps, &d);
    st = dt_opt_micro_begin(o, &seed, NULL, 2);
    dt_test_error("micro_out_of_range_is_named", st, dt_ctx_error(&C), "micro = 2");
    add(&ps, "late", DT_F32, 1, 0);
    st = dt_opt_step(o, NULL);
    dt_test_error("params_added_after_create_is_named", st, dt_ctx_error(&C), "created for 1");
    dt_opt_free(o);
    st = dt_train_state_set(&C, &(dt_train_state){0}, "", "x");
    dt_test_error("empty_train_state_key_is_named", st, dt_ctx_error(&C), "key");
    { /* a grad over another parameter's value (or grad): that value would move under its own update */
        dt_params q;
        dt_param *a, *b;
        dt_tensor keep;
        int64_t sh[1] = {2};
        memset(&q, 0, sizeof q);
        memset(&d, 0, sizeof d);
        a = add(&q, "a", DT_F32, 4, 0);
        b = add(&q, "b", DT_F32, 2, 0);
        keep = b->grad;
        dt_tensor_view(&C, &b->grad, &a->value, 1, 1, sh);
        st = dt_opt_create(&C, &o, &q, &d);
        dt_test_error("grad_over_another_value_is_named", st, dt_ctx_error(&C), "shares memory with");
        dt_tensor_view(&C, &b->grad, &a->grad, 2, 1, sh);
        st = dt_opt_create(&C, &o, &q, &d);
        dt_test_error("grad_over_another_grad_is_named", st, dt_ctx_error(&C), "\"b\" grad shares memory with \"a\" grad");
        b->grad = keep;
        o = NULL;
        st = dt_opt_create(&C, &o, &q, &d);
        DT_TEST_CHECK("params_apart_create", st == DT_OK);
        dt_opt_free(o);
        dt_params_free(&C, &q);
    }
    dt_params_free(&C, &ps);
}

static void test_xxh64(void) {
    static const char *fox = "Nobody inspects the spammish repetition";
    unsigned char buf[1000];
    dt_xxh64_state s;
    int i, split, bad = 0;
    DT_TEST_CHECK("xxh64_empty", dt_xxh64("", 0) == 0xEF46DB3751D8E999ull);
    DT_TEST_CHECK("xxh64_a", dt_xxh64("a", 1) == 0xD24EC4F1A98C6E5Bull);
    DT_TEST_CHECK("xxh64_abc", dt_xxh64("abc", 3) == 0x44BC2CF5AD770999ull);
    DT_TEST_CHECK("xxh64_long", dt_xxh64(fox, strlen(fox)) == 0xFBCEA83C8A378BF1ull);
    for (i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 131 + 7);
    for (split = 0; split <= 997; split += 37) {
        dt_xxh64_init(&s);
        dt_xxh64_update(&s, buf, (size_t)split);
        dt_xxh64_update(&s, buf + split, 3);
        dt_xxh64_update(&s, buf + split + 3, (size_t)(997 - split));
        if (dt_xxh64_final(&s) != dt_xxh64(buf, 1000)) bad++;
    }
    DT_TEST_CHECK("xxh64_streaming_equals_one_shot", bad == 0);
}

static void test_peak(void) {
    dt_tensor t;
    dt_tensor_desc d;
    size_t base;
    dt_reset_peak_bytes(&C);
    base = dt_peak_bytes(&C);
    DT_TEST_CHECK("reset_peak_is_in_use", base == C.bytes_in_use);
    memset(&d, 0, sizeof d);
    d.shape[0] = 1 << 16;
    dt_tensor_create(&C, &t, &d);
    dt_tensor_free(&C, &t);
    DT_TEST_CHECK("peak_counts_a_freed_tensor", dt_peak_bytes(&C) >= base + (1 << 18) && C.bytes_in_use == base);
}

/* A load copies straight from the file's mapping into the live tensors: its memory high-water
   mark stays far below one more copy of the state (a 4 MiB parameter and 8 MiB of AdamW
   state here; the old read-into-temporaries load needed 12 MiB more). The values must still
   arrive: the reloaded state equals the saved one bitwise. */
static void test_load_memory(void) {
    dt_params ps;
    dt_param_desc pd;
    dt_opt_desc od;
    dt_optimizer *o;
    dt_checkpoint_desc cd;
    char dir[1200];
    size_t state_bytes, base, extra;
    float *saved;
    int64_t i, n = 1 << 20;
    dt_status st;
    memset(&ps, 0, sizeof ps);
    memset(&pd, 0, sizeof pd);
    pd.name = "big"; pd.shape[0] = n;
    pd.init.kind = DT_INIT_NORMAL; pd.init.std = 1.0; pd.init.seed = 5;
    if (!ok(dt_params_add(&C, &ps, NULL, &pd), "params_add")) { dt_test_fail("load_memory_setup", "params_add"); return; }
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_ADAMW; od.lr = 1e-3f;
    o = mkopt(&ps, &od);
    for (i = 0; i < n; i++) ((float *)ps.items[0]->grad.data)[i] = (float)(i % 7) - 3.0f;
    dt_opt_step(o, NULL);
    if (!(saved = (float *)malloc((size_t)(3 * n) * sizeof(float)))) {
        dt_test_fail("load_memory_setup", "out of memory");
        dt_opt_free(o);
        dt_params_free(&C, &ps);
        return;
    }
    memcpy(saved, ps.items[0]->value.data, (size_t)n * 4);
    memcpy(saved + n, o->slots[0].state[0].data, (size_t)n * 4);
    memcpy(saved + 2 * n, o->slots[0].state[1].data, (size_t)n * 4);
    ck_dir(dir, sizeof dir, "load_memory");
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    st = dt_checkpoint_save(&C, &ps, o, NULL, &cd);
    if (!ok(st, "save")) { dt_test_fail("load_memory_save", "%s", dt_ctx_error(&C)); goto done; }
    dt_tensor_fill(&C, &ps.items[0]->value, 0.0);
    dt_tensor_fill(&C, &o->slots[0].state[0], 0.0);
    dt_tensor_fill(&C, &o->slots[0].state[1], 0.0);
    state_bytes = (size_t)(3 * n) * 4;
    dt_reset_peak_bytes(&C);
    base = C.bytes_in_use;
    st = dt_checkpoint_load(&C, &ps, o, NULL, &cd);
    extra = dt_peak_bytes(&C) - base;
    if (!ok(st, "load")) { dt_test_fail("load_memory_load", "%s", dt_ctx_error(&C)); goto done; }
#ifdef DT_OPT_NO_MMAP /* the files are read into memory: one more copy, and only that */
    if (extra >= state_bytes && extra < state_bytes + state_bytes / 16) dt_test_pass("load_reads_one_copy_of_the_state");
    else dt_test_fail("load_reads_one_copy_of_the_state", "load allocated %zu bytes at its peak for %zu bytes of "
                      "state; expected about one copy", extra, state_bytes);
#else
    if (extra < state_bytes / 16) dt_test_pass("load_needs_no_second_copy_of_the_state");
    else dt_test_fail("load_needs_no_second_copy_of_the_state", "load allocated %zu bytes at its peak for %zu bytes of "
                      "state; expected under %zu", extra, state_bytes, state_bytes / 16);
#endif
    dt_test_equal_bytes("load_memory_param_bitwise", ps.items[0]->value.data, saved, (size_t)n * 4);
    dt_test_equal_bytes("load_memory_exp_avg_bitwise", o->slots[0].state[0].data, saved + n, (size_t)n * 4);
    dt_test_equal_bytes("load_memory_exp_avg_sq_bitwise", o->slots[0].state[1].data, saved + 2 * n, (size_t)n * 4);
done:
    free(saved);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
}

/* Rewrites a saved manifest: replaces `from` by `to` (which must be found). */
static int edit_manifest(const char *dir, const char *from, const char *to) {
    char path[1200], text[4096], out[4096], *at;
    FILE *fp;
    size_t n;
    snprintf(path, sizeof path, "%s/step_00000000/manifest.json", dir);
    if (!(fp = fopen(path, "rb"))) return 0;
    n = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[n] = 0;
    if (!(at = strstr(text, from))) return 0;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    if (!(fp = fopen(path, "wb"))) return 0;
    fputs(out, fp);
    fclose(fp);
    return 1;
}

/* Manifests that pass every other count but are still wrong: two shards covering the same half
   of a tensor (their volumes add up to its size), and a data cursor beyond int64. Both are
   named errors and the parameter keeps its value. */
static void test_corrupt_manifest_fields(void) {
    char dir[1100];
    dt_params ps;
    dt_param_desc d;
    dt_param *x;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    dt_status st;
    int ok;
    memset(&ps, 0, sizeof ps);
    memset(&d, 0, sizeof d);
    d.name = "x"; d.shape[0] = 4;
    d.init.kind = DT_INIT_CONST; d.init.value = 7;
    dt_params_add(&C, &ps, &x, &d);
    snprintf(dir, sizeof dir, "%s/corrupt_fields", ROOT);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    memset(&ts, 0, sizeof ts);
    st = dt_checkpoint_save(&C, &ps, NULL, &ts, &cd);
    ok = st == DT_OK && edit_manifest(dir, "\"shards\":[{\"rank\":0,\"start\":[0],\"shape\":[4]}]",
                                      "\"shards\":[{\"rank\":0,\"start\":[0],\"shape\":[2]},{\"rank\":0,\"start\":[0],\"shape\":[2]}]");
    if (DT_TEST_CHECK("manifest_edit_for_overlap", ok)) {
        dt_tensor_fill(&C, &x->value, 1.0);
        st = dt_checkpoint_load(&C, &ps, NULL, NULL, &cd);
        dt_test_error("overlapping_shards_are_named", st, dt_ctx_error(&C), "overlap");
        dt_test_close("overlapping_shards_change_nothing", ((float *)x->value.data)[3], 1.0, 0);
    }
    st = dt_checkpoint_save(&C, &ps, NULL, &ts, &cd);
    ok = st == DT_OK && edit_manifest(dir, "\"data_cursor\":\"0\"", "\"data_cursor\":\"9300000000000000000\"");
    if (DT_TEST_CHECK("manifest_edit_for_cursor", ok)) {
        st = dt_checkpoint_load(&C, &ps, NULL, &ts, &cd);
        dt_test_error("data_cursor_beyond_int64_is_named", st, dt_ctx_error(&C), "train_state is malformed");
    }
    dt_params_free(&C, &ps);
}

/* Numbers in the optimizer entry of a manifest that do not fit the fields they land in (an int
   growth tracker, a float loss scale, int64 step and skip counts): named errors, not casts with
   undefined results, and the optimizer keeps its state. */
static void test_corrupt_scaler_fields(void) {
    static const char *const edits[4][3] = {
        {"\"growth_tracker\":0", "\"growth_tracker\":1e15", "manifest_growth_tracker_beyond_int_is_named"},
        {"\"scale\":65536", "\"scale\":1e300", "manifest_loss_scale_beyond_float_is_named"},
        {"\"kind\":\"adamw\",\"step\":\"0\"", "\"kind\":\"adamw\",\"step\":\"9300000000000000000\"",
         "manifest_optimizer_step_beyond_int64_is_named"},
        {"\"skipped\":\"0\"", "\"skipped\":\"9300000000000000000\"", "manifest_skipped_beyond_int64_is_named"}};
    char dir[1100];
    dt_params ps;
    dt_param_desc d;
    dt_opt_desc od;
    dt_optimizer *o;
    dt_checkpoint_desc cd;
    dt_status st;
    int e;
    memset(&ps, 0, sizeof ps);
    memset(&d, 0, sizeof d);
    d.name = "x"; d.shape[0] = 4;
    dt_params_add(&C, &ps, NULL, &d);
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_ADAMW;
    od.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
    snprintf(dir, sizeof dir, "%s/corrupt_scaler", ROOT);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    for (e = 0; e < 4; e++) {
        o = mkopt(&ps, &od); /* a fresh state per edit: each case stands alone */
        st = dt_checkpoint_save(&C, &ps, o, NULL, &cd);
        if (st != DT_OK || !edit_manifest(dir, edits[e][0], edits[e][1])) {
            dt_test_fail(edits[e][2], "setup: save status %d, or no %s in the manifest", (int)st, edits[e][0]);
        } else {
            st = dt_checkpoint_load(&C, &ps, o, NULL, &cd);
            if (o->scaler.scale != 65536 || o->scaler.growth_tracker != 0 || o->step != 0 || o->scaler.skipped != 0)
                dt_test_fail(edits[e][2], "the load changed the scaler: scale %g, tracker %d, step %lld, skipped %lld "
                             "(status %d)", o->scaler.scale, o->scaler.growth_tracker, (long long)o->step,
                             (long long)o->scaler.skipped, (int)st);
            else
                dt_test_error(edits[e][2], st, dt_ctx_error(&C), "optimizer entry is malformed");
        }
        dt_opt_free(o);
    }
    dt_params_free(&C, &ps);
}

/* Parameters with a zero dim ([0, 8] f32, [3, 0] bf16 with f32 master) beside a normal one:
   the optimizer is made, steps, saves and loads them (dt_tensor_create_like keeps ndim), and the
   normal parameter's update is the one it gets alone. */
static void test_empty_params(void) {
    dt_params ps = {0}, ref = {0};
    dt_param *w, *wr;
    dt_optimizer *opt = NULL, *opt_ref = NULL;
    dt_opt_desc od;
    dt_param_desc d;
    dt_checkpoint_desc cd;
    char dir[sizeof ROOT + 32];
    int ok = 1, i;
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_ADAMW; od.lr = 0.1;
    memset(&d, 0, sizeof d);
    d.name = "w"; d.shape[0] = 4; d.init.kind = DT_INIT_NORMAL; d.init.std = 1; d.init.seed = 3;
    ok = ok && !dt_params_add(&C, &ps, &w, &d) && !dt_params_add(&C, &ref, &wr, &d);
    memset(&d, 0, sizeof d);
    d.name = "empty_rows"; d.shape[0] = 0; d.shape[1] = 8; d.ndim = 2;
    ok = ok && !dt_params_add(&C, &ps, NULL, &d);
    d.name = "empty_cols_bf16"; d.shape[0] = 3; d.shape[1] = 0; d.ndim = 2; d.dtype = DT_BF16;
    ok = ok && !dt_params_add(&C, &ps, NULL, &d);
    ok = ok && !dt_opt_create(&C, &opt, &ps, &od) && !dt_opt_create(&C, &opt_ref, &ref, &od);
    if (!dt_test_check_all("opt_takes_params_with_a_zero_dim", ok, "%s", dt_ctx_error(&C))) goto done;
    for (i = 0; i < 4; i++) ((float *)w->grad.data)[i] = ((float *)wr->grad.data)[i] = 0.5f * (float)(i - 1);
    ok = !dt_opt_step(opt, NULL) && !dt_opt_step(opt_ref, NULL);
    dt_test_check_all("opt_step_with_empty_params_equals_without", ok && !memcmp(w->value.data, wr->value.data, 16),
                      "%s", ok ? "w differs from the run without empty params" : dt_ctx_error(&C));
    snprintf(dir, sizeof dir, "%s/empty_params", ROOT);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    ok = !dt_checkpoint_save(&C, &ps, opt, NULL, &cd) && !dt_checkpoint_load(&C, &ps, opt, NULL, &cd);
    dt_test_check_all("checkpoint_of_params_with_a_zero_dim_round_trips", ok && !memcmp(w->value.data, wr->value.data, 16),
                      "%s", ok ? "w changed by the round trip" : dt_ctx_error(&C));
done:
    dt_opt_free(opt);
    dt_opt_free(opt_ref);
    dt_params_free(&C, &ps);
    dt_params_free(&C, &ref);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    snprintf(ROOT, sizeof ROOT, "%s/test_opt", dt_test_tmpdir());
    mkdir(ROOT, 0777);
    test_optimizers();
    test_update_lanes();
    test_groups();
    test_schedules();
    test_loss_scaler();
    test_loss_scale_limits();
    test_lr_zero();
    test_master_weights();
    test_stochastic_rounding();
    test_accumulation();
    test_clipping();
    test_resume(DT_F32, "resume_f32");
    test_resume(DT_BF16, "resume_bf16_master");
    run_sr = 1; /* the rounding is a function of the step: a resumed run rounds as a straight one */
    test_resume(DT_BF16, "resume_bf16_stochastic_rounding");
    run_sr = 0;
    test_format();
    test_cross_precision();
    test_misaligned_convert();
    test_crash_safety();
    test_failed_save();
    test_keep();
    test_resave_same_step();
    test_bad_checkpoints();
    test_corrupt_manifest_fields();
    test_corrupt_scaler_fields();
    test_bad_args();
    test_contract();
    test_xxh64();
    test_peak();
    test_load_memory();
    test_empty_params();
    DT_TEST_CHECK("no_bytes_leaked", C.bytes_in_use == 0);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
