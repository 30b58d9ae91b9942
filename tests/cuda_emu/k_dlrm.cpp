// emu-modes: parallel (end to end through kernels whose own k_*.cpp runs every thread order)
// emu-tsan: skip (the kernels it runs have their own TSan runs in k_*.cpp)
// tests/cuda_emu/k_dlrm.cpp - examples/dlrm with --device cuda end to end on the emulator: the
// example's own model, forward and backward (dlrm.c included with DLRM_NO_MAIN) on a ctx whose
// device is cuda (MLPs, interaction, activations, optimizer step and the 26 tables' shards on
// the device; dt_embed desc.device cuda) against the same code on a cpu ctx, 5 steps of a tiny
// model (dim 4, rows capped at 16, batch 16), for DLRM with SGD and table-wise tables, and DCNv2
// with Adagrad and data-parallel tables: every step's loss within LOSS_RTOL relative (derived
// below), --dtype bf16 (10 steps: cuda against cpu, and cpu bf16 against f32; check_bf16), and the table
// rows after training within 1e-5 relative + 1e-7 absolute (the dense GEMMs are cuBLAS-on-OpenBLAS
// against the CPU's GEMM, so the gradients reaching the tables differ in the last bits; the
// embedding path itself is bitwise, tests/cuda_emu/k_embed_tables.cpp); and on the cuda run, over
// each step, ctx->counters agree with the emulator's own counts. One rank. With the
// argument "tsan" (the ThreadSanitizer run): the ops only (2 training steps took over 8 minutes
// under TSan on the loaded 2-core CI machine); in the serial thread orders (DT_EMU_MODE forward,
// reverse, random): DLRM only, 3 steps.
#include <cuda_runtime.h>
#include <math.h>
#include <vector>
#define DT_CUDA
#define DLRM_NO_MAIN
#pragma GCC diagnostic ignored "-Wunused-function" /* main's helpers (eval, checkpoints) */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers" /* C's = {0} */
#include "examples/dlrm/dlrm.c"
#include "tests/dt_test.h"

enum { STEPS = 5 };

// The losses' tolerance, derived: the kernels sum in fixed orders of their own, not the CPU's
// (u = 2^-24). BCE's derivative in the logit is sigmoid(z) - y, at most 1 in size, so the loss
// moves by at most the logit's own error. Along the longest chain of sums to a logit, DLRM's:
// the bottom MLP over 13 then 8 inputs, the dot interaction over D = 4, the top MLP over
// 4 + 27 x 26 / 2 = 355 then 8 (DCNv2's: 13, 8, the cross layer over 4 + 26 x 4 = 108, the top
// over 108 and 8: less), 388 terms in all. Each layer's sum in another order differs by at most
// 2 K u of its sum of |w h|, which the init keeps at the logit's scale (|z| <= ~1 here): so
// |d loss| <= 2 x 388 u = 4.6e-5, 6.7e-5 of the initial loss ln 2. Later steps add the weights'
// difference, which the optimizers keep to ~lr x the gradients' relative rounding: below that.
static const double LOSS_RTOL = 7e-5;

// On the cuda runs, ctx->counters against the emulator's own counts over each step (as
// k_gpt.cpp's check_counters): what dt says a step asked of the device is what the runtime saw,
// so nothing (a direct cudaMemcpy or sync in dt_embed.h, a launcher's own cudaMalloc) hides from
// the counters tests/cuda_counters.sh checks. The first difference, and how many.
static int g_count_steps, g_count_mismatches;
static char g_count_first[400];
static void compare_counts(int64_t step, const dt_cuda_counters &c0, const dt_cuda_counters &c,
                           const dt_emu_counters &e0, const dt_emu_counters &e) {
    long long mine[7] = {c.syncs - c0.syncs, c.allocs - c0.allocs, c.frees - c0.frees, c.h2d_bytes - c0.h2d_bytes,
                         c.h2d_calls - c0.h2d_calls, c.d2h_bytes - c0.d2h_bytes, c.d2h_calls - c0.d2h_calls};
    long long emu[7] = {e.syncs - e0.syncs, e.allocs - e0.allocs, e.frees - e0.frees, e.h2d_bytes - e0.h2d_bytes,
                        e.h2d_calls - e0.h2d_calls, e.d2h_bytes - e0.d2h_bytes, e.d2h_calls - e0.d2h_calls};
    static const char *const names[7] = {"syncs", "allocs", "frees", "h2d_bytes", "h2d_calls", "d2h_bytes", "d2h_calls"};
    g_count_steps++;
    for (int i = 0; i < 7; i++)
        if (mine[i] != emu[i] && g_count_mismatches++ == 0)
            snprintf(g_count_first, sizeof g_count_first, "step %lld: %s %lld in ctx->counters, %lld counted by the "
                     "emulator", (long long)step + 1, names[i], mine[i], emu[i]);
}

