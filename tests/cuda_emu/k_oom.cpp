// emu-modes: parallel (a sweep of whole training steps: its kernels have their own tests in every order)
// emu-tsan: skip (no kernel of its own)
// tests/cuda_emu/k_oom.cpp - out of device memory at every allocation of a bf16 training step on CUDA
// tensors (dt_tensor.h and dt_opt.h with DT_CUDA, on the emulator). The step: a context, bf16
// parameters with f32 masters (dt_params, AdamW), a layernorm, the qkv linear, grouped-query
// attention on the tensor cores (2 query heads, 1 kv head), the output projection, a linear with
// GELU and its second linear; their backward; an optimizer step; the values read back. The
// emulator counts the allocations of one clean run (cudaMalloc and pinned memory: dt_emu_allocations),
// then for every n of them runs again with the n-th failing (dt_emu_fail_alloc), as a GPU that is full
// fails it:
//   - the failing call returns DT_ERR_OOM with a message that names the call and cudaMalloc (the
//     bytes asked for); no call before it fails, and no emulator report (no bad free, no fault);
//   - the same call, asked again with the memory back, succeeds in the same ctx (a failed
//     allocation leaves nothing behind: no half-grown scratch, no stale CUDA error that the next
//     launch's check would take for its own), and the rest of the step after it;
//   - the values read back at the end are bit for bit the clean run's (the calls that failed wrote
//     nothing a retry adds to twice), except where the failed call was one that adds into its
//     outputs after allocating part-way (none here: every op allocates before it writes);
//   - after freeing everything, no device or pinned allocation is left (dt_emu_live_allocations).
#include <math.h>
#include <cuda_runtime.h>
#include <functional>
#include <string>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "tests/dt_test.h"

static const int64_t B = 2, T = 16, H = 2, HKV = 1, HS = 32, C = H * HS, W = (H + 2 * HKV) * HS, F = 4 * C;

struct run_t {
    dt_ctx ctx;
    bool ctx_up = false;
    dt_params ps;
    dt_param *wq = NULL, *bq = NULL, *wo = NULL, *bo = NULL, *wf = NULL, *bf = NULL, *w2 = NULL, *b2 = NULL;
    dt_param *lw = NULL, *lb = NULL;
    dt_optimizer *opt = NULL;
    std::vector<dt_tensor *> acts; /* every activation and gradient made, freed at the end */
    dt_tensor *x, *ln, *mean, *rstd, *qkv, *att, *proj, *pre, *fc, *y, *dy, *dfc, *dpre, *dln, *dproj, *datt, *dqkv,
        *dln2, *dx;
    std::vector<float> values; /* every parameter's value, read back at the end */
    std::string init_msg;      /* dt_ctx_init's message when it failed */
};

static dt_status param(run_t &r, dt_param **p, const char *name, int64_t d0, int64_t d1, dt_dtype dt, int no_decay) {
    dt_param_desc d;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.dtype = dt;
    d.device = DT_CUDA_DEVICE;
    d.shape[0] = d0;
    d.shape[1] = d1;
    d.init.kind = DT_INIT_NORMAL;
    d.init.std = 0.2;
    d.init.seed = 11;
    d.no_decay = no_decay;
    return dt_params_add(&r.ctx, &r.ps, p, &d);
}

static dt_status act(run_t &r, dt_tensor **t, dt_dtype dt, int nd, int64_t d0, int64_t d1, int64_t d2 = 0) {
    dt_tensor_desc d;
    dt_tensor *n = new dt_tensor;
    memset(&d, 0, sizeof d);
    memset(n, 0, sizeof *n);
    d.dtype = dt;
    d.device = DT_CUDA_DEVICE;
    d.ndim = nd;
    d.shape[0] = d0;
    d.shape[1] = d1;
    d.shape[2] = d2;
    dt_status st = dt_tensor_create(&r.ctx, n, &d);
    if (st) { delete n; return st; }
    r.acts.push_back(n);
    *t = n;
    return DT_OK;
}

/* [B, T, w] seen as [B T, w] and back. */
static dt_tensor as2(run_t &r, dt_tensor *t) {
    dt_tensor v;
    int64_t s[2] = {t->numel / t->shape[t->ndim - 1], t->shape[t->ndim - 1]};
    dt_tensor_reshape(&r.ctx, &v, t, 2, s);
    return v;
}

