// emu-modes: parallel (end to end through kernels whose own k_*.cpp runs every thread order)
// emu-tsan: skip (the kernels it runs have their own TSan runs in k_*.cpp)
// tests/cuda_emu/k_embed_tables.cpp - dt_embed.h with its tables on CUDA (desc.device cuda) on the
// emulator, against the same dt_embed on the CPU in the same program: for each sharding (table,
// row, column, data-parallel; one rank: dt_comm without MPI) and each sparse optimizer (SGD,
// Adagrad, row-wise Adagrad, Adam), features with sum, mean (weighted) and no pooling (a
// sequence feature), 3 forward + backward steps: the pooled outputs, the sequence rows and the
// updated shards must equal the CPU's bit for bit (row-wise Adagrad: 1e-6 relative, its sum of
// squares is a tree on the device). Then a checkpoint of CUDA tables loads into CPU tables
// equal, and the bad inputs (cpu out, export, out and dout over a table's rows: resident and
// tier HOST) give their statuses. A dynamic table (kernels/dt_hash.cu's GPU id tables) under
// capacity pressure, admit_after 1 and 3: outputs, rows and admitted / evicted / rejected counts
// equal the CPU's each step; checkpoints CUDA <-> CPU.
// With the argument "tsan" (the ThreadSanitizer run): two configurations, 2 steps.
#include <math.h>
#include <cuda_runtime.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "tests/dt_test.h"