// The loop of dlrm.c's main, without accumulation, checkpoints or eval: per-step losses, and
// every table's shard copied to the host after the last step.
static void run(dt_device dev, const char *arch, const char *opt, const char *shard, int steps, double *losses,
                std::vector<std::vector<float>> *tables, const char *dtype = "f32") {
    dt_ctx ctx;
    dt_ctx_desc cd;
    dt_comm *world = NULL;
    opts o;
    data d;
    model m;
    acts a;
    kjt_buf kb = {0};
    dt_dlrm_batch batch;
    dt_optimizer *op = NULL;
    dt_opt_desc od;
    dt_bucketer *bk = NULL;
    dt_bucketer_desc bd;
    const char *argv[] = {"dlrm", "--arch", arch, "--opt", opt, "--shard", shard, "--dim", "4", "--rows", "16",
                          "--batch", "16", "--bottom", "8", "--top", "8", "--cross", "1", "--quiet", "--dtype", dtype};
    memset(&cd, 0, sizeof cd);
    cd.device = dev;
    CHECK(dt_ctx_init(&ctx, &cd));
    g_ctx = &ctx;
    parse(&o, (int)(sizeof argv / sizeof argv[0]), (char **)argv);
    o.steps = steps;
    CHECK(dt_comm_create_world(&ctx, &world, NULL));
    g_rank = 0;
    data_open(&d, &o, world);
    model_make(&m, &o, &d, world);
    memset(&a, 0, sizeof a);
    memset(&batch, 0, sizeof batch);
    memset(&od, 0, sizeof od);
    od.kind = !strcmp(o.opt, "sgd") ? DT_OPT_SGD : DT_OPT_ADAGRAD;
    od.lr = o.lr;
    od.comm = world;
    CHECK(dt_opt_create(&ctx, &op, &m.ps, &od));
    memset(&bd, 0, sizeof bd);
    bd.average = -1;
    CHECK(dt_bucketer_create(world, &bk, &m.ps, &bd));
    for (int64_t step = 0; step < o.steps; step++) {
        views v = {0};
        dt_tensor *logits, *dlogits;
        float l;
        dt_cuda_counters c0 = ctx.counters;
        dt_emu_counters e0, e1;
        dt_emu_get_counters(&e0);
        data_batch(&d, &batch, step, o.batch, 0, 1);
        logits = forward(&v, &m, &a, &batch, &kb, 0, NULL);
        CHECK(dt_bce_logits_fwd(&ctx, &l, logits, &batch.labels));
        losses[step] = l;
        dlogits = rows(&v, &a.top_dh[m.top.n - 1], batch.size);
        CHECK(dt_tensor_fill(&ctx, dlogits, 0.0));
        CHECK(dt_bce_logits_bwd(&ctx, dlogits, logits, &batch.labels, 1.0f));
        backward(&v, &m, &a, batch.size, bk);
        CHECK(dt_bucketer_finish(bk));
        CHECK(dt_opt_step(op, NULL));
        dt_params_zero_grad(&ctx, &m.ps);
        dt_emu_get_counters(&e1);
        if (dev == DT_CUDA_DEVICE) compare_counts(step, c0, ctx.counters, e0, e1);
    }
    for (int t = 0; t < F; t++) {
        dt_tensor view, h;
        int64_t r0, c0;
        CHECK(dt_embed_local_shard(m.emb, &view, &r0, &c0, t));
        CHECK(dt_tensor_create_like(&ctx, &h, &view, DT_DTYPE_DEFAULT, DT_CPU));
        CHECK(dt_tensor_copy(&ctx, &h, &view));
        tables->push_back(std::vector<float>((float *)h.data, (float *)h.data + h.numel));
        dt_tensor_free(&ctx, &h);
    }
    dt_bucketer_free(bk);
    dt_opt_free(op);
    dt_embed_free(m.emb);
    acts_free(&a);
    dt_dlrm_batch_free(&ctx, &batch);
    dt_release(&ctx, kb.lengths);
    dt_params_free(&ctx, &m.ps);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
}

