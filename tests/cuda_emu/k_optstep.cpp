// tests/cuda_emu/k_optstep.cpp - dt_opt_step on CUDA parameters (dt_opt.h built with DT_CUDA on the
// emulator): kernels/dt_opt.cu's updates wired behind the optimizer. Three steps of SGD (momentum,
// nesterov, weight decay), AdamW and Adagrad on a set of CUDA parameters (one with no_decay, one in
// a group with its own lr scale) give the values of the same optimizer on the same CPU parameters
// and grads; the grad norm of dt_opt_step_info agrees; what is not wired yet (loss scaling,
// clipping, mixed devices) is named, not run.
#include <math.h>
#include <cuda_runtime.h>
#include <vector>
#define DT_CUDA
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "tests/dt_test.h"

static dt_ctx ctx;

/* Three parameters on dev, values from the seed (sharding-invariant init), grads set per step. */
static void make_set(dt_params *ps, dt_device dev) {
    const char *names[3] = {"w", "b", "emb"};
    int64_t d0[3] = {5, 7, 3}, d1[3] = {7, 0, 11};
    memset(ps, 0, sizeof *ps);
    for (int i = 0; i < 3; i++) {
        dt_param_desc d;
        dt_param *p;
        memset(&d, 0, sizeof d);
        d.name = names[i]; d.device = dev; d.shape[0] = d0[i]; d.shape[1] = d1[i];
        d.init.kind = DT_INIT_NORMAL; d.init.std = 0.5; d.init.seed = 3;
        d.no_decay = i == 1; d.group = i == 2;
        if (dt_params_add(&ctx, ps, &p, &d)) dt_test_fail("params_add", "%s", dt_ctx_error(&ctx));
    }
}
static void set_grads(dt_params *ps, int step) {
    for (int i = 0; i < ps->count; i++) {
        dt_tensor *g = &ps->items[i]->grad, h;
        dt_tensor_create_like(&ctx, &h, g, DT_DTYPE_DEFAULT, DT_CPU);
        for (int64_t k = 0; k < h.numel; k++)
            ((float *)h.data)[k] = 2.0f * dt_rng_uniform(9, (uint64_t)(step * 8 + i), (uint64_t)k) - 1.0f;
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
        dt_status a = dt_opt_step(ho, &hi), b = dt_opt_step(dop, &di);
        snprintf(name, sizeof name, "opt_step_cuda_params_returns_ok_%s_step%d", kind, step);
        if (!DT_TEST_CHECK(name, a == DT_OK && b == DT_OK)) { printf("  %s\n", dt_ctx_error(&ctx)); break; }
        snprintf(name, sizeof name, "opt_step_cuda_grad_norm_matches_cpu_%s_step%d", kind, step);
        dt_test_close(name, di.grad_norm, hi.grad_norm, 1e-12 * hi.grad_norm);
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
    { /* not wired yet for CUDA grads: named, nothing read on the host */
        dt_params dp, hp;
        dt_optimizer *o = NULL;
        make_set(&dp, DT_CUDA_DEVICE);
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_SGD; d.lr = 0.1; d.clip_norm = 1.0;
        dt_test_error("opt_create_cuda_params_clip_norm_is_named_unsupported", dt_opt_create(&ctx, &o, &dp, &d),
                      dt_ctx_error(&ctx), "clip_norm = 1 with parameters on cuda");
        d.clip_norm = 0; d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
        DT_TEST_CHECK("opt_create_cuda_params_loss_scaling_is_DT_ERR_UNSUPPORTED",
                      dt_opt_create(&ctx, &o, &dp, &d) == DT_ERR_UNSUPPORTED && o == NULL);
        d.loss_scale.mode = DT_LOSS_SCALE_DEFAULT;
        make_set(&hp, DT_CPU);
        { /* a CPU parameter among CUDA ones */
            dt_param_desc pd;
            dt_param *p;
            memset(&pd, 0, sizeof pd);
            pd.name = "on_cpu"; pd.device = DT_CPU; pd.shape[0] = 4;
            dt_params_add(&ctx, &dp, &p, &pd);
            dt_test_error("opt_create_mixed_devices_is_named", dt_opt_create(&ctx, &o, &dp, &d), dt_ctx_error(&ctx),
                          "\"on_cpu\" value is on cpu and grad on cpu, but \"w\" is on cuda");
        }
        dt_params_free(&ctx, &dp); dt_params_free(&ctx, &hp);
    }
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