/* A value on the host from a seed, into a CUDA tensor (one copy). */
static dt_status fill_from(run_t &r, dt_tensor *t, uint64_t seed) {
    std::vector<float> h((size_t)t->numel);
    for (size_t i = 0; i < h.size(); i++) h[i] = 2.0f * (float)dt_rng_uniform(seed, 0, i) - 1.0f;
    dt_tensor ht;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32;
    d.device = DT_CPU;
    d.ndim = 1;
    d.shape[0] = t->numel;
    dt_status st = dt_tensor_create(&r.ctx, &ht, &d);
    if (st) return st;
    memcpy(ht.data, h.data(), h.size() * sizeof(float));
    dt_tensor flat;
    int64_t s[1] = {t->numel};
    st = dt_tensor_reshape(&r.ctx, &flat, t, 1, s);
    if (!st) st = dt_tensor_copy(&r.ctx, &flat, &ht);
    dt_tensor_free(&r.ctx, &ht);
    return st;
}

/* The step, as calls; each returns its status (the ctx's message on failure). */
static std::vector<std::pair<std::string, std::function<dt_status(run_t &)>>> steps(void) {
    std::vector<std::pair<std::string, std::function<dt_status(run_t &)>>> s;
    s.push_back({"dt_ctx_init", [](run_t &r) {
                     dt_ctx_desc d;
                     memset(&d, 0, sizeof d);
                     d.device = DT_CUDA_DEVICE;
                     dt_status st = dt_ctx_init(&r.ctx, &d);
                     if (st) {
                         r.init_msg = dt_ctx_error(&r.ctx);
                         dt_ctx_shutdown(&r.ctx); /* what a caller does with a ctx that failed */
                     } else r.ctx_up = true;
                     return st;
                 }});
    /* parameters: bf16 matrices, f32 norms and biases */
    struct pd { const char *name; dt_param **(*at)(run_t &); int64_t d0, d1; dt_dtype dt; int no_decay; };
    static const pd P[] = {
        {"ln.w", [](run_t &r) { return &r.lw; }, C, 0, DT_F32, 1},
        {"ln.b", [](run_t &r) { return &r.lb; }, C, 0, DT_F32, 1},
        {"qkv.w", [](run_t &r) { return &r.wq; }, W, C, DT_BF16, 0},
        {"qkv.b", [](run_t &r) { return &r.bq; }, W, 0, DT_F32, 1},
        {"proj.w", [](run_t &r) { return &r.wo; }, C, C, DT_BF16, 0},
        {"proj.b", [](run_t &r) { return &r.bo; }, C, 0, DT_F32, 1},
        {"fc.w", [](run_t &r) { return &r.wf; }, F, C, DT_BF16, 0},
        {"fc.b", [](run_t &r) { return &r.bf; }, F, 0, DT_F32, 1},
        {"fc2.w", [](run_t &r) { return &r.w2; }, C, F, DT_BF16, 0},
        {"fc2.b", [](run_t &r) { return &r.b2; }, C, 0, DT_F32, 1},
    };
    for (const pd &p : P)
        s.push_back({std::string("dt_params_add ") + p.name,
                     [&p](run_t &r) { return param(r, p.at(r), p.name, p.d0, p.d1, p.dt, p.no_decay); }});
    s.push_back({"activations", [](run_t &r) {
                     dt_status st = act(r, &r.x, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.ln, DT_BF16, 3, B, T, C);
                     if (!st) st = act(r, &r.mean, DT_F32, 2, B, T);
                     if (!st) st = act(r, &r.rstd, DT_F32, 2, B, T);
                     if (!st) st = act(r, &r.qkv, DT_BF16, 3, B, T, W);
                     if (!st) st = act(r, &r.att, DT_BF16, 3, B, T, C);
                     if (!st) st = act(r, &r.proj, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.pre, DT_BF16, 3, B, T, F);
                     if (!st) st = act(r, &r.fc, DT_BF16, 3, B, T, F);
                     if (!st) st = act(r, &r.y, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.dy, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.dfc, DT_F32, 3, B, T, F);
                     if (!st) st = act(r, &r.dpre, DT_F32, 3, B, T, F);
                     if (!st) st = act(r, &r.dln, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.dproj, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.datt, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.dqkv, DT_F32, 3, B, T, W);
                     if (!st) st = act(r, &r.dln2, DT_F32, 3, B, T, C);
                     if (!st) st = act(r, &r.dx, DT_F32, 3, B, T, C);
                     return st;
                 }});
    s.push_back({"inputs", [](run_t &r) {
                     dt_status st = fill_from(r, r.x, 5);
                     if (!st) st = fill_from(r, r.dy, 6);
                     if (!st) st = fill_from(r, r.dproj, 7);
                     return st;
                 }});
    s.push_back({"dt_opt_create", [](run_t &r) {
                     dt_opt_desc d;
                     memset(&d, 0, sizeof d);
                     d.kind = DT_OPT_ADAMW;
                     d.lr = 1e-2;
                     d.weight_decay = 0.1;
                     d.clip_norm = 1.0;
                     return dt_opt_create(&r.ctx, &r.opt, &r.ps, &d);
                 }});
    /* forward */
    s.push_back({"dt_layernorm_fwd", [](run_t &r) {
                     return dt_layernorm_fwd(&r.ctx, r.ln, r.mean, r.rstd, r.x, &r.lw->value, &r.lb->value, 1e-5f);
                 }});
    s.push_back({"dt_linear_fwd qkv", [](run_t &r) {
                     dt_tensor o = as2(r, r.qkv), i = as2(r, r.ln);
                     return dt_linear_fwd(&r.ctx, &o, &i, &r.wq->value, &r.bq->value);
                 }});
    s.push_back({"dt_attention_gqa_fwd", [](run_t &r) {
                     return dt_attention_gqa_fwd(&r.ctx, r.att, NULL, r.qkv, (int)H, (int)HKV);
                 }});
    s.push_back({"dt_linear_fwd proj", [](run_t &r) {
                     dt_tensor o = as2(r, r.proj), i = as2(r, r.att);
                     return dt_linear_fwd(&r.ctx, &o, &i, &r.wo->value, &r.bo->value);
                 }});
    s.push_back({"dt_linear_gelu_fwd", [](run_t &r) {
                     dt_tensor o = as2(r, r.fc), p = as2(r, r.pre), i = as2(r, r.ln);
                     return dt_linear_gelu_fwd(&r.ctx, &o, &p, &i, &r.wf->value, &r.bf->value);
                 }});
    s.push_back({"dt_linear_fwd fc2", [](run_t &r) {
                     dt_tensor o = as2(r, r.y), i = as2(r, r.fc);
                     return dt_linear_fwd(&r.ctx, &o, &i, &r.w2->value, &r.b2->value);
                 }});
    /* backward: the gradients start at 0 (dt_params' grads, the activations' here) */
    s.push_back({"zero grads", [](run_t &r) {
                     dt_status st = DT_OK;
                     for (int i = 0; i < r.ps.count && !st; i++) st = dt_tensor_fill(&r.ctx, &r.ps.items[i]->grad, 0.0);
                     dt_tensor *z[] = {r.dfc, r.dpre, r.dln, r.datt, r.dqkv, r.dln2, r.dx};
                     for (dt_tensor *t : z)
                         if (!st) st = dt_tensor_fill(&r.ctx, t, 0.0);
                     return st;
                 }});
    s.push_back({"dt_linear_bwd fc2", [](run_t &r) {
                     dt_tensor dx = as2(r, r.dfc), g = as2(r, r.dy), x = as2(r, r.fc);
                     return dt_linear_bwd(&r.ctx, &dx, &r.w2->grad, &r.b2->grad, &g, &x, &r.w2->value);
                 }});
    s.push_back({"dt_gelu_bwd", [](run_t &r) { return dt_gelu_bwd(&r.ctx, r.dpre, r.dfc, r.pre); }});
    s.push_back({"dt_linear_bwd fc", [](run_t &r) {
                     dt_tensor dx = as2(r, r.dln), g = as2(r, r.dpre), x = as2(r, r.ln);
                     return dt_linear_bwd(&r.ctx, &dx, &r.wf->grad, &r.bf->grad, &g, &x, &r.wf->value);
                 }});
    s.push_back({"dt_linear_bwd proj", [](run_t &r) {
                     dt_tensor dx = as2(r, r.datt), g = as2(r, r.dproj), x = as2(r, r.att);
                     return dt_linear_bwd(&r.ctx, &dx, &r.wo->grad, &r.bo->grad, &g, &x, &r.wo->value);
                 }});
    s.push_back({"dt_attention_gqa_bwd", [](run_t &r) {
                     return dt_attention_gqa_bwd(&r.ctx, r.dqkv, r.datt, r.qkv, NULL, (int)H, (int)HKV);
                 }});
    s.push_back({"dt_linear_bwd qkv", [](run_t &r) {
                     dt_tensor dx = as2(r, r.dln2), g = as2(r, r.dqkv), x = as2(r, r.ln);
                     return dt_linear_bwd(&r.ctx, &dx, &r.wq->grad, &r.bq->grad, &g, &x, &r.wq->value);
                 }});
    s.push_back({"dt_axpy", [](run_t &r) { return dt_axpy(&r.ctx, r.dln, 1.0f, r.dln2); }});
    s.push_back({"dt_layernorm_bwd", [](run_t &r) {
                     return dt_layernorm_bwd(&r.ctx, r.dx, &r.lw->grad, &r.lb->grad, r.dln, r.x, &r.lw->value, r.mean,
                                             r.rstd);
                 }});
    s.push_back({"dt_opt_step", [](run_t &r) {
                     dt_opt_step_info info;
                     return dt_opt_step(r.opt, &info);
                 }});
    s.push_back({"dt_ctx_sync", [](run_t &r) { return dt_ctx_sync(&r.ctx); }});
    s.push_back({"read back", [](run_t &r) {
                     r.values.clear();
                     for (int i = 0; i < r.ps.count; i++) {
                         dt_tensor h, *v = &r.ps.items[i]->value;
                         dt_status st = dt_tensor_create_like(&r.ctx, &h, v, DT_DTYPE_DEFAULT, DT_CPU);
                         if (!st) st = dt_tensor_copy(&r.ctx, &h, v);
                         if (st) return st;
                         for (int64_t k = 0; k < h.numel; k++)
                             r.values.push_back(v->dtype == DT_BF16 ? dt_bf16_to_f32(((uint16_t *)h.data)[k]) : ((float *)h.data)[k]);
                         dt_tensor_free(&r.ctx, &h);
                     }
                     dt_tensor *g[] = {r.dx, r.dqkv};
                     for (dt_tensor *t : g) {
                         dt_tensor h;
                         dt_status st = dt_tensor_create_like(&r.ctx, &h, t, DT_F32, DT_CPU);
                         if (!st) st = dt_tensor_copy(&r.ctx, &h, t);
                         if (st) return st;
                         r.values.insert(r.values.end(), (float *)h.data, (float *)h.data + h.numel);
                         dt_tensor_free(&r.ctx, &h);
                     }
                     return DT_OK;
                 }});
    return s;
}

