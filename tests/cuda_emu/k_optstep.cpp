// emu-modes: parallel random:1 (end to end through kernels whose own k_*.cpp runs every thread order)
// tests/cuda_emu/k_optstep.cpp - dt_opt_step on CUDA parameters (dt_opt.h built with DT_CUDA on the
// emulator): kernels/dt_opt.cu behind the optimizer. Three steps of SGD (momentum, nesterov, weight
// decay), AdamW and Adagrad on a set of CUDA parameters (one with no_decay, one in a group with its
// own lr scale) give the values of the same optimizer on the same CPU parameters and grads. Then
// the matrix SGD / Adam / AdamW / Adagrad x f32 / bf16 / f16 values x clipping off / on x loss
// scaling none / static / dynamic (an inf grad on step 2 when scaling): every step's status, skip
// flag, loss scale and optimizer step equal the CPU run's; the grad norm is within the bound of its
// sum order (the device reduces in a fixed order of its own); after the steps the values, f32
// masters and optimizer state are the CPU's: bitwise without clipping (the kernels do the CPU's
// float ops in its order, g++ contracts no FMA; a real GPU may differ in the last bit), within the
// bound of a clip factor one float rounding apart with it. Two CUDA runs are bitwise alike. A
// second dt_opt_step makes no allocation, free, copy or wait (ctx->counters and the emulator's own
// counts); info and scaling read back only where dt_opt.h says. A checkpoint saved from CUDA
// parameters loads into CPU ones and back, equal; grads moved after dt_opt_create are followed.
// Mixed devices, non-f32 grads and a grad gone are named. Stochastic rounding gives the CPU's bits,
// for whole bf16 parameters and shards split inside their rows.
#include <math.h>
#include <cuda_runtime.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "tests/dt_test.h"

/* The grad norm's bound: both sums add exact products (a float squared fits a double), each
   within (n - 1) 2^-53 of the exact norm^2 whatever its order, so norm^2 differs by at most
   2 (n - 1) 2^-53 norm^2 and the norm by half that relatively; n = 35 + 7 + 117 elements. */
static const double NORM_RTOL = 2.0 * (35 + 7 + 117 - 1) * 0x1p-53;

static int k_small(void) {
    const char *e = getenv("DT_K_SMALL"); /* the ThreadSanitizer run */
    return e && e[0] == '1';
}

static dt_ctx ctx;

/* Three parameters on dev, values from the seed (sharding-invariant init), grads set per step. */
static void make_set(dt_params *ps, dt_device dev, dt_dtype dtype = DT_F32) {
    const char *names[3] = {"w", "b", "emb"};
    int64_t d0[3] = {5, 7, 9}, d1[3] = {7, 0, 13};
    memset(ps, 0, sizeof *ps);
    for (int i = 0; i < 3; i++) {
        dt_param_desc d;
        dt_param *p;
        memset(&d, 0, sizeof d);
        d.name = names[i]; d.device = dev; d.shape[0] = d0[i]; d.shape[1] = d1[i]; d.dtype = dtype;
        d.init.kind = DT_INIT_NORMAL; d.init.std = 0.5; d.init.seed = 3;
        d.no_decay = i == 1; d.group = i == 2;
        if (dt_params_add(&ctx, ps, &p, &d)) dt_test_fail("params_add", "%s", dt_ctx_error(&ctx));
    }
}
/* Grads in [-1, 1) times scale (what a backward seeded with the loss scale gives); inf_at >= 0
   puts +inf at that element of the second parameter. */
static uint64_t grad_seed = 9; /* new grads for every case: their sums of squares round differently */
static void set_grads(dt_params *ps, int step, float scale = 1.0f, int64_t inf_at = -1) {
    for (int i = 0; i < ps->count; i++) {
        dt_tensor *g = &ps->items[i]->grad, h;
        dt_tensor_create_like(&ctx, &h, g, DT_DTYPE_DEFAULT, DT_CPU);
        for (int64_t k = 0; k < h.numel; k++)
            /* magnitudes 2^-5 .. 2^5 and 24 significant bits: the sums of squares round, so only the
               CPU's order gives the CPU's bits (grads on a 2^-23 grid would sum exactly) */
            ((float *)h.data)[k] = scale * (2.0f * dt_rng_uniform(grad_seed, (uint64_t)(step * 8 + i), (uint64_t)k) - 1.0f) *
                                   1.37f * (float)ldexp(1.0, (int)((k * 7) % 11) - 5);
        if (i == 1 && inf_at >= 0 && inf_at < h.numel) ((float *)h.data)[inf_at] = INFINITY;
        dt_tensor_copy(&ctx, g, &h);
        dt_tensor_free(&ctx, &h);
    }
}