enum { B = 4, NF = 4 };
// 1: table "c" pools (sum) instead of giving a sequence, so every feature is pooled and the CUDA
// tables take the device path (nothing read back); 0: the sequence feature's host path.
static int g_dev_path = 0;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static float next_f(void) { return (float)((next_u() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

struct batch {
    std::vector<int64_t> lengths, ids;
    std::vector<float> weights;
};
// Bags of 0-3 ids (feature 2, the sequence feature, at least 1), rows of each feature's table.
static batch make_batch(const int64_t *rows) {
    batch k;
    for (int f = 0; f < NF; f++)
        for (int b = 0; b < B; b++) {
            int64_t n = (int64_t)(next_u() % 4);
            if (f == 2 && n == 0) n = 1;
            k.lengths.push_back(n);
            for (int64_t j = 0; j < n; j++) {
                k.ids.push_back((int64_t)(next_u() % (uint64_t)rows[f]));
                k.weights.push_back(next_f());
            }
        }
    return k;
}

static std::vector<float> host_copy(dt_ctx *ctx, const dt_tensor *t) {
    dt_tensor h;
    std::vector<float> v;
    if (t->device != DT_CUDA_DEVICE) {
        dt_tensor f;
        if (dt_tensor_create_like(ctx, &f, t, DT_F32, DT_CPU) || dt_tensor_cast(ctx, &f, t)) return v;
        v.assign((float *)f.data, (float *)f.data + f.numel);
        dt_tensor_free(ctx, &f);
        return v;
    }
    if (dt_tensor_create_like(ctx, &h, t, DT_DTYPE_DEFAULT, DT_CPU)) return v;
    if (!dt_tensor_copy(ctx, &h, t)) {
        dt_tensor f;
        if (!dt_tensor_create_like(ctx, &f, &h, DT_F32, DT_CPU) && !dt_tensor_cast(ctx, &f, &h)) {
            v.assign((float *)f.data, (float *)f.data + f.numel);
            dt_tensor_free(ctx, &f);
        }
    }
    dt_tensor_free(ctx, &h);
    return v;
}

static const char *shard_name(dt_embed_sharding s) {
    return s == DT_SHARD_TABLE ? "table" : s == DT_SHARD_ROW ? "row" : s == DT_SHARD_COLUMN ? "column" : "data";
}
static const char *opt_name(dt_embed_optim o) {
    return o == DT_EMBED_SGD ? "sgd" : o == DT_EMBED_ADAGRAD ? "adagrad" : o == DT_EMBED_ROWWISE_ADAGRAD ? "rowwise_adagrad" : "adam";
}

struct setup {
    dt_embed_table_desc tabs[3];
    dt_embed_feature_desc feats[NF];
    dt_embed_desc desc;
};
// Tables: "a" [20, 4] sum (features 0 and 3), "b" [12, 8] mean and weighted (feature 1, in the
// storage dtype given), "c" [10, 4] no pooling (feature 2).
static void make_setup(setup *s, dt_embed_sharding sh, dt_embed_optim opt, dt_dtype b_dtype, dt_device dev) {
    memset(s, 0, sizeof *s);
    const char *names[3] = {"a", "b", "c"};
    int64_t rows[3] = {20, 12, 10};
    int dims[3] = {4, 8, 4};
    for (int i = 0; i < 3; i++) {
        s->tabs[i].name = names[i];
        s->tabs[i].rows = rows[i];
        s->tabs[i].dim = dims[i];
        s->tabs[i].sharding = sh;
        s->tabs[i].optim.kind = opt;
        s->tabs[i].optim.lr = 0.05;
    }
    s->tabs[1].pooling = DT_POOL_MEAN;
    s->tabs[1].weighted = 1;
    s->tabs[1].dtype = b_dtype;
    s->tabs[2].pooling = g_dev_path ? DT_POOL_SUM : DT_POOL_NONE;
    int ft[NF] = {0, 1, 2, 0};
    for (int f = 0; f < NF; f++) s->feats[f].name = names[ft[f]], s->feats[f].table = ft[f];
    s->desc.tables = s->tabs;
    s->desc.n_tables = 3;
    s->desc.features = s->feats;
    s->desc.n_features = NF;
    s->desc.seed = 11;
    s->desc.device = dev;
}

// A forward (outputs and sequence rows to the host) and a backward with dout / seq grads given.
static int step(dt_ctx *ctx, dt_embed *e, const batch &k, const std::vector<float> &dout, const std::vector<float> &sg,
                std::vector<float> *out, std::vector<float> *seq) {
    dt_kjt kjt;
    dt_tensor o, d, sv, gv;
    dt_tensor_desc td;
    int cuda = 0;
    memset(&kjt, 0, sizeof kjt);
    kjt.n_features = NF; kjt.batch = B;
    kjt.lengths = k.lengths.data(); kjt.ids = k.ids.data(); kjt.weights = k.weights.data();
    memset(&td, 0, sizeof td);
    td.dtype = DT_F32; td.ndim = 2; td.shape[0] = B; td.shape[1] = dt_embed_pooled_dim(e);
    {
        dt_tensor v;
        int64_t r0, c0;
        dt_embed_local_shard(e, &v, &r0, &c0, 0);
        cuda = v.device == DT_CUDA_DEVICE;
    }
    td.device = cuda ? DT_CUDA_DEVICE : DT_CPU;
    if (dt_tensor_create(ctx, &o, &td) || dt_tensor_create(ctx, &d, &td)) return 1;
    if (dt_embed_forward(e, &o, &kjt)) { fprintf(stderr, "forward: %s\n", dt_ctx_error(ctx)); return 1; }
    *out = host_copy(ctx, &o);
    if (!g_dev_path) {
        if (dt_embed_sequence(e, &sv, 2) || dt_embed_sequence_grad(e, &gv, 2)) return 1;
        seq->assign((float *)sv.data, (float *)sv.data + sv.numel);
        if ((size_t)gv.numel > sg.size()) return 1;
        memcpy(gv.data, sg.data(), (size_t)gv.numel * sizeof(float));
    }
    if (cuda) cudaMemcpy(d.data, dout.data(), dout.size() * sizeof(float), cudaMemcpyHostToDevice);
    else memcpy(d.data, dout.data(), dout.size() * sizeof(float));
    if (dt_embed_backward(e, &d)) { fprintf(stderr, "backward: %s\n", dt_ctx_error(ctx)); return 1; }
    dt_tensor_free(ctx, &o);
    dt_tensor_free(ctx, &d);
    return 0;
}

static void check_config(dt_ctx *ctx, dt_embed_sharding sh, dt_embed_optim opt, dt_dtype b_dtype, int steps) {
    setup sc, sg;
    dt_embed *ec = NULL, *eg = NULL;
    char tag[96], name[192];
    int64_t rows[NF] = {20, 12, 10, 20};
    double rtol = opt == DT_EMBED_ROWWISE_ADAGRAD ? 1e-6 : 0;
    snprintf(tag, sizeof tag, "%s_%s%s%s", shard_name(sh), opt_name(opt), b_dtype == DT_BF16 ? "_bf16" : "",
             g_dev_path ? "_device_path" : "");
    make_setup(&sc, sh, opt, b_dtype, DT_CPU);
    make_setup(&sg, sh, opt, b_dtype, DT_CUDA_DEVICE);
    snprintf(name, sizeof name, "embed_cuda_create_%s", tag);
    if (!DT_TEST_CHECK(name, !dt_embed_create(ctx, &ec, &sc.desc) && !dt_embed_create(ctx, &eg, &sg.desc))) {
        fprintf(stderr, "  %s\n", dt_ctx_error(ctx));
        dt_embed_free(ec); dt_embed_free(eg);
        return;
    }
    int out_ok = 1, seq_ok = 1, at = -1;
    for (int s = 0; s < steps; s++) {
        batch k = make_batch(rows);
        std::vector<float> dout(B * dt_embed_pooled_dim(ec)), sgr(64), oc, og, qc, qg;
        for (size_t i = 0; i < dout.size(); i++) dout[i] = next_f();
        for (size_t i = 0; i < sgr.size(); i++) sgr[i] = next_f();
        if (step(ctx, ec, k, dout, sgr, &oc, &qc) || step(ctx, eg, k, dout, sgr, &og, &qg)) {
            snprintf(name, sizeof name, "embed_cuda_steps_run_%s", tag);
            dt_test_fail(name, "step %d failed: %s", s + 1, dt_ctx_error(ctx));
            out_ok = 0;
            break;
        }
        if (oc.size() != og.size() || memcmp(oc.data(), og.data(), oc.size() * 4)) out_ok = 0, at = at < 0 ? s : at;
        if (qc.size() != qg.size() || memcmp(qc.data(), qg.data(), qc.size() * 4)) seq_ok = 0, at = at < 0 ? s : at;
        if (!out_ok || !seq_ok) {
            snprintf(name, sizeof name, "embed_cuda_forward_equals_cpu_bitwise_%s", tag);
            if (oc.size() == og.size()) dt_test_allclose(name, og.data(), oc.data(), oc.size(), 0, 0);
            snprintf(name, sizeof name, "embed_cuda_sequence_rows_equal_cpu_bitwise_%s", tag);
            if (qc.size() == qg.size()) dt_test_allclose(name, qg.data(), qc.data(), qc.size(), 0, 0);
            break;
        }
    }
    if (out_ok && seq_ok) {
        snprintf(name, sizeof name, "embed_cuda_forward_and_sequence_equal_cpu_bitwise_%s_%d_steps", tag, steps);
        dt_test_pass(name);
    }
    for (int t = 0; t < 3; t++) {
        dt_tensor vc, vg;
        int64_t r0, c0;
        dt_embed_local_shard(ec, &vc, &r0, &c0, t);
        dt_embed_local_shard(eg, &vg, &r0, &c0, t);
        std::vector<float> hc = host_copy(ctx, &vc), hg = host_copy(ctx, &vg);
        snprintf(name, sizeof name, "embed_cuda_table_%c_is_on_cuda_%s", 'a' + t, tag);
        int ok = DT_TEST_CHECK(name, hc.size() == hg.size() && !hc.empty() && vg.device == DT_CUDA_DEVICE);
        snprintf(name, sizeof name, "embed_cuda_table_%c_rows_after_%d_updates_equal_cpu_%s_%s", 'a' + t, steps,
                 rtol > 0 ? "1e-6" : "bitwise", tag);
        if (ok)
            dt_test_allclose(name, hg.data(), hc.data(), hc.size(), 0, rtol);
    }
    if (sh == DT_SHARD_DATA) { /* the unique rows updated, counted on the device (the sharded device path's
                                   count, made on the host from the requests, differs from the CPU's: open) */
        dt_embed_stats a, g;
        dt_embed_stats_get(ec, &a);
        dt_embed_stats_get(eg, &g);
        snprintf(name, sizeof name, "embed_cuda_stats_rows_updated_equal_cpu_%s", tag);
        dt_test_check_all(name, a.rows_updated == g.rows_updated && a.rows_updated > 0,
                          "rows updated cuda %lld, cpu %lld", (long long)g.rows_updated, (long long)a.rows_updated);
    }
    dt_embed_free(ec);
    dt_embed_free(eg);
}

// Save CUDA tables (after 2 steps), load into fresh CPU tables: the shards equal.
static void check_checkpoint(dt_ctx *ctx) {
    setup sc, sg;
    dt_embed *ec = NULL, *eg = NULL;
    int64_t rows[NF] = {20, 12, 10, 20};
    char dir[512];
    dt_checkpoint_desc cd;
    snprintf(dir, sizeof dir, "%s/embed_cuda_ckpt", dt_test_tmpdir());
    make_setup(&sg, DT_SHARD_ROW, DT_EMBED_ADAGRAD, DT_F32, DT_CUDA_DEVICE);
    make_setup(&sc, DT_SHARD_ROW, DT_EMBED_ADAGRAD, DT_F32, DT_CPU);
    sc.desc.seed = 99; /* different values before the load */
    if (!DT_TEST_CHECK("embed_cuda_checkpoint_create", !dt_embed_create(ctx, &eg, &sg.desc) &&
                                                           !dt_embed_create(ctx, &ec, &sc.desc))) {
        dt_embed_free(ec); dt_embed_free(eg);
        return;
    }
    for (int s = 0; s < 2; s++) {
        batch k = make_batch(rows);
        std::vector<float> dout(B * dt_embed_pooled_dim(eg)), sgr(64, 0.5f), o, q;
        for (size_t i = 0; i < dout.size(); i++) dout[i] = next_f();
        if (step(ctx, eg, k, dout, sgr, &o, &q)) break;
    }
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    int st = dt_embed_checkpoint_save(eg, NULL, &cd);
    if (!DT_TEST_CHECK("embed_cuda_checkpoint_save_ok", st == 0)) fprintf(stderr, "  %s\n", dt_ctx_error(ctx));
    st = dt_embed_checkpoint_load(ec, NULL, &cd);
    if (!DT_TEST_CHECK("embed_cuda_checkpoint_loads_into_cpu_tables", st == 0)) fprintf(stderr, "  %s\n", dt_ctx_error(ctx));
    for (int t = 0; t < 3; t++) {
        dt_tensor vc, vg;
        int64_t r0, c0;
        char name[128];
        dt_embed_local_shard(ec, &vc, &r0, &c0, t);
        dt_embed_local_shard(eg, &vg, &r0, &c0, t);
        std::vector<float> hc = host_copy(ctx, &vc), hg = host_copy(ctx, &vg);
        snprintf(name, sizeof name, "embed_cuda_checkpoint_table_%c_sizes", 'a' + t);
        int ok = DT_TEST_CHECK(name, hc.size() == hg.size() && !hc.empty());
        snprintf(name, sizeof name, "embed_cuda_checkpoint_table_%c_saved_on_cuda_loads_on_cpu_equal", 'a' + t);
        if (ok)
            dt_test_equal_bytes(name, hc.data(), hg.data(), hc.size() * 4);
    }
    dt_embed_free(ec);
    dt_embed_free(eg);
}

// Both tables' shards, outputs and sequence rows compared; returns 1 when all equal bitwise.
static int same_tables(dt_ctx *ctx, dt_embed *ec, dt_embed *eg, const char *tag) {
    int all = 1;
    for (int t = 0; t < 3; t++) {
        dt_tensor vc, vg;
        int64_t r0, c0;
        char name[192];
        dt_embed_local_shard(ec, &vc, &r0, &c0, t);
        dt_embed_local_shard(eg, &vg, &r0, &c0, t);
        std::vector<float> hc = host_copy(ctx, &vc), hg = host_copy(ctx, &vg);
        snprintf(name, sizeof name, "%s_table_%c_sizes", tag, 'a' + t);
        if (!DT_TEST_CHECK(name, hc.size() == hg.size() && !hc.empty())) { all = 0; continue; }
        snprintf(name, sizeof name, "%s_table_%c_rows_equal_cpu_bitwise", tag, 'a' + t);
        if (memcmp(hc.data(), hg.data(), hc.size() * 4)) all = 0;
        dt_test_allclose(name, hg.data(), hc.data(), hc.size(), 0, 0);
    }
    return all;
}

// n steps on both (same batches); outputs, sequence rows and the dynamic counts compared each step.
// pressure 1: the run must have evicted (admit_after 1) or rejected ids (admit_after > 1).
static void run_both(dt_ctx *ctx, dt_embed *ec, dt_embed *eg, const int64_t *rows, int steps, const char *tag,
                     int pressure) {
    char name[192];
    int ok = 1;
    for (int s = 0; s < steps && ok; s++) {
        batch k = make_batch(rows);
        std::vector<float> dout(B * dt_embed_pooled_dim(ec)), sgr(64), oc, og, qc, qg;
        for (size_t i = 0; i < dout.size(); i++) dout[i] = next_f();
        for (size_t i = 0; i < sgr.size(); i++) sgr[i] = next_f();
        if (step(ctx, ec, k, dout, sgr, &oc, &qc) || step(ctx, eg, k, dout, sgr, &og, &qg)) {
            snprintf(name, sizeof name, "%s_steps_run", tag);
            dt_test_fail(name, "step %d failed: %s", s + 1, dt_ctx_error(ctx));
            return;
        }
        dt_embed_stats sc, sg;
        dt_embed_stats_get(ec, &sc);
        dt_embed_stats_get(eg, &sg);
        if (oc.size() != og.size() || memcmp(oc.data(), og.data(), oc.size() * 4) || qc.size() != qg.size() ||
            memcmp(qc.data(), qg.data(), qc.size() * 4)) {
            ok = 0;
            snprintf(name, sizeof name, "%s_forward_equals_cpu_bitwise_step_%d", tag, s + 1);
            if (oc.size() == og.size()) dt_test_allclose(name, og.data(), oc.data(), oc.size(), 0, 0);
            else dt_test_fail(name, "sizes %zu (cuda) vs %zu (cpu)", og.size(), oc.size());
        }
        if (sc.step_admitted != sg.step_admitted || sc.step_evicted != sg.step_evicted ||
            sc.step_rejected != sg.step_rejected || sc.admitted != sg.admitted || sc.evicted != sg.evicted ||
            sc.rejected != sg.rejected || sc.rows_updated != sg.rows_updated) {
            ok = 0;
            snprintf(name, sizeof name, "%s_stats_equal_cpu_step_%d", tag, s + 1);
            dt_test_fail(name, "admitted/evicted/rejected cuda %lld/%lld/%lld (step %lld/%lld/%lld), cpu %lld/%lld/%lld "
                         "(step %lld/%lld/%lld); rows updated cuda %lld, cpu %lld", (long long)sg.admitted,
                         (long long)sg.evicted, (long long)sg.rejected, (long long)sg.step_admitted,
                         (long long)sg.step_evicted, (long long)sg.step_rejected, (long long)sc.admitted,
                         (long long)sc.evicted, (long long)sc.rejected, (long long)sc.step_admitted,
                         (long long)sc.step_evicted, (long long)sc.step_rejected, (long long)sg.rows_updated,
                         (long long)sc.rows_updated);
        }
    }
    if (ok) {
        dt_embed_stats sc;
        dt_embed_stats_get(ec, &sc);
        snprintf(name, sizeof name, "%s_forward_and_stats_equal_cpu_%d_steps", tag, steps);
        /* capacity pressure for real: ids were evicted (admit_after 1) or rejected (admit_after 3) */
        if (DT_TEST_CHECK(name, !pressure || (sc.admitted > 0 && (sc.evicted > 0 || sc.rejected > 0)))) {}
        else fprintf(stderr, "  admitted %lld evicted %lld rejected %lld\n", (long long)sc.admitted,
                     (long long)sc.evicted, (long long)sc.rejected);
    }
    same_tables(ctx, ec, eg, tag);
}

// A dynamic table "a" (20 slots in 4 id-hash shards, ids 0..59: capacity pressure) with Adam
// (zeroed state on admission matters), ids 0..59 (admit_after 1) or 0..29 (3): CUDA vs CPU outputs, rows, stats
// after each step; then checkpoints both ways: CUDA saved -> CPU loaded, CPU saved -> CUDA
// loaded, each pair running 2 more steps equal (the loaded id maps and LRU order are live).
static void check_dynamic(dt_ctx *ctx, int admit_after, int steps) {
    setup sc, sg;
    dt_embed *ec = NULL, *eg = NULL, *ec2 = NULL, *eg2 = NULL;
    int64_t rows[NF] = {admit_after == 1 ? 60 : 30, 12, 10, admit_after == 1 ? 60 : 30};
    char tag[96], dir[512], dir2[512];
    dt_checkpoint_desc cd;
    snprintf(tag, sizeof tag, "embed_cuda_dynamic_admit_after_%d%s", admit_after, g_dev_path ? "_device_path" : "");
    make_setup(&sc, DT_SHARD_ROW, DT_EMBED_ADAM, DT_F32, DT_CPU);
    make_setup(&sg, DT_SHARD_ROW, DT_EMBED_ADAM, DT_F32, DT_CUDA_DEVICE);
    sc.tabs[0].dynamic = sg.tabs[0].dynamic = 1;
    sc.tabs[0].hash_shards = sg.tabs[0].hash_shards = 4;
    sc.tabs[0].admit_after = sg.tabs[0].admit_after = admit_after;
    if (!DT_TEST_CHECK(tag, !dt_embed_create(ctx, &ec, &sc.desc) && !dt_embed_create(ctx, &eg, &sg.desc))) {
        fprintf(stderr, "  %s\n", dt_ctx_error(ctx));
        dt_embed_free(ec); dt_embed_free(eg);
        return;
    }
    run_both(ctx, ec, eg, rows, steps, tag, 1);
    /* checkpoints: eg (cuda) -> ec2 (cpu), ec (cpu) -> eg2 (cuda); the same seed (rows admitted
       after the load are initialised from it); the id maps are empty before the load */
    snprintf(dir, sizeof dir, "%s/embed_cuda_dyn_ckpt_g%d", dt_test_tmpdir(), admit_after);
    snprintf(dir2, sizeof dir2, "%s/embed_cuda_dyn_ckpt_c%d", dt_test_tmpdir(), admit_after);
    memset(&cd, 0, sizeof cd);
    char name[192];
    snprintf(name, sizeof name, "%s_checkpoint_round_trip_ok", tag);
    int st = dt_embed_create(ctx, &ec2, &sc.desc) || dt_embed_create(ctx, &eg2, &sg.desc);
    cd.dir = dir;
    if (!st) st = dt_embed_checkpoint_save(eg, NULL, &cd) || dt_embed_checkpoint_load(ec2, NULL, &cd);
    cd.dir = dir2;
    if (!st) st = dt_embed_checkpoint_save(ec, NULL, &cd) || dt_embed_checkpoint_load(eg2, NULL, &cd);
    if (DT_TEST_CHECK(name, st == 0)) {
        char t2[160];
        snprintf(t2, sizeof t2, "%s_saved_on_cuda_loaded_on_cpu", tag);
        same_tables(ctx, ec2, eg, t2);
        snprintf(t2, sizeof t2, "%s_saved_on_cpu_loaded_on_cuda", tag);
        same_tables(ctx, ec, eg2, t2);
        /* the loaded ones go on like the originals: ec2 (cpu) vs eg2 (cuda) loaded from equal states */
        snprintf(t2, sizeof t2, "%s_after_load", tag);
        uint64_t r = rng;
        run_both(ctx, ec2, eg2, rows, 2, t2, 0);
        rng = r; /* and the originals with the same batches */
        snprintf(t2, sizeof t2, "%s_originals_after_save", tag);
        run_both(ctx, ec, eg, rows, 2, t2, 0);
        /* the sightings of ids not admitted are not saved: only with admit_after 1 does a loaded
           table go on exactly like the original */
        snprintf(t2, sizeof t2, "%s_loaded_goes_on_like_the_original", tag);
        if (admit_after == 1) same_tables(ctx, ec, eg2, t2);
    } else {
        fprintf(stderr, "  %s\n", dt_ctx_error(ctx));
    }
    dt_embed_free(ec); dt_embed_free(eg); dt_embed_free(ec2); dt_embed_free(eg2);
}

static void check_bad_inputs(dt_ctx *ctx) {
    setup s;
    dt_embed *e = NULL;
    int64_t rows[NF] = {20, 12, 10, 20};
    make_setup(&s, DT_SHARD_TABLE, DT_EMBED_SGD, DT_F32, DT_CUDA_DEVICE);
    make_setup(&s, DT_SHARD_TABLE, DT_EMBED_SGD, DT_F32, (dt_device)7);
    dt_test_error("embed_device_7_is_arg_error", dt_embed_create(ctx, &e, &s.desc), dt_ctx_error(ctx), "desc.device = 7");
    make_setup(&s, DT_SHARD_TABLE, DT_EMBED_SGD, DT_F32, DT_CUDA_DEVICE);
    if (!DT_TEST_CHECK("embed_cuda_bad_inputs_create", !dt_embed_create(ctx, &e, &s.desc))) return;
    {
        batch k = make_batch(rows);
        dt_kjt kjt;
        dt_tensor o;
        dt_tensor_desc td;
        memset(&kjt, 0, sizeof kjt);
        kjt.n_features = NF; kjt.batch = B;
        kjt.lengths = k.lengths.data(); kjt.ids = k.ids.data(); kjt.weights = k.weights.data();
        memset(&td, 0, sizeof td);
        td.dtype = DT_F32; td.ndim = 2; td.shape[0] = B; td.shape[1] = dt_embed_pooled_dim(e); td.device = DT_CPU;
        dt_tensor_create(ctx, &o, &td);
        int st = dt_embed_forward(e, &o, &kjt);
        dt_test_error("embed_cuda_forward_into_a_cpu_out_is_device_error", st, dt_ctx_error(ctx), "out is on cpu");
        DT_TEST_CHECK("embed_cuda_forward_into_a_cpu_out_status", st == DT_ERR_DEVICE);
        dt_tensor_free(ctx, &o);
        td.device = DT_CUDA_DEVICE;
        dt_tensor_create(ctx, &o, &td);
        DT_TEST_CHECK("embed_cuda_forward_after_a_bad_out_works", dt_embed_forward(e, &o, &kjt) == 0);
        td.device = DT_CPU;
        dt_tensor d;
        dt_tensor_create(ctx, &d, &td);
        st = dt_embed_backward(e, &d);
        dt_test_error("embed_cuda_backward_with_a_cpu_dout_is_device_error", st, dt_ctx_error(ctx), "dout is on cpu");
        dt_tensor_free(ctx, &d);
        dt_tensor_free(ctx, &o);
    }
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/embed_cuda_export", dt_test_tmpdir());
    int st = dt_embed_export_changed(e, prefix);
    dt_test_error("embed_cuda_export_is_unsupported", st, dt_ctx_error(ctx), "not supported yet");
    DT_TEST_CHECK("embed_cuda_export_status_unsupported", st == DT_ERR_UNSUPPORTED);
    dt_embed_free(e);
    { /* LFU eviction is the host map's only: the GPU id table evicts LRU */
        dt_embed_table_desc t;
        dt_embed_desc d;
        dt_embed *f = NULL;
        memset(&t, 0, sizeof t);
        t.name = "lfu"; t.rows = 64; t.dim = 4; t.dynamic = 1; t.eviction = DT_EVICT_LFU;
        memset(&d, 0, sizeof d);
        d.tables = &t; d.n_tables = 1; d.device = DT_CUDA_DEVICE;
        st = dt_embed_create(ctx, &f, &d);
        dt_test_error("embed_cuda_lfu_dynamic_table_is_unsupported", st, dt_ctx_error(ctx), "eviction = LFU");
        DT_TEST_CHECK("embed_cuda_lfu_status_unsupported", st == DT_ERR_UNSUPPORTED && !f);
        if (f) dt_embed_free(f);
        t.eviction = DT_EVICT_LRU;
        st = dt_embed_create(ctx, &f, &d);
        dt_test_check_all("embed_cuda_lru_dynamic_table_is_created", st == DT_OK && f, "status %d: %s", (int)st, dt_ctx_error(ctx));
        if (f) dt_embed_free(f);
    }
}

// out and dout over a table's own rows, on cuda: a resident table's shard (a cuda view from
// dt_embed_local_shard) and a tier HOST table's slow tier (pinned host memory the kernels reach
// at its device address, which under unified addressing is its host address: the host view
// relabelled cuda), with a cache and data-parallel (no cache: the kernels pool from it). The
// tier HOST ones were not checked: the forward admitted, then failed in a copy with DT_ERR_CUDA
// (on a GPU the copy and the kernels may simply write there). Each named, the table unchanged.
static void check_out_over_table(dt_ctx *ctx) {
    const char *names[3] = {"resident", "tier_host", "tier_host_data"};
    for (int c = 0; c < 3; c++) {
        dt_embed_table_desc t;
        dt_embed_desc d;
        dt_embed *e = NULL;
        memset(&t, 0, sizeof t);
        t.name = "t"; t.rows = 32; t.dim = 3; t.optim.lr = 1.0;
        if (c > 0) t.tier = DT_TIER_HOST;
        if (c == 1) t.cache_rows = 8;
        if (c == 2) t.sharding = DT_SHARD_DATA;
        memset(&d, 0, sizeof d);
        d.tables = &t; d.n_tables = 1; d.seed = 3; d.device = DT_CUDA_DEVICE;
        char name[160];
        snprintf(name, sizeof name, "embed_cuda_out_over_table_create_%s", names[c]);
        if (!dt_test_check_all(name, !dt_embed_create(ctx, &e, &d), "%s", dt_ctx_error(ctx))) continue;
        int64_t len[1] = {2}, ids[2] = {0, 1}, sh[2] = {1, 3};
        dt_kjt k;
        memset(&k, 0, sizeof k);
        k.n_features = 1; k.batch = 1; k.lengths = len; k.ids = ids;
        dt_tensor w, wv, ov, out;
        dt_tensor_desc td;
        memset(&td, 0, sizeof td);
        td.dtype = DT_F32; td.ndim = 2; td.shape[0] = 1; td.shape[1] = 3; td.device = DT_CUDA_DEVICE;
        dt_tensor_create(ctx, &out, &td);
        dt_embed_local_shard(e, &w, NULL, NULL, 0);
        std::vector<float> before = host_copy(ctx, &w);
        wv = w;
        wv.device = DT_CUDA_DEVICE; /* tier HOST: the same bytes at their device address */
        dt_tensor_view(ctx, &ov, &wv, 3, 2, sh);
        snprintf(name, sizeof name, "embed_cuda_forward_out_over_table_rows_is_named_%s", names[c]);
        int st = dt_embed_forward(e, &ov, &k);
        dt_test_error(name, st, dt_ctx_error(ctx), "dt_embed_forward: out shares memory with table \"t\"'s rows");
        snprintf(name, sizeof name, "embed_cuda_forward_out_over_table_rows_status_%s", names[c]);
        DT_TEST_CHECK(name, st == DT_ERR_ARG);
        snprintf(name, sizeof name, "embed_cuda_forward_then_runs_apart_%s", names[c]);
        dt_test_check_all(name, dt_embed_forward(e, &out, &k) == DT_OK, "%s", dt_ctx_error(ctx));
        snprintf(name, sizeof name, "embed_cuda_backward_dout_over_table_rows_is_named_%s", names[c]);
        st = dt_embed_backward(e, &ov);
        dt_test_error(name, st, dt_ctx_error(ctx), "dt_embed_backward: dout shares memory with table \"t\"'s rows");
        dt_embed_local_shard(e, &w, NULL, NULL, 0);
        std::vector<float> after = host_copy(ctx, &w);
        snprintf(name, sizeof name, "embed_cuda_refusals_leave_the_table_as_it_was_%s", names[c]);
        dt_test_check_all(name, before == after && !before.empty(), "%zu rows' floats differ or none",
                          before.size());
        dt_tensor_free(ctx, &out);
        dt_embed_free(e);
    }
}

// Accumulation on the device path (dt_embed_set_sync 0: the contributions wait in the device's
// window, the next sync-1 backward applies them): windows of 3, 2 and 1 backwards, outputs, rows
// and the unique rows updated (stats) equal the CPU's.
static void check_accumulate(dt_ctx *ctx, dt_embed_sharding sh, dt_embed_optim opt) {
    setup sc, sg;
    dt_embed *ec = NULL, *eg = NULL;
    char tag[96], name[192];
    int64_t rows[NF] = {20, 12, 10, 20};
    int saved = g_dev_path, ok = 1;
    g_dev_path = 1;
    make_setup(&sc, sh, opt, DT_F32, DT_CPU);
    make_setup(&sg, sh, opt, DT_F32, DT_CUDA_DEVICE);
    snprintf(tag, sizeof tag, "%s_%s", shard_name(sh), opt_name(opt));
    snprintf(name, sizeof name, "embed_cuda_accumulate_create_%s", tag);
    if (DT_TEST_CHECK(name, !dt_embed_create(ctx, &ec, &sc.desc) && !dt_embed_create(ctx, &eg, &sg.desc))) {
        const int syncs[6] = {0, 0, 1, 0, 1, 1};
        for (int s = 0; s < 6 && ok; s++) {
            batch k = make_batch(rows);
            std::vector<float> dout(B * dt_embed_pooled_dim(ec)), sgr(64), oc, og, qc, qg;
            for (size_t i = 0; i < dout.size(); i++) dout[i] = next_f();
            dt_embed_set_sync(ec, syncs[s]);
            dt_embed_set_sync(eg, syncs[s]);
            ok = !step(ctx, ec, k, dout, sgr, &oc, &qc) && !step(ctx, eg, k, dout, sgr, &og, &qg) && oc == og;
            snprintf(name, sizeof name, "embed_cuda_accumulate_forward_equals_cpu_bitwise_%s_step_%d", tag, s + 1);
            if (!ok) dt_test_fail(name, "%s", oc.size() == og.size() ? "outputs differ" : dt_ctx_error(ctx));
        }
        snprintf(name, sizeof name, "embed_cuda_accumulate_sync_0_then_1_forward_equals_cpu_bitwise_%s", tag);
        if (ok) dt_test_pass(name);
        for (int t = 0; ok && t < 3; t++) {
            dt_tensor vc, vg;
            int64_t r0, c0;
            dt_embed_local_shard(ec, &vc, &r0, &c0, t);
            dt_embed_local_shard(eg, &vg, &r0, &c0, t);
            std::vector<float> hc = host_copy(ctx, &vc), hg = host_copy(ctx, &vg);
            snprintf(name, sizeof name, "embed_cuda_accumulate_table_%c_rows_equal_cpu_%s", 'a' + t, tag);
            if (DT_TEST_CHECK(name, hc.size() == hg.size() && !hc.empty()))
                dt_test_allclose(name, hg.data(), hc.data(), hc.size(), 0, opt == DT_EMBED_ROWWISE_ADAGRAD ? 1e-6 : 0);
        }
        dt_embed_stats a, g;
        if (ok && !dt_embed_stats_get(ec, &a) && !dt_embed_stats_get(eg, &g)) {
            snprintf(name, sizeof name, "embed_cuda_accumulate_rows_updated_equal_cpu_%s", tag);
            dt_test_check_all(name, a.rows_updated == g.rows_updated && a.rows_updated > 0,
                              "rows updated cuda %lld, cpu %lld", (long long)g.rows_updated, (long long)a.rows_updated);
        }
    }
    dt_embed_free(ec);
    dt_embed_free(eg);
    g_dev_path = saved;
}

// The device path's second forward + backward on the same batch (the first one grew every
// buffer): no allocation, no free, nothing read back, no wait (every sharding). With table "a"
// dynamic (4 id-hash shards): one copy down, one wait: each of its m ids' slot, 4 counts per
// shard, the admitted pairs (2 per id): (3 m + 16) x 8 bytes. ctx->counters and the emulator's
// own counts must agree. A CUDA ctx (its
// dt_ctx_sync waits for real, and would be counted).
// accum: each counted step is a window of two (sync 0 then 1), after a first window that sized the
// device's accumulation buffers: nothing allocated, read back or waited for either.
static void check_counters(dt_embed_sharding sh, dt_embed_optim opt, int dyn = 0, int accum = 0) {
    dt_ctx cctx, *ctx = &cctx;
    dt_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (!DT_TEST_CHECK("embed_cuda_counters_ctx_init", !dt_ctx_init(ctx, &cd))) return;
    setup sg;
    dt_embed *e = NULL;
    char tag[96], name[192];
    int64_t rows[NF] = {20, 12, 10, 20};
    int saved = g_dev_path;
    g_dev_path = 1;
    make_setup(&sg, sh, opt, DT_F32, DT_CUDA_DEVICE);
    g_dev_path = saved;
    if (dyn) { sg.tabs[0].dynamic = 1; sg.tabs[0].hash_shards = 4; sg.tabs[0].admit_after = 1; rows[0] = rows[3] = 60; }
    snprintf(tag, sizeof tag, "%s_%s%s%s", shard_name(sh), opt_name(opt), dyn ? "_dynamic" : "",
             accum ? "_accumulating" : "");
    snprintf(name, sizeof name, "embed_cuda_counters_create_%s", tag);
    if (!DT_TEST_CHECK(name, !dt_embed_create(ctx, &e, &sg.desc))) { dt_ctx_shutdown(ctx); return; }
    batch k = make_batch(rows);
    dt_kjt kjt;
    dt_tensor o, d;
    dt_tensor_desc td;
    memset(&kjt, 0, sizeof kjt);
    kjt.n_features = NF; kjt.batch = B;
    kjt.lengths = k.lengths.data(); kjt.ids = k.ids.data(); kjt.weights = k.weights.data();
    memset(&td, 0, sizeof td);
    td.dtype = DT_F32; td.ndim = 2; td.shape[0] = B; td.shape[1] = dt_embed_pooled_dim(e); td.device = DT_CUDA_DEVICE;
    dt_tensor_create(ctx, &o, &td);
    dt_tensor_create(ctx, &d, &td);
    std::vector<float> dout(B * dt_embed_pooled_dim(e));
    for (size_t i = 0; i < dout.size(); i++) dout[i] = next_f();
    cudaMemcpy(d.data, dout.data(), dout.size() * sizeof(float), cudaMemcpyHostToDevice);
    int ok = 1, passes = accum ? 2 : 1;
    for (int p = 0; p < passes; p++) {
        dt_embed_set_sync(e, p == passes - 1);
        ok = ok && !dt_embed_forward(e, &o, &kjt) && !dt_embed_backward(e, &d);
    }
    dt_emu_counters c0, c1;
    dt_ctx_counters_reset(ctx);
    dt_emu_get_counters(&c0);
    for (int p = 0; p < passes; p++) {
        dt_embed_set_sync(e, p == passes - 1);
        ok = ok && !dt_embed_forward(e, &o, &kjt) && !dt_embed_backward(e, &d);
    }
    dt_emu_get_counters(&c1);
    snprintf(name, sizeof name, "embed_cuda_counters_steps_run_%s", tag);
    if (!DT_TEST_CHECK(name, ok)) fprintf(stderr, "  %s\n", dt_ctx_error(ctx));
    dt_cuda_counters k2 = ctx->counters;
    long long want_d2h = 0;
    if (dyn) {
        long long m = 0;
        for (int b = 0; b < B; b++) m += k.lengths[0 * B + b] + k.lengths[3 * B + b]; /* features 0 and 3 read "a" */
        want_d2h = (3 * m + 16) * 8;
    }
    snprintf(name, sizeof name, "embed_cuda_second_step_allocates_and_frees_nothing_%s", tag);
    dt_test_check_all(name, k2.allocs == 0 && k2.frees == 0 && c1.allocs == c0.allocs && c1.frees == c0.frees,
                      "ctx allocs %lld frees %lld; runtime allocs %lld frees %lld", (long long)k2.allocs,
                      (long long)k2.frees, c1.allocs - c0.allocs, c1.frees - c0.frees);
    snprintf(name, sizeof name, "embed_cuda_second_step_d2h_bytes_exact_%s", tag);
    dt_test_check_all(name, k2.d2h_bytes == want_d2h && c1.d2h_bytes - c0.d2h_bytes == want_d2h,
                      "ctx d2h %lld bytes, runtime %lld; expected %lld", (long long)k2.d2h_bytes,
                      c1.d2h_bytes - c0.d2h_bytes, want_d2h);
    snprintf(name, sizeof name, "embed_cuda_second_step_syncs_%s_%s", want_d2h ? "1" : "0", tag);
    dt_test_check_all(name, k2.syncs == (want_d2h ? 1 : 0) && c1.syncs - c0.syncs == k2.syncs,
                      "ctx syncs %lld, runtime %lld; expected %d", (long long)k2.syncs, c1.syncs - c0.syncs,
                      want_d2h ? 1 : 0);
    if (sh == DT_SHARD_DATA) { /* every table data-parallel: only the batch goes up (lengths, ids, weights) */
        long long nid = 0;
        for (int i = 0; i < NF * B; i++) nid += k.lengths[i];
        long long want_h2d = passes * ((long long)NF * B * 8 + nid * 8 + nid * 4);
        snprintf(name, sizeof name, "embed_cuda_second_step_uploads_only_the_batch_%s", tag);
        dt_test_check_all(name, k2.h2d_bytes == want_h2d, "h2d %lld bytes; expected %lld (lengths %d x 8, ids %lld x 8, "
                          "weights %lld x 4)", (long long)k2.h2d_bytes, want_h2d, NF * B, nid, nid);
    }
    snprintf(name, sizeof name, "embed_cuda_second_step_h2d_counted_%s", tag);
    dt_test_check_all(name, k2.h2d_bytes == c1.h2d_bytes - c0.h2d_bytes && k2.h2d_calls == c1.h2d_calls - c0.h2d_calls,
                      "ctx h2d %lld bytes in %lld calls, runtime %lld in %lld", (long long)k2.h2d_bytes,
                      (long long)k2.h2d_calls, c1.h2d_bytes - c0.h2d_bytes, c1.h2d_calls - c0.h2d_calls);
    dt_tensor_free(ctx, &o);
    dt_tensor_free(ctx, &d);
    dt_embed_free(e);
    dt_ctx_shutdown(ctx);
}

int main(int argc, char **argv) {
    int tsan = argc > 1 && !strcmp(argv[1], "tsan");
    dt_ctx ctx;
    dt_ctx_init(&ctx, NULL);
    if (tsan) {
        check_config(&ctx, DT_SHARD_ROW, DT_EMBED_ROWWISE_ADAGRAD, DT_F32, 2); /* the kernel with a barrier */
        check_config(&ctx, DT_SHARD_DATA, DT_EMBED_ADAM, DT_F32, 2);
        check_dynamic(&ctx, 3, 2);
        g_dev_path = 1;
        check_config(&ctx, DT_SHARD_ROW, DT_EMBED_ROWWISE_ADAGRAD, DT_F32, 2);
        check_dynamic(&ctx, 3, 2);
        g_dev_path = 0;
    } else {
        dt_embed_sharding shs[4] = {DT_SHARD_TABLE, DT_SHARD_ROW, DT_SHARD_COLUMN, DT_SHARD_DATA};
        dt_embed_optim opts[4] = {DT_EMBED_SGD, DT_EMBED_ADAGRAD, DT_EMBED_ROWWISE_ADAGRAD, DT_EMBED_ADAM};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                if (!(shs[i] == DT_SHARD_COLUMN && opts[j] == DT_EMBED_ROWWISE_ADAGRAD))
                    check_config(&ctx, shs[i], opts[j], DT_F32, 3);
        check_config(&ctx, DT_SHARD_ROW, DT_EMBED_ADAGRAD, DT_BF16, 3);
        check_checkpoint(&ctx);
        check_dynamic(&ctx, 1, 4);
        check_dynamic(&ctx, 3, 4);
        check_bad_inputs(&ctx);
        check_out_over_table(&ctx);
        g_dev_path = 1; /* every sharding and optimizer again, on the device path */
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                if (!(shs[i] == DT_SHARD_COLUMN && opts[j] == DT_EMBED_ROWWISE_ADAGRAD))
                    check_config(&ctx, shs[i], opts[j], DT_F32, 3);
        check_config(&ctx, DT_SHARD_ROW, DT_EMBED_ADAGRAD, DT_BF16, 3);
        check_dynamic(&ctx, 1, 4);
        check_dynamic(&ctx, 3, 4);
        g_dev_path = 0;
        for (int i = 0; i < 4; i++) check_counters(shs[i], i == 1 ? DT_EMBED_ROWWISE_ADAGRAD : DT_EMBED_ADAM);
        check_counters(DT_SHARD_ROW, DT_EMBED_ADAM, 1);
        check_counters(DT_SHARD_ROW, DT_EMBED_ADAGRAD, 0, 1);
        check_counters(DT_SHARD_DATA, DT_EMBED_ADAM, 0, 1);
        check_accumulate(&ctx, DT_SHARD_ROW, DT_EMBED_ADAGRAD);
        check_accumulate(&ctx, DT_SHARD_TABLE, DT_EMBED_ROWWISE_ADAGRAD);
        check_accumulate(&ctx, DT_SHARD_DATA, DT_EMBED_ADAM);
    }
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