static void release(run_t &r) {
    if (!r.ctx_up) return;
    for (dt_tensor *t : r.acts) {
        dt_tensor_free(&r.ctx, t);
        delete t;
    }
    r.acts.clear();
    if (r.opt) dt_opt_free(r.opt);
    r.opt = NULL;
    dt_params_free(&r.ctx, &r.ps);
    dt_ctx_shutdown(&r.ctx);
    r.ctx_up = false;
}

/* One run; fail_at > 0: the fail_at-th allocation from the start fails. What happened: the step
   that failed (-1: none), its status and message, whether the rest went through. */
struct outcome {
    int failed_step = -1, retry_failed_step = -1, reports = 0;
    dt_status st = DT_OK;
    std::string msg, retry_msg;
    std::vector<float> values;
    long long live = 0;
};

static outcome run(long long fail_at) {
    run_t r;
    outcome o;
    memset(&r.ps, 0, sizeof r.ps);
    memset(&r.ctx, 0, sizeof r.ctx);
    int reports0 = dt_emu_report_count();
    long long live0 = dt_emu_live_allocations();
    auto s = steps();
    dt_emu_fail_alloc(fail_at);
    for (size_t i = 0; i < s.size(); i++) {
        dt_status st = s[i].second(r);
        if (st && o.failed_step < 0) {
            o.failed_step = (int)i;
            o.st = st;
            o.msg = i == 0 ? r.init_msg : std::string(dt_ctx_error(&r.ctx));
            dt_emu_fail_alloc(0); /* the memory is back: the same call again */
            st = s[i].second(r);
        }
        if (st) {
            o.retry_failed_step = (int)i;
            o.retry_msg = dt_ctx_error(&r.ctx);
            break;
        }
    }
    dt_emu_fail_alloc(0);
    o.values = r.values;
    release(r);
    o.live = dt_emu_live_allocations() - live0;
    o.reports = dt_emu_report_count() - reports0;
    return o;
}