static void compare(const char *kind, dt_opt_desc *d) {
    dt_params hp, dp;
    dt_optimizer *ho = NULL, *dop = NULL;
    char name[512];
    make_set(&hp, DT_CPU);
    make_set(&dp, DT_CUDA_DEVICE);
    d->groups[1].lr_scale = 0.5;
    snprintf(name, sizeof name, "opt_create_cuda_params_%s", kind);
    if (dt_opt_create(&ctx, &ho, &hp, d) || dt_opt_create(&ctx, &dop, &dp, d)) {
        dt_test_fail(name, "%s", dt_ctx_error(&ctx));
        dt_params_free(&ctx, &hp); dt_params_free(&ctx, &dp);
        return;
    }
    for (int step = 1; step <= 3; step++) {
        dt_opt_step_info hi, di;
        set_grads(&hp, step);
        set_grads(&dp, step);
#ifndef DT_EMU_STUBS
        long long vec0 = dt_emu_vector_accesses(); /* the step's own: after the grads went up */
        int rep0 = dt_emu_report_count();
#endif
        dt_status a = dt_opt_step(ho, &hi), b = dt_opt_step(dop, &di);
#ifndef DT_EMU_STUBS
        /* "w" (35 elements at 0) goes four at a time up to 32; "b" and "emb" start at 35 and 42, off
           the 16-byte grid, and go one at a time: both paths ran, and no access was misaligned */
        snprintf(name, sizeof name, "opt_step_cuda_update_takes_16_byte_accesses_where_aligned_%s_step%d", kind, step);
        if (!DT_TEST_CHECK(name, dt_emu_vector_accesses() > vec0 && dt_emu_report_count() == rep0))
            printf("  %lld vector accesses, %d emulator reports: %s\n", dt_emu_vector_accesses() - vec0,
                   dt_emu_report_count() - rep0, dt_emu_report_count() > rep0 ? dt_emu_last_report() : "");
#endif
        snprintf(name, sizeof name, "opt_step_cuda_params_returns_ok_%s_step%d", kind, step);
        if (!DT_TEST_CHECK(name, a == DT_OK && b == DT_OK)) { printf("  %s\n", dt_ctx_error(&ctx)); break; }
        snprintf(name, sizeof name, "opt_step_cuda_grad_norm_within_order_bound_of_cpu_%s_step%d", kind, step);
        dt_test_close(name, di.grad_norm, hi.grad_norm, NORM_RTOL * hi.grad_norm);
    }
    for (int i = 0; i < hp.count; i++) {
        dt_tensor h;
        dt_tensor_create_like(&ctx, &h, &dp.items[i]->value, DT_DTYPE_DEFAULT, DT_CPU);
        dt_tensor_copy(&ctx, &h, &dp.items[i]->value);
        snprintf(name, sizeof name, "opt_step_cuda_%s_equals_cpu_after_3_steps_%s", hp.items[i]->name, kind);
        /* the kernels do the CPU update's float ops in its order; g++ on x86-64 does not contract them */
        dt_test_allclose(name, (const float *)h.data, (const float *)hp.items[i]->value.data, (size_t)h.numel, 0, 0);
        dt_tensor_free(&ctx, &h);
    }
    dt_opt_free(ho); dt_opt_free(dop);
    dt_params_free(&ctx, &hp); dt_params_free(&ctx, &dp);
}

/* t (any float dtype, either device) as f32 host floats. */
static std::vector<float> host_f32(const dt_tensor *t) {
    std::vector<float> out((size_t)t->numel);
    dt_tensor h;
    dt_tensor_create_like(&ctx, &h, t, DT_DTYPE_DEFAULT, DT_CPU);
    dt_tensor_copy(&ctx, &h, t);
    dt_convert(&ctx, out.data(), DT_F32, h.data, h.dtype, h.numel);
    dt_tensor_free(&ctx, &h);
    return out;
}

/* Values, masters and state of two optimizers over the same parameters, bitwise (rtol = 0) or
   within rtol (f32 tensors) and one unit of the last place of a bf16 / f16 value (rtol16). */