static void check(const char *arch, const char *opt, const char *shard, int steps) {
    double lc[STEPS], lg[STEPS], worst = 0;
    std::vector<std::vector<float>> tc, tg;
    char name[160];
    int at = 0;
    run(DT_CPU, arch, opt, shard, steps, lc, &tc);
    run(DT_CUDA_DEVICE, arch, opt, shard, steps, lg, &tg);
    for (int i = 0; i < steps; i++) {
        double d = fabs(lg[i] - lc[i]) / fabs(lc[i]);
        if (!(d <= worst)) worst = d, at = i; /* NaN is the worst */
    }
    printf("dlrm %s/%s/%s on cuda vs cpu, %d steps: loss %.9g / %.9g at step 1, %.9g / %.9g at step %d; largest "
           "relative difference %.3g\n", arch, opt, shard, steps, lg[0], lc[0], lg[steps - 1], lc[steps - 1], steps, worst);
    snprintf(name, sizeof name, "dlrm_cuda_losses_equal_cpu_run_%s_%s_%s", arch, opt, shard);
    dt_test_check_all(name, worst <= LOSS_RTOL, "step %d of %d: loss %.9g on cuda, %.9g on cpu (rel diff %.3g > 7e-5)", at + 1,
                      steps, lg[at], lc[at], worst);
    snprintf(name, sizeof name, "dlrm_cuda_ctx_counters_equal_the_emulators_over_each_step_%s_%s_%s", arch, opt, shard);
    dt_test_check_all(name, g_count_steps == steps && g_count_mismatches == 0, "%d steps seen (%d expected), %d counts "
                      "differ; first: %s", g_count_steps, steps, g_count_mismatches, g_count_first);
    g_count_steps = g_count_mismatches = 0;
    snprintf(name, sizeof name, "dlrm_cuda_has_every_table_%s_%s_%s", arch, opt, shard);
    if (!DT_TEST_CHECK(name, tc.size() == (size_t)F && tg.size() == (size_t)F)) return;
    size_t bad = 0, first = 0;
    for (int t = 0; t < F; t++) {
        int ok = tc[t].size() == tg[t].size();
        for (size_t i = 0; ok && i < tc[t].size(); i++)
            if (!(fabs((double)tg[t][i] - tc[t][i]) <= 1e-7 + 1e-5 * fabs((double)tc[t][i]))) ok = 0;
        if (!ok && bad++ == 0) first = (size_t)t;
    }
    snprintf(name, sizeof name, "dlrm_cuda_table_rows_after_%d_steps_equal_cpu_run_%s_%s_%s", steps, arch, opt, shard);
    if (bad) dt_test_allclose(name, tg[first].data(), tc[first].data(), tc[first].size(), 1e-7, 1e-5);
    else dt_test_pass(name);
}

// --dtype bf16: the dense linears' weights in bf16 (f32 masters in dt_opt.h), dt_linear's bf16
// GEMMs on both devices (cuda: cublasGemmEx, here CBLAS over the widened values; cpu:
// dt_cpu_bf16_gemm). BF16_STEPS steps of DLRM with SGD: every step's loss on cuda within
// BF16_RTOL of the cpu run's (derived below), and the cpu bf16 run's losses close to the f32
// run's (within BF16_VS_F32_RTOL) but not equal (a bf16 run that trained in f32 would be equal).
// Both devices multiply the same bf16 operands exactly (8-bit significands: each product fits an
// f32) and sum in f32, so they part only where the f32 sums' orders do (LOSS_RTOL's 7e-5) and
// where an activation on the edge between two bf16 values rounds to the other one, a change of
// one bf16 step (2^-8 relative) in one input of one sum; BF16_RTOL allows a few such inputs
// on the way to a logit: 1e-3 (measured: 1.3e-5). Against f32: each linear's weight and input
// are rounded to bf16 (2^-9 relative each), so each of the 4 linears on the way to the logit
// (bottom 2, top 2 at --bottom 8 --top 8) moves its output by up to 2^-8 relative: the logit
// (|z| <= ~1) by up to 4 x 2^-8 = 1.6e-2, and the loss, whose slope in z is at most 1, by as
// much: 2.3e-2 of ln 2 at worst, so BF16_VS_F32_RTOL = 2e-2 (measured: 2.1e-4, the roundings
// being of both signs).
enum { BF16_STEPS = 10 };
static const double BF16_RTOL = 1e-3, BF16_VS_F32_RTOL = 2e-2;