int main(void) {
    long long a0 = dt_emu_allocations();
    outcome clean = run(0);
    long long n = dt_emu_allocations() - a0;
    auto s = steps();
    if (!DT_TEST_CHECK("oom_clean_run_completes", clean.retry_failed_step < 0 && clean.failed_step < 0 && n > 0)) {
        printf("  step %d: %s (%lld allocations)\n", clean.retry_failed_step, clean.retry_msg.c_str(), n);
        return dt_test_finish();
    }
    printf("the clean step makes %lld allocations; each fails once in turn\n", n);
    int named = 0, retried = 0, same = 0, freed = 0, quiet = 0;
    for (long long k = 1; k <= n; k++) {
        outcome o = run(k);
        const char *name = o.failed_step >= 0 ? s[(size_t)o.failed_step].first.c_str() : "(none)";
        /* the message: out of memory, from cudaMalloc or cudaHostAlloc, the bytes, and the dt_ call
           that asked (dt_params_add's names the dt_tensor_create inside it) */
        bool ok_named = o.failed_step >= 0 && o.st == DT_ERR_OOM && o.msg.find("out of memory") != std::string::npos &&
                        (o.msg.find("cudaMalloc") != std::string::npos || o.msg.find("cudaHostAlloc") != std::string::npos) &&
                        o.msg.find("bytes") != std::string::npos && o.msg.compare(0, 3, "dt_") == 0;
        if (ok_named) named++;
        else dt_test_fail("oom_is_named_by_the_failing_call", "allocation %lld: step %s returned %s, \"%s\"", k, name,
                          dt_status_name(o.st), o.msg.c_str());
        if (o.retry_failed_step < 0) retried++;
        else dt_test_fail("oom_call_succeeds_when_asked_again", "allocation %lld failed %s; then step %s failed: \"%s\"", k,
                          name, s[(size_t)o.retry_failed_step].first.c_str(), o.retry_msg.c_str());
        bool eq = o.values.size() == clean.values.size() &&
                  (o.values.empty() || !memcmp(o.values.data(), clean.values.data(), o.values.size() * sizeof(float)));
        if (eq) same++;
        else {
            size_t at = 0;
            while (at < o.values.size() && at < clean.values.size() && !memcmp(&o.values[at], &clean.values[at], 4)) at++;
            dt_test_fail("oom_then_retry_gives_the_clean_runs_bits", "allocation %lld (in %s): value %zu is %.9g, %.9g in the clean run (%zu / %zu values)",
                         k, name, at, at < o.values.size() ? o.values[at] : NAN, at < clean.values.size() ? clean.values[at] : NAN,
                         o.values.size(), clean.values.size());
        }
        if (o.live == 0) freed++;
        else dt_test_fail("oom_leaves_no_allocation_behind", "allocation %lld (in %s): %lld allocations still held after every free",
                          k, name, o.live);
        if (o.reports == 0) quiet++;
        else dt_test_fail("oom_makes_no_emulator_report", "allocation %lld (in %s): %d reports; the last: %s", k, name, o.reports,
                          dt_emu_last_report());
    }
    printf("of %lld failed allocations: %d named, %d retried to the end, %d with the clean bits, %d freed, %d without a report\n",
           n, named, retried, same, freed, quiet);
    if (named == n) dt_test_pass("oom_is_named_by_the_failing_call");
    if (retried == n) dt_test_pass("oom_call_succeeds_when_asked_again");
    if (same == n) dt_test_pass("oom_then_retry_gives_the_clean_runs_bits");
    if (freed == n) dt_test_pass("oom_leaves_no_allocation_behind");
    if (quiet == n) dt_test_pass("oom_makes_no_emulator_report");
    DT_TEST_CHECK("oom_clean_run_leaves_no_allocation_behind", clean.live == 0);
    return dt_test_finish();
}