static void same_state(const char *what, dt_optimizer *a, dt_optimizer *b, double rtol, double rtol16 = 0) {
    char name[512];
    for (int i = 0; i < a->n_slots; i++) {
        const dt_tensor *ta[4] = {&a->slots[i].param->value, &a->slots[i].master, &a->slots[i].state[0],
                                  &a->slots[i].state[1]};
        const dt_tensor *tb[4] = {&b->slots[i].param->value, &b->slots[i].master, &b->slots[i].state[0],
                                  &b->slots[i].state[1]};
        const char *part[4] = {"value", "master", "state0", "state1"};
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "%s_%s_%s", what, a->slots[i].param->name, part[k]);
            if (!ta[k]->data || !tb[k]->data) {
                DT_TEST_CHECK(name, !ta[k]->data == !tb[k]->data);
                continue;
            }
            std::vector<float> x = host_f32(tb[k]), y = host_f32(ta[k]);
            dt_test_allclose(name, x.data(), y.data(), x.size(), 0, ta[k]->dtype == DT_F32 ? rtol : rtol16);
        }
    }
}

/* One cell of the matrix: 3 steps (an inf grad on step 2 when scaling) on CPU and CUDA copies. */
static void matrix_cell(dt_opt_kind kind, dt_dtype dtype, int clip, dt_loss_scale_mode mode) {
    static const char *kinds[] = {"default", "sgd", "adam", "adamw", "adagrad"};
    static const char *modes[] = {"default", "none", "static", "dynamic"};
    dt_params hp, dp;
    dt_optimizer *ho = NULL, *dop = NULL;
    dt_opt_desc d;
    char tag[160], name[512];
    snprintf(tag, sizeof tag, "%s_%s_clip%d_scale_%s", kinds[kind], dt_dtype_name(dtype), clip, modes[mode]);
    grad_seed++;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.lr = kind == DT_OPT_SGD ? 0.1 : 0.01;
    if (kind == DT_OPT_SGD) { d.momentum = 0.9; d.weight_decay = 0.01; }
    if (kind == DT_OPT_ADAM) d.weight_decay = 0.01;
    if (kind == DT_OPT_ADAGRAD) { d.initial_accumulator_value = 0.1; d.lr_decay = 0.01; d.weight_decay = 0.01; }
    d.clip_norm = clip ? 0.5 : 0; /* the grads' norm is about 30: every step clips */
    d.loss_scale.mode = mode;
    d.loss_scale.init_scale = 1024;
    d.loss_scale.growth_interval = 1; /* grows after every clean step: the growth path runs too */
    d.groups[1].lr_scale = 0.5;
    make_set(&hp, DT_CPU, dtype);
    make_set(&dp, DT_CUDA_DEVICE, dtype);
    snprintf(name, sizeof name, "opt_create_cuda_%s", tag);
    if (!DT_TEST_CHECK(name, dt_opt_create(&ctx, &ho, &hp, &d) == DT_OK && dt_opt_create(&ctx, &dop, &dp, &d) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&ctx));
    } else {
        for (int step = 1; step <= 3; step++) {
            int scaling = mode != DT_LOSS_SCALE_NONE;
            dt_opt_step_info hi, di;
            set_grads(&hp, step, (float)ho->scaler.scale, scaling && step == 2 ? 3 : -1);
            set_grads(&dp, step, (float)dop->scaler.scale, scaling && step == 2 ? 3 : -1);
            dt_status a = dt_opt_step(ho, &hi), b = dt_opt_step(dop, &di);
            snprintf(name, sizeof name, "opt_step_cuda_ok_%s_step%d", tag, step);
            if (!DT_TEST_CHECK(name, a == DT_OK && b == DT_OK)) { printf("  %s\n", dt_ctx_error(&ctx)); break; }
            snprintf(name, sizeof name, "opt_step_cuda_skip_flag_equals_cpu_%s_step%d", tag, step);
            if (!DT_TEST_CHECK(name, di.skipped == hi.skipped && hi.skipped == (scaling && step == 2)))
                printf("  cuda skipped %d, cpu %d\n", di.skipped, hi.skipped);
            snprintf(name, sizeof name, "opt_step_cuda_grad_norm_within_order_bound_of_cpu_%s_step%d", tag, step);
            if (hi.skipped) DT_TEST_CHECK(name, di.grad_norm == hi.grad_norm); /* both inf */
            else dt_test_close(name, di.grad_norm, hi.grad_norm, NORM_RTOL * hi.grad_norm);
            snprintf(name, sizeof name, "opt_step_cuda_loss_scale_and_step_equal_cpu_%s_step%d", tag, step);
            if (!DT_TEST_CHECK(name, di.loss_scale == hi.loss_scale && dop->scaler.scale == ho->scaler.scale &&
                                         dop->step == ho->step && dop->scaler.growth_tracker == ho->scaler.growth_tracker))
                printf("  scale cuda %g cpu %g, step cuda %lld cpu %lld\n", dop->scaler.scale, ho->scaler.scale,
                       (long long)dop->step, (long long)ho->step);
        }
        /* the schedule of the scale itself: dynamic backs off on the inf step and grows on clean
           ones (interval 1), static stays */
        snprintf(name, sizeof name, "opt_step_cuda_scale_after_3_steps_%s", tag);
        dt_test_close(name, dop->scaler.scale, mode == DT_LOSS_SCALE_DYNAMIC ? 1024.0 * 2 * 0.5 * 2 :
                                               mode == DT_LOSS_SCALE_STATIC ? 1024.0 : 1.0, 0);
        /* with clipping, the f32 clip factor (max_norm / (norm + 1e-6)) of norms NORM_RTOL apart
           is at most one float rounding (2^-24) apart: the updates then differ by a few 2^-24
           relative (2^-20 allowed), which may move a bf16 / f16 value by one unit in its last place */
        snprintf(name, sizeof name, "opt_step_cuda_state_%s_cpu_%s", clip ? "within_clip_rounding_of" : "bitwise", tag);
        same_state(name, ho, dop, clip ? 0x1p-20 : 0, clip ? (dtype == DT_BF16 ? 0x1p-7 : 0x1p-10) : 0);
    }
    dt_opt_free(ho); dt_opt_free(dop);
    dt_params_free(&ctx, &hp); dt_params_free(&ctx, &dp);
}