static void check_bf16(void) {
    double lc[BF16_STEPS], lg[BF16_STEPS], lf[BF16_STEPS], worst = 0, worst_f = 0;
    std::vector<std::vector<float>> tc, tg, tf;
    int at = 0, at_f = 0, equal = 0;
    run(DT_CPU, "dlrm", "sgd", "table", BF16_STEPS, lc, &tc, "bf16");
    run(DT_CUDA_DEVICE, "dlrm", "sgd", "table", BF16_STEPS, lg, &tg, "bf16");
    run(DT_CPU, "dlrm", "sgd", "table", BF16_STEPS, lf, &tf, "f32");
    for (int i = 0; i < BF16_STEPS; i++) {
        double d = fabs(lg[i] - lc[i]) / fabs(lc[i]), df = fabs(lf[i] - lc[i]) / fabs(lf[i]);
        if (!(d <= worst)) worst = d, at = i; /* NaN is the worst */
        if (!(df <= worst_f)) worst_f = df, at_f = i;
        equal += lf[i] == lc[i];
    }
    printf("dlrm --dtype bf16 on cuda vs cpu, %d steps: loss %.9g / %.9g at step 1, %.9g / %.9g at step %d; largest "
           "relative difference %.3g (step %d); cpu bf16 vs f32: largest %.3g (step %d), %d steps equal\n", BF16_STEPS,
           lg[0], lc[0], lg[BF16_STEPS - 1], lc[BF16_STEPS - 1], BF16_STEPS, worst, at + 1, worst_f, at_f + 1, equal);
    dt_test_check_all("dlrm_bf16_cuda_losses_within_1e-3_of_cpu_bf16_run", worst <= BF16_RTOL,
                      "step %d of %d: loss %.9g on cuda, %.9g on cpu (rel diff %.3g > %.3g)", at + 1, BF16_STEPS, lg[at],
                      lc[at], worst, BF16_RTOL);
    dt_test_check_all("dlrm_bf16_cuda_ctx_counters_equal_the_emulators_over_each_step",
                      g_count_steps == BF16_STEPS && g_count_mismatches == 0,
                      "%d steps seen (%d expected), %d counts differ; first: %s", g_count_steps, BF16_STEPS,
                      g_count_mismatches, g_count_first);
    g_count_steps = g_count_mismatches = 0;
    dt_test_check_all("dlrm_bf16_cpu_losses_close_to_f32_run", worst_f <= BF16_VS_F32_RTOL,
                      "step %d of %d: loss %.9g in bf16, %.9g in f32 (rel diff %.3g > %.3g)", at_f + 1, BF16_STEPS,
                      lc[at_f], lf[at_f], worst_f, BF16_VS_F32_RTOL);
    dt_test_check_all("dlrm_bf16_cpu_losses_differ_from_f32_run", equal == 0,
                      "%d of %d steps have the f32 run's loss bit for bit (step 1: %.9g / %.9g): bf16 weights unused?",
                      equal, BF16_STEPS, lc[0], lf[0]);
}