/* Save from CUDA parameters (bf16 values, f32 masters and Adam state on the device), load into
   CPU parameters, and back: each load equals what was saved. */
static void checkpoint_round_trip(void) {
    dt_params src, cpu, dev;
    dt_optimizer *so = NULL, *co = NULL, *go = NULL;
    dt_opt_desc d;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    char dir[900];
    const char *tmp = getenv("DT_TEST_TMPDIR");
    snprintf(dir, sizeof dir, "%s/k_optstep_ckpt", tmp ? tmp : "/tmp");
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.01; d.clip_norm = 0.5; d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
    make_set(&src, DT_CUDA_DEVICE, DT_BF16);
    make_set(&cpu, DT_CPU, DT_BF16);
    make_set(&dev, DT_CUDA_DEVICE, DT_BF16);
    memset(&cd, 0, sizeof cd);
    memset(&ts, 0, sizeof ts);
    cd.dir = dir;
    if (dt_opt_create(&ctx, &so, &src, &d) || dt_opt_create(&ctx, &co, &cpu, &d) || dt_opt_create(&ctx, &go, &dev, &d)) {
        dt_test_fail("ckpt_cuda_opt_create", "%s", dt_ctx_error(&ctx));
    } else {
        for (int step = 1; step <= 2; step++) {
            set_grads(&src, step, (float)so->scaler.scale);
            dt_opt_step(so, NULL);
        }
        ts.step = 2;
        if (!DT_TEST_CHECK("ckpt_save_from_cuda_params_ok", dt_checkpoint_save(&ctx, &src, so, &ts, &cd) == DT_OK))
            printf("  %s\n", dt_ctx_error(&ctx));
        if (!DT_TEST_CHECK("ckpt_load_into_cpu_params_ok", dt_checkpoint_load(&ctx, &cpu, co, NULL, &cd) == DT_OK))
            printf("  %s\n", dt_ctx_error(&ctx));
        same_state("ckpt_cuda_saved_equals_cpu_loaded", so, co, 0);
        DT_TEST_CHECK("ckpt_cuda_to_cpu_step_and_scale", co->step == so->step && co->scaler.scale == so->scaler.scale);
        /* and back: one more CPU step, saved, loaded into fresh CUDA parameters */
        set_grads(&cpu, 3, (float)co->scaler.scale);
        dt_opt_step(co, NULL);
        ts.step = 3;
        if (!DT_TEST_CHECK("ckpt_save_from_cpu_params_ok", dt_checkpoint_save(&ctx, &cpu, co, &ts, &cd) == DT_OK))
            printf("  %s\n", dt_ctx_error(&ctx));
        if (!DT_TEST_CHECK("ckpt_load_into_cuda_params_ok", dt_checkpoint_load(&ctx, &dev, go, NULL, &cd) == DT_OK))
            printf("  %s\n", dt_ctx_error(&ctx));
        same_state("ckpt_cpu_saved_equals_cuda_loaded", co, go, 0);
        DT_TEST_CHECK("ckpt_cpu_to_cuda_step_and_scale", go->step == co->step && go->scaler.scale == co->scaler.scale);
        /* the loaded CUDA optimizer steps on as the CPU one does */
        set_grads(&cpu, 4, (float)co->scaler.scale);
        set_grads(&dev, 4, (float)go->scaler.scale);
        dt_opt_step(co, NULL);
        dt_opt_step(go, NULL);
        same_state("ckpt_resumed_cuda_step_within_clip_rounding_of_cpu_step", co, go, 0x1p-20, 0x1p-7);
    }
    dt_opt_free(so); dt_opt_free(co); dt_opt_free(go);
    dt_params_free(&ctx, &src); dt_params_free(&ctx, &cpu); dt_params_free(&ctx, &dev);
}

/* Two CUDA runs of the same steps (AdamW, bf16 values, clipping, dynamic scaling with an inf on
   step 2): every norm and all the state bitwise alike, whatever the emulator's thread order. */
static void determinism(void) {
    dt_params a, b;
    dt_optimizer *oa = NULL, *ob = NULL;
    dt_opt_desc d;
    char name[200];
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.01; d.clip_norm = 0.5; d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
    d.loss_scale.init_scale = 1024; d.loss_scale.growth_interval = 1;
    make_set(&a, DT_CUDA_DEVICE, DT_BF16);
    make_set(&b, DT_CUDA_DEVICE, DT_BF16);
    grad_seed++;
    if (!DT_TEST_CHECK("opt_step_cuda_determinism_create", dt_opt_create(&ctx, &oa, &a, &d) == DT_OK &&
                                                               dt_opt_create(&ctx, &ob, &b, &d) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&ctx));
    } else {
        for (int step = 1; step <= 3; step++) {
            dt_opt_step_info ia, ib;
            set_grads(&a, step, (float)oa->scaler.scale, step == 2 ? 3 : -1);
            set_grads(&b, step, (float)ob->scaler.scale, step == 2 ? 3 : -1);
            dt_opt_step(oa, &ia);
            dt_opt_step(ob, &ib);
            snprintf(name, sizeof name, "opt_step_cuda_two_runs_same_norm_bitwise_step%d", step);
            if (!DT_TEST_CHECK(name, ia.grad_norm == ib.grad_norm && ia.skipped == ib.skipped))
                printf("  %.17g vs %.17g\n", ia.grad_norm, ib.grad_norm);
        }
        same_state("opt_step_cuda_two_runs_same_state_bitwise", oa, ob, 0);
    }
    dt_opt_free(oa); dt_opt_free(ob);
    dt_params_free(&ctx, &a); dt_params_free(&ctx, &b);
}

/* Stochastic rounding (dt_opt_desc.stochastic_rounding): the kernel's bits are the CPU's, for a
   whole bf16 parameter and for shards whose elements sit apart in their whole tensor (a column
   shard, a shard split along every dim: the kernel's index arithmetic), with dynamic loss scaling
   (an inf grad on step 2: the skipped step must not advance the rounding's step). Against
   rounding to nearest the values differ (the rounding ran). */
static void make_sr_set(dt_params *ps, dt_device dev) {
    static const struct { const char *name; int nd; int64_t shape[3], global[3], start[3]; } P[] = {
        {"w", 2, {5, 7, 0}, {0, 0, 0}, {0, 0, 0}},
        {"cols", 2, {4, 2, 0}, {4, 6, 0}, {0, 3, 0}},
        {"every", 3, {2, 2, 3}, {4, 3, 5}, {2, 1, 1}},
        {"rows", 2, {3, 9, 0}, {8, 9, 0}, {4, 0, 0}}};
    memset(ps, 0, sizeof *ps);
    for (int i = 0; i < 4; i++) {
        dt_param_desc d;
        dt_param *p;
        memset(&d, 0, sizeof d);
        d.name = P[i].name; d.device = dev; d.dtype = DT_BF16; d.ndim = P[i].nd;
        for (int k = 0; k < P[i].nd; k++) { d.shape[k] = P[i].shape[k]; d.global_shape[k] = P[i].global[k]; d.start[k] = P[i].start[k]; }
        d.init.kind = DT_INIT_NORMAL; d.init.std = 0.5; d.init.seed = 3;
        if (dt_params_add(&ctx, ps, &p, &d)) dt_test_fail("params_add_sr", "%s", dt_ctx_error(&ctx));
    }
}