// The ops dlrm needs that gained a cuda dispatch (dt_tensor.h): add, mul fwd/bwd, concat / split,
// dot interaction fwd/bwd, bce with logits fwd/bwd, each on cuda tensors against the cpu op on
// the same inputs (bitwise: the kernels do the cpu's operations; but the bce loss, whose double
// element losses the device sums in another order: within 2 u |loss| after the cast to float,
// u = 2^-24, and the dot interaction, whose batched GEMMs sum in cuBLAS's order: see below),
// and the bad inputs (a cpu operand among cuda ones, concat widths that do not add
// up). A cuda ctx: the device loss lives in its status block.
static dt_tensor mk(dt_ctx *ctx, dt_device dev, int64_t d0, int64_t d1, int64_t d2, const std::vector<float> &v) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32; d.device = dev; d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2;
    d.ndim = d2 ? 3 : d1 ? 2 : 1;
    CHECK(dt_tensor_create(ctx, &t, &d));
    if (dev == DT_CUDA_DEVICE) cudaMemcpy(t.data, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    else memcpy(t.data, v.data(), v.size() * 4);
    return t;
}
static std::vector<float> hv(const dt_tensor &t) {
    std::vector<float> v((size_t)t.numel);
    if (t.device == DT_CUDA_DEVICE) cudaMemcpy(v.data(), t.data, v.size() * 4, cudaMemcpyDeviceToHost);
    else memcpy(v.data(), t.data, v.size() * 4);
    return v;
}
static std::vector<float> rnd(size_t n) {
    static uint64_t s = 88172645463325252ull;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; v[i] = (float)((s >> 40) * (1.0 / 16777216.0)) * 4 - 2; }
    return v;
}

static void check_ops(void) {
    dt_ctx ctx;
    dt_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    CHECK(dt_ctx_init(&ctx, &cd));
    g_ctx = &ctx;
    const int64_t B = 3, Fv = 2, D = 4, W = D + (Fv + 1) * Fv / 2;
    std::vector<float> a = rnd(B * D), b = rnd(B * D), g = rnd(B * D), e = rnd(B * Fv * D), go = rnd(B * W);
    std::vector<float> y = {1, 0, 1}, z = {0.5f, -3.0f, 20.0f};
    dt_device devs[2] = {DT_CPU, DT_CUDA_DEVICE};
    std::vector<float> r[2][12];
    float loss[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        dt_device dv = devs[k];
        dt_tensor ta = mk(&ctx, dv, B, D, 0, a), tb = mk(&ctx, dv, B, D, 0, b), tg = mk(&ctx, dv, B, D, 0, g);
        dt_tensor o = mk(&ctx, dv, B, D, 0, a), da = mk(&ctx, dv, B, D, 0, g), db = mk(&ctx, dv, B, D, 0, b);
        dt_tensor te = mk(&ctx, dv, B, Fv, D, e), cat = mk(&ctx, dv, B, D + Fv * D, 0, rnd(B * (D + Fv * D)));
        dt_tensor e2 = mk(&ctx, dv, B, Fv * D, 0, e), s1 = mk(&ctx, dv, B, D, 0, g), s2 = mk(&ctx, dv, B, Fv * D, 0, e);
        dt_tensor out = mk(&ctx, dv, B, W, 0, go), gout = mk(&ctx, dv, B, W, 0, go), dd = mk(&ctx, dv, B, D, 0, a);
        dt_tensor de = mk(&ctx, dv, B, Fv, D, e), lz = mk(&ctx, dv, B, 1, 0, z), ly = mk(&ctx, DT_CPU, B, 1, 0, y);
        dt_tensor dl = mk(&ctx, dv, B, 1, 0, z);
        const dt_tensor *parts[2] = {&ta, &e2};
        dt_tensor *outs[2] = {&s1, &s2};
        CHECK(dt_add(&ctx, &o, &ta, &tb)); r[k][0] = hv(o);
        CHECK(dt_mul_fwd(&ctx, &o, &ta, &tb)); r[k][1] = hv(o);
        CHECK(dt_mul_bwd(&ctx, &da, &db, &tg, &ta, &tb)); r[k][2] = hv(da); r[k][3] = hv(db);
        CHECK(dt_concat_fwd(&ctx, &cat, parts, 2)); r[k][4] = hv(cat);
        CHECK(dt_split_fwd(&ctx, outs, 2, &cat)); r[k][5] = hv(s1); r[k][6] = hv(s2);
        CHECK(dt_dot_interaction_fwd(&ctx, &out, &ta, &te)); r[k][7] = hv(out);
        CHECK(dt_dot_interaction_bwd(&ctx, &dd, &de, &gout, &ta, &te)); r[k][8] = hv(dd); r[k][9] = hv(de);
        CHECK(dt_bce_logits_fwd(&ctx, &loss[k], &lz, &ly));
        CHECK(dt_bce_logits_bwd(&ctx, &dl, &lz, &ly, 0.75f)); r[k][10] = hv(dl);
        {   /* the accumulating form: each part += its columns of the whole */
            dt_tensor *douts[2] = {&s1, &s2};
            CHECK(dt_concat_bwd(&ctx, douts, 2, &cat));
            r[k][11] = hv(s1);
            std::vector<float> v2 = hv(s2);
            r[k][11].insert(r[k][11].end(), v2.begin(), v2.end());
        }
        if (dv == DT_CUDA_DEVICE) {
            dt_tensor hc = mk(&ctx, DT_CPU, B, D, 0, a);
            dt_test_error("cuda_mul_fwd_with_a_cpu_operand_is_device_error", dt_mul_fwd(&ctx, &o, &ta, &hc),
                          dt_ctx_error(&ctx), "b is on cpu");
            dt_test_error("cuda_concat_widths_not_summing_is_shape_error", dt_concat_fwd(&ctx, &out, parts, 2),
                          dt_ctx_error(&ctx), "last dims sum to");
            /* the dot interaction's checks before its GEMMs: a wrong width, a gradient of another shape */
            dt_test_error("cuda_dot_interaction_fwd_out_width_is_shape_error", dt_dot_interaction_fwd(&ctx, &tb, &ta, &te),
                          dt_ctx_error(&ctx), "out.shape[1]");
            dt_test_error("cuda_dot_interaction_bwd_demb_shape_is_named",
                          dt_dot_interaction_bwd(&ctx, &dd, &cat, &gout, &ta, &te), dt_ctx_error(&ctx), "demb");
            dt_tensor_free(&ctx, &hc);
        }
        dt_tensor *all[] = {&ta, &tb, &tg, &o, &da, &db, &te, &cat, &e2, &s1, &s2, &out, &gout, &dd, &de, &lz, &ly, &dl};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_free(&ctx, all[i]);
    }
    const char *names[12] = {"add", "mul_fwd", "mul_bwd_da", "mul_bwd_db", "concat_fwd", "split_fwd_0", "split_fwd_1",
                             "dot_interaction_fwd", "dot_interaction_bwd_ddense", "dot_interaction_bwd_demb",
                             "bce_logits_bwd", "concat_bwd"};
    /* The dot interaction's batched GEMMs sum in cuBLAS's order: a sum of n terms in two orders
       differs by at most 2 n u sum |terms| (u = 2^-24); here n <= 5 (D + 1 per pair, Fv + 3 per
       gradient) and sum |terms| <= 20 (|values| <= 2: four products of at most 4, plus the
       accumulated value and the pass-through), so 2 * 5 * 20 u = 1.2e-5. */
    for (int i = 0; i < 12; i++) {
        char name[96];
        int dot = i >= 7 && i <= 9;
        snprintf(name, sizeof name, dot ? "cuda_%s_within_1.2e-5_of_cpu" : "cuda_%s_equals_cpu_bitwise", names[i]);
        if (r[0][i].size() != r[1][i].size()) dt_test_fail(name, "sizes %zu / %zu", r[1][i].size(), r[0][i].size());
        else if (dot) dt_test_allclose(name, r[1][i].data(), r[0][i].data(), r[0][i].size(), 1.2e-5, 0.0);
        else dt_test_equal_bytes(name, r[1][i].data(), r[0][i].data(), r[0][i].size() * 4);
    }
    dt_test_close("cuda_bce_logits_fwd_within_2u_of_cpu", loss[1], loss[0], 2.0 / 16777216.0 * fabs(loss[0]));
    dt_ctx_shutdown(&ctx);
}

int main(int argc, char **argv) {
    int tsan = argc > 1 && !strcmp(argv[1], "tsan");
    /* the one-thread-at-a-time modes (forward, reverse, random) cost several times the parallel
       one on a loaded machine: there, DLRM alone for 3 steps (the kernels are the same) */
    const char *mode = getenv("DT_EMU_MODE");
    int full = !tsan && (!mode || !strcmp(mode, "parallel"));
    check_ops();
    if (tsan) return dt_test_finish(); /* a training step is ~100 launches of 26 tables: minutes under TSan */
    check("dlrm", "sgd", "table", full ? STEPS : 3);
    if (full) check("dcn", "adagrad", "data", STEPS);
    if (full) check_bf16();
    return dt_test_finish();
}