static void stochastic_rounding(void) {
    dt_params hp, dp, np;
    dt_optimizer *ho = NULL, *dop = NULL, *no = NULL;
    dt_opt_desc d;
    dt_comm *world = NULL;
    if (dt_comm_create_world(&ctx, &world, NULL)) { dt_test_fail("opt_sr_world", "%s", dt_ctx_error(&ctx)); return; }
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 1e-3; d.stochastic_rounding = 1; d.rounding_seed = 11;
    d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC; d.loss_scale.init_scale = 1024;
    d.norm.shard_comm = world; d.comm = world;
    make_sr_set(&hp, DT_CPU);
    make_sr_set(&dp, DT_CUDA_DEVICE);
    make_sr_set(&np, DT_CUDA_DEVICE);
    grad_seed++;
    if (!DT_TEST_CHECK("opt_sr_create", dt_opt_create(&ctx, &ho, &hp, &d) == DT_OK && dt_opt_create(&ctx, &dop, &dp, &d) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&ctx));
    } else {
        d.stochastic_rounding = 0;
        if (dt_opt_create(&ctx, &no, &np, &d)) printf("  %s\n", dt_ctx_error(&ctx));
        for (int step = 1; step <= 4; step++) {
            dt_opt_step_info hi, di, ni; /* asked for: the host's copy of the device's scale is current */
            set_grads(&hp, step, (float)ho->scaler.scale, step == 2 ? 3 : -1);
            set_grads(&dp, step, (float)dop->scaler.scale, step == 2 ? 3 : -1);
            set_grads(&np, step, no ? (float)no->scaler.scale : 1.0f, step == 2 ? 3 : -1);
            if (dt_opt_step(ho, &hi) || dt_opt_step(dop, &di) || (no && dt_opt_step(no, &ni)))
                printf("  %s\n", dt_ctx_error(&ctx));
        }
        same_state("opt_sr_cuda_bitwise_cpu", ho, dop, 0);
        if (no) {
            int64_t differ = 0, n = 0;
            for (int i = 0; i < dp.count; i++) {
                std::vector<float> a = host_f32(&dp.items[i]->value), b = host_f32(&np.items[i]->value);
                for (size_t k = 0; k < a.size(); k++) differ += a[k] != b[k];
                n += (int64_t)a.size();
            }
            /* AdamW's first steps move each master by about lr: a fraction of a bf16 step that
               nearest rounding mostly undoes and stochastic rounding often keeps */
            if (!DT_TEST_CHECK("opt_sr_cuda_differs_from_nearest", differ > n / 20))
                printf("  %lld of %lld values differ\n", (long long)differ, (long long)n);
        }
    }
    dt_opt_free(ho); dt_opt_free(dop); dt_opt_free(no);
    dt_params_free(&ctx, &hp); dt_params_free(&ctx, &dp); dt_params_free(&ctx, &np);
    dt_comm_free(world);
}

/* What a step asks of the device, from dt's counts (ctx->counters) and the emulator's own. */
static dt_cuda_counters step_counts(dt_optimizer *o, dt_opt_step_info *info, dt_emu_counters *emu, int micro) {
    dt_emu_counters e0, e1;
    float dloss;
    if (micro) dt_opt_micro_begin(o, &dloss, NULL, 0); /* before the counts: what the step does alone */
    dt_ctx_counters_reset(&ctx);
    dt_emu_get_counters(&e0);
    if (dt_opt_step(o, info)) printf("  dt_opt_step: %s\n", dt_ctx_error(&ctx));
    dt_emu_get_counters(&e1);
    emu->syncs = e1.syncs - e0.syncs; emu->allocs = e1.allocs - e0.allocs; emu->frees = e1.frees - e0.frees;
    emu->h2d_bytes = e1.h2d_bytes - e0.h2d_bytes; emu->h2d_calls = e1.h2d_calls - e0.h2d_calls;
    emu->d2h_bytes = e1.d2h_bytes - e0.d2h_bytes; emu->d2h_calls = e1.d2h_calls - e0.d2h_calls;
    return ctx.counters;
}
static int counts_are(const char *name, const dt_cuda_counters &c, const dt_emu_counters &e, int d2h, int syncs) {
    int ok = c.allocs == 0 && c.frees == 0 && c.h2d_calls == 0 && c.d2h_calls == d2h && c.syncs == syncs &&
             e.allocs == 0 && e.frees == 0 && e.h2d_calls == 0 && e.d2h_calls == d2h && e.syncs == syncs;
    if (!DT_TEST_CHECK(name, ok))
        printf("  dt: allocs %lld frees %lld h2d %lld d2h %lld syncs %lld; emulator: allocs %lld frees %lld h2d %lld "
               "d2h %lld syncs %lld; expected d2h %d syncs %d, the rest 0\n", (long long)c.allocs, (long long)c.frees,
               (long long)c.h2d_calls, (long long)c.d2h_calls, (long long)c.syncs, e.allocs, e.frees, e.h2d_calls,
               e.d2h_calls, e.syncs, d2h, syncs);
    return ok;
}

/* A step after the first (clipping on) stays on the device: no allocation, free, copy or wait.
   With info, one copy back and one wait; with loss scaling, dt_opt_micro_begin reads the scale
   the device decided (one copy, one wait) and the step after it none. */
static void counters(void) {
    static const dt_loss_scale_mode modes[] = {DT_LOSS_SCALE_NONE, DT_LOSS_SCALE_DYNAMIC};
    for (int m = 0; m < 2; m++) {
        dt_params ps;
        dt_optimizer *o = NULL;
        dt_opt_desc d;
        dt_opt_step_info info;
        dt_emu_counters e;
        dt_cuda_counters c;
        char name[200];
        const char *tag = m ? "dynamic_scaling" : "no_scaling";
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_ADAMW; d.lr = 0.01; d.clip_norm = 0.5; d.loss_scale.mode = modes[m];
        make_set(&ps, DT_CUDA_DEVICE, m ? DT_F16 : DT_F32);
        if (dt_opt_create(&ctx, &o, &ps, &d)) {
            dt_test_fail("opt_counters_create", "%s", dt_ctx_error(&ctx));
            dt_params_free(&ctx, &ps);
            continue;
        }
        set_grads(&ps, 1, (float)o->scaler.scale);
        step_counts(o, NULL, &e, m); /* the first step: the scratch grows */
        set_grads(&ps, 2, (float)o->scaler.scale);
        if (m) { /* the seed of the next step reads the scale the device decided */
            float dloss;
            dt_ctx_counters_reset(&ctx);
            dt_opt_micro_begin(o, &dloss, NULL, 0);
            snprintf(name, sizeof name, "opt_micro_begin_reads_device_scale_once_%s", tag);
            DT_TEST_CHECK(name, ctx.counters.d2h_calls == 1 && ctx.counters.syncs == 1 && dloss == (float)o->scaler.scale);
        }
        c = step_counts(o, NULL, &e, 0);
        snprintf(name, sizeof name, "opt_step_second_step_no_alloc_copy_or_wait_clip_on_%s", tag);
        counts_are(name, c, e, 0, 0);
        set_grads(&ps, 3, (float)o->scaler.scale);
        c = step_counts(o, NULL, &e, m);
        snprintf(name, sizeof name, "opt_step_after_micro_begin_no_copy_or_wait_%s", tag);
        counts_are(name, c, e, 0, 0);
        set_grads(&ps, 4, (float)o->scaler.scale);
        c = step_counts(o, &info, &e, m);
        snprintf(name, sizeof name, "opt_step_with_info_reads_back_once_%s", tag);
        counts_are(name, c, e, 1, 1);
        snprintf(name, sizeof name, "opt_step_with_info_has_the_norm_%s", tag);
        DT_TEST_CHECK(name, info.grad_norm > 0.5 && !info.skipped && o->step == 4);
        dt_opt_free(o);
        dt_params_free(&ctx, &ps);
    }
}

int main(void) {
    dt_ctx_desc cd;
    dt_opt_desc d;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &cd)) { dt_test_fail("ctx_init_cuda", "%s", dt_ctx_error(&ctx)); return dt_test_finish(); }
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_SGD; d.lr = 0.1; d.momentum = 0.9; d.nesterov = 1; d.weight_decay = 0.01;
    compare("sgd_nesterov", &d);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.01;
    compare("adamw", &d);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAGRAD; d.lr = 0.05; d.initial_accumulator_value = 0.1; d.lr_decay = 0.01;
    compare("adagrad", &d);
    {
        static const dt_opt_kind kinds[] = {DT_OPT_SGD, DT_OPT_ADAM, DT_OPT_ADAMW, DT_OPT_ADAGRAD};
        static const dt_dtype dtypes[] = {DT_F32, DT_BF16, DT_F16};
        static const dt_loss_scale_mode modes[] = {DT_LOSS_SCALE_NONE, DT_LOSS_SCALE_STATIC, DT_LOSS_SCALE_DYNAMIC};
        const int small = k_small();
        for (int k = 0; k < 4; k++)
            for (int t = 0; t < 3; t++)
                for (int c = 0; c < 2; c++)
                    for (int m = 0; m < 3; m++)
                        /* TSan: one cell per kind, every dtype, mode and clip among them */
                        if (!small || (c == k % 2 && t == (k + 1) % 3 && m == (k + 2) % 3))
                            matrix_cell(kinds[k], dtypes[t], c, modes[m]);
    }
    checkpoint_round_trip();
    determinism();
    stochastic_rounding();
    counters();
    { /* grads that move after dt_opt_create (a bucketer made later turns them into views of its
         buckets): the step follows them; a grad gone (data NULL) is named, not read */
        dt_params hp, dp;
        dt_optimizer *ho = NULL, *dop = NULL;
        dt_opt_step_info hi, di;
        dt_tensor moved;
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_ADAMW; d.lr = 0.01; d.clip_norm = 0.5; d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
        make_set(&hp, DT_CPU);
        make_set(&dp, DT_CUDA_DEVICE);
        dt_opt_create(&ctx, &ho, &hp, &d);
        dt_opt_create(&ctx, &dop, &dp, &d);
        dt_tensor_create_like(&ctx, &moved, &dp.items[2]->grad, DT_DTYPE_DEFAULT, DT_CUDA_DEVICE);
        dt_tensor_free(&ctx, &dp.items[2]->grad);
        dp.items[2]->grad = moved;
        set_grads(&hp, 1, (float)ho->scaler.scale);
        set_grads(&dp, 1, (float)dop->scaler.scale);
        DT_TEST_CHECK("opt_step_cuda_moved_grad_ok", dt_opt_step(ho, &hi) == DT_OK && dt_opt_step(dop, &di) == DT_OK);
        dt_test_close("opt_step_cuda_moved_grad_norm_within_order_bound_of_cpu", di.grad_norm, hi.grad_norm,
                      NORM_RTOL * hi.grad_norm);
        same_state("opt_step_cuda_moved_grad_state_within_clip_rounding_of_cpu", ho, dop, 0x1p-20);
        {
            void *keep = dp.items[1]->grad.data;
            dp.items[1]->grad.data = NULL;
            dt_test_error("opt_step_cuda_grad_data_null_is_named", dt_opt_step(dop, NULL), dt_ctx_error(&ctx),
                          "\"b\" grad is f32 on cuda with 7 elements (data NULL)");
            dp.items[1]->grad.data = keep;
        }
        dt_opt_free(ho); dt_opt_free(dop);
        dt_params_free(&ctx, &hp); dt_params_free(&ctx, &dp);
    }
    { /* bad inputs: named, nothing read on the host */
        dt_params dp;
        dt_optimizer *o = NULL;
        make_set(&dp, DT_CUDA_DEVICE);
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_SGD; d.lr = 0.1;
        { /* a CPU parameter among CUDA ones */
            dt_param_desc pd;
            dt_param *p;
            memset(&pd, 0, sizeof pd);
            pd.name = "on_cpu"; pd.device = DT_CPU; pd.shape[0] = 4;
            dt_params_add(&ctx, &dp, &p, &pd);
            dt_test_error("opt_create_mixed_devices_is_named", dt_opt_create(&ctx, &o, &dp, &d), dt_ctx_error(&ctx),
                          "\"on_cpu\" value is on cpu and grad on cpu, but \"w\" is on cuda");
            DT_TEST_CHECK("opt_create_mixed_devices_leaves_out_null", o == NULL);
        }
        dt_params_free(&ctx, &dp);
        make_set(&dp, DT_CPU);
        { /* a CUDA parameter among CPU ones: DT_ERR_DEVICE too, not a dtype or "not in this build" */
            dt_param_desc pd;
            dt_param *p;
            memset(&pd, 0, sizeof pd);
            pd.name = "on_cuda"; pd.device = DT_CUDA_DEVICE; pd.shape[0] = 4;
            dt_params_add(&ctx, &dp, &p, &pd);
            dt_status st = dt_opt_create(&ctx, &o, &dp, &d);
            dt_test_error("opt_create_cuda_param_after_cpu_ones_is_named", st, dt_ctx_error(&ctx),
                          "\"on_cuda\" value is on cuda and grad on cuda, but \"w\" is on cpu");
            DT_TEST_CHECK("opt_create_cuda_param_after_cpu_ones_is_DT_ERR_DEVICE", st == DT_ERR_DEVICE && o == NULL);
        }
        dt_params_free(&ctx, &dp);
        make_set(&dp, DT_CUDA_DEVICE);
        { /* a grad that is not f32 (swapped in by hand: dt_params_add always makes f32 grads) */
            dt_tensor g16, keep = dp.items[2]->grad;
            dt_tensor_create_like(&ctx, &g16, &keep, DT_BF16, DT_CUDA_DEVICE);
            dp.items[2]->grad = g16;
            dt_test_error("opt_create_cuda_bf16_grad_is_named", dt_opt_create(&ctx, &o, &dp, &d), dt_ctx_error(&ctx),
                          "\"emb\" value is f32, grad bf16 on cuda; expected an f32, bf16 or f16 value and an f32 grad");
            dp.items[2]->grad = keep;
            dt_tensor_free(&ctx, &g16);
        }
        dt_params_free(&ctx, &dp);
    }
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
