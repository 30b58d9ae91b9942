/* tests/test_embed.c - dt_embed.h in one process: each sparse optimizer against its formula
   computed in double by hand, lazy semantics (untouched rows keep their bits), pooling against
   a hand sum, hashed ids, named errors for bad descs and batches, the planner's choices and
   its table, the incremental export read back (and by numpy when Python has it), and a step's
   cost independent of the table's rows. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

#ifndef __cplusplus
extern FILE *popen(const char *command, const char *type); /* POSIX; hidden by strict -std=c99 */
extern int pclose(FILE *stream);
#endif

static dt_ctx C;

static dt_embed *one_table(dt_embed_optim kind, dt_embed_pooling pool, int weighted, int64_t rows, int dim) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(&t, 0, sizeof t);
    t.name = "t"; t.rows = rows; t.dim = dim; t.pooling = pool; t.weighted = weighted; t.optim.kind = kind;
    t.optim.lr = 0.1;
    t.init.kind = DT_INIT_NORMAL; t.init.std = 1;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.seed = 5;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "one_table: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* Two samples: bag 0 = {1, 3, 1} (a duplicate), bag 1 = {3}; rows 0, 2, 4 untouched. */
static const int64_t LEN[2] = {3, 1};
static const int64_t IDS[4] = {1, 3, 1, 3};
static const float WTS[4] = {0.5f, 2.0f, 1.5f, -1.0f};

static void kjt(dt_kjt *k, int weighted) {
    memset(k, 0, sizeof *k);
    k->n_features = 1; k->batch = 2; k->lengths = LEN; k->ids = IDS; k->weights = weighted ? WTS : NULL;
}

static void test_optimizers(void) {
    const char *names[4] = {"sgd", "adagrad", "rowwise_adagrad", "adam"};
    int o;
    for (o = 0; o < 4; o++) {
        dt_embed *e = one_table((dt_embed_optim)(DT_EMBED_SGD + o), DT_POOL_SUM, 0, 5, 3);
        dt_tensor w, out = dt_test_t2(&C, 2, 3), dout = dt_test_t2(&C, 2, 3);
        double ref[5][3], s[5][3], m[5][3], v[5][3], rs[5], worst = 0;
        float before[5][3];
        int r, c, step, lazy_ok = 1;
        dt_kjt k;
        char name[96];
        kjt(&k, 0);
        dt_embed_local_shard(e, &w, NULL, NULL, 0);
        for (r = 0; r < 5; r++)
            for (c = 0; c < 3; c++) {
                ref[r][c] = ((float *)w.data)[r * 3 + c];
                before[r][c] = ((float *)w.data)[r * 3 + c];
                s[r][c] = m[r][c] = v[r][c] = 0;
            }
        memset(rs, 0, sizeof rs);
        for (step = 1; step <= 2; step++) {
            double g[5][3];
            memset(g, 0, sizeof g);
            for (c = 0; c < 6; c++) ((float *)dout.data)[c] = (float)(0.3 * (c + 1) * (step == 1 ? 1 : -0.7));
            if (dt_embed_forward(e, &out, &k) || dt_embed_backward(e, &dout)) {
                dt_test_fail(names[o], "%s", dt_ctx_error(&C));
                break;
            }
            /* by hand: row 1 appears twice in bag 0, row 3 in bag 0 and bag 1 */
            for (c = 0; c < 3; c++) {
                double d0 = ((float *)dout.data)[c], d1 = ((float *)dout.data)[3 + c];
                g[1][c] = 2 * d0;
                g[3][c] = d0 + d1;
            }
            for (r = 1; r < 5; r += 2) {
                double ss = 0;
                for (c = 0; c < 3; c++) ss += g[r][c] * g[r][c];
                rs[r] += ss / 3;
                for (c = 0; c < 3; c++) {
                    switch (o) {
                    case 0: ref[r][c] -= 0.1 * g[r][c]; break;
                    case 1: s[r][c] += g[r][c] * g[r][c]; ref[r][c] -= 0.1 * g[r][c] / (sqrt(s[r][c]) + 1e-10); break;
                    case 2: ref[r][c] -= 0.1 / (sqrt(rs[r]) + 1e-10) * g[r][c]; break;
                    default:
                        m[r][c] = 0.9 * m[r][c] + 0.1 * g[r][c];
                        v[r][c] = 0.999 * v[r][c] + 0.001 * g[r][c] * g[r][c];
                        ref[r][c] -= 0.1 / (1 - pow(0.9, step)) * m[r][c] /
                                     (sqrt(v[r][c]) / sqrt(1 - pow(0.999, step)) + 1e-8);
                        break;
                    }
                }
            }
        }
        for (r = 0; r < 5; r++)
            for (c = 0; c < 3; c++) {
                double got = ((float *)w.data)[r * 3 + c], err = fabs(got - ref[r][c]) / (fabs(ref[r][c]) + 1e-3);
                if (err > worst) worst = err;
                if (r % 2 == 0 && memcmp(&before[r][c], (float *)w.data + r * 3 + c, 4) != 0) lazy_ok = 0;
                if (err > 1e-5)
                    fprintf(stderr, "%s: row %d col %d: got %.9g, formula in double %.9g\n", names[o], r, c, got, ref[r][c]);
            }
        snprintf(name, sizeof name, "embed_%s_matches_its_formula_in_double", names[o]);
        dt_test_check_all(name, worst <= 1e-5, "worst relative error %.3g (tolerance 1e-5)", worst);
        snprintf(name, sizeof name, "embed_%s_leaves_untouched_rows_bitwise", names[o]);
        dt_test_check_all(name, lazy_ok, "an untouched row changed");
        dt_tensor_free(&C, &out); dt_tensor_free(&C, &dout);
        dt_embed_free(e);
    }
}

/* Accumulation: two micro-batches with dt_embed_set_sync(0) then (1) update the rows exactly as
   one batch of their samples; row 1 is touched only by the first micro-batch, row 4 only by the
   second, row 3 by both. */
static void test_accumulation(void) {
    static const int64_t len[4] = {3, 1, 1, 2}, ids[7] = {1, 3, 1, 3, 0, 3, 4};
    static const float wts[7] = {0.5f, 2.0f, 1.5f, -1.0f, 0.25f, 3.0f, -0.5f};
    const char *names[4] = {"sgd", "adagrad", "rowwise_adagrad", "adam"};
    int o, step, half;
    for (o = 0; o < 4; o++) {
        dt_embed *one = one_table((dt_embed_optim)(DT_EMBED_SGD + o), DT_POOL_MEAN, 1, 5, 3);
        dt_embed *acc = one_table((dt_embed_optim)(DT_EMBED_SGD + o), DT_POOL_MEAN, 1, 5, 3);
        dt_tensor w1, w2, out4 = dt_test_t2(&C, 4, 3), dout4 = dt_test_t2(&C, 4, 3), out2 = dt_test_t2(&C, 2, 3), dout2 = dt_test_t2(&C, 2, 3);
        dt_kjt k;
        char name[96];
        int ok = 1;
        for (step = 0; step < 3 && ok; step++) {
            int c;
            for (c = 0; c < 12; c++) ((float *)dout4.data)[c] = (float)(0.37 * (c + 1) - 0.9 * step);
            memset(&k, 0, sizeof k);
            k.n_features = 1; k.batch = 4; k.lengths = len; k.ids = ids; k.weights = wts;
            ok = !dt_embed_forward(one, &out4, &k) && !dt_embed_backward(one, &dout4);
            for (half = 0; half < 2 && ok; half++) { /* samples 0-1 (ids 0..3), then 2-3 (ids 4..6) */
                int64_t at = half ? 4 : 0;
                memset(&k, 0, sizeof k);
                k.n_features = 1; k.batch = 2; k.lengths = len + 2 * half; k.ids = ids + at; k.weights = wts + at;
                memcpy(dout2.data, (float *)dout4.data + 6 * half, 6 * sizeof(float));
                ok = !dt_embed_set_sync(acc, half) && !dt_embed_forward(acc, &out2, &k) && !dt_embed_backward(acc, &dout2);
            }
            if (!ok) dt_test_fail("embed_accumulation_runs", "%s", dt_ctx_error(&C));
        }
        dt_embed_local_shard(one, &w1, NULL, NULL, 0);
        dt_embed_local_shard(acc, &w2, NULL, NULL, 0);
        snprintf(name, sizeof name, "embed_%s_two_accumulated_micro_batches_equal_one_batch_bitwise", names[o]);
        if (ok) {
            int r, diff = -1;
            for (r = 0; r < 15 && diff < 0; r++)
                if (memcmp((float *)w1.data + r, (float *)w2.data + r, 4)) diff = r;
            dt_test_check_all(name, diff < 0, "element %d: one batch %.9g, accumulated %.9g", diff,
                              diff >= 0 ? ((float *)w1.data)[diff] : 0.0, diff >= 0 ? ((float *)w2.data)[diff] : 0.0);
        }
        dt_test_error("embed_set_sync_2_is_named", dt_embed_set_sync(acc, 2), dt_ctx_error(&C), "sync = 2");
        dt_tensor_free(&C, &out4); dt_tensor_free(&C, &dout4); dt_tensor_free(&C, &out2); dt_tensor_free(&C, &dout2);
        dt_embed_free(one);
        dt_embed_free(acc);
    }
}

static void test_pooling(void) {
    int p, wgt;
    for (p = 0; p < 2; p++)
        for (wgt = 0; wgt < 2; wgt++) {
            dt_embed *e = one_table(DT_EMBED_SGD, p ? DT_POOL_MEAN : DT_POOL_SUM, wgt, 5, 3);
            dt_tensor w, out = dt_test_t2(&C, 2, 3);
            dt_kjt k;
            double worst = 0;
            int b, c, j, o = 0;
            char name[96];
            kjt(&k, wgt);
            dt_embed_local_shard(e, &w, NULL, NULL, 0);
            if (dt_embed_forward(e, &out, &k)) dt_test_fail("embed_pooling_runs", "%s", dt_ctx_error(&C));
            for (b = 0; b < 2; b++) {
                for (c = 0; c < 3; c++) {
                    double acc = 0, got = ((float *)out.data)[b * 3 + c];
                    for (j = 0; j < LEN[b]; j++)
                        acc += (wgt ? WTS[o + j] : 1.0) * ((float *)w.data)[IDS[o + j] * 3 + c];
                    if (p) acc /= (double)LEN[b];
                    if (fabs(got - acc) > worst) worst = fabs(got - acc);
                }
                o += (int)LEN[b];
            }
            snprintf(name, sizeof name, "embed_%s%s_pooling_equals_hand_sum", wgt ? "weighted_" : "", p ? "mean" : "sum");
            dt_test_check_all(name, worst <= 1e-6, "worst abs error %.3g (tolerance 1e-6)", worst);
            dt_tensor_free(&C, &out);
            dt_embed_free(e);
        }
}

static void test_errors(void) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_status st;
    dt_kjt k;
    dt_tensor out = dt_test_t2(&C, 2, 3);
    int64_t bad_len[2] = {1, -2}, big_id[4] = {1, 7, 1, 3};
    memset(&t, 0, sizeof t);
    memset(&d, 0, sizeof d);
    t.name = "user"; t.rows = 0; t.dim = 4;
    d.tables = &t; d.n_tables = 1;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_rows_0_is_named", st == DT_ERR_ARG, dt_ctx_error(&C), "\"user\").rows = 0");
    t.rows = 10; t.weighted = 2;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_flag_2_is_an_error", st == DT_ERR_ARG, dt_ctx_error(&C), "weighted = 2; expected 0 or 1");
    t.weighted = 0; t.sharding = DT_SHARD_COLUMN; t.optim.kind = DT_EMBED_ROWWISE_ADAGRAD;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_column_rowwise_adagrad_is_unsupported", st == DT_ERR_UNSUPPORTED, dt_ctx_error(&C),
                  "row-wise Adagrad");
    t.sharding = DT_SHARD_TABLE; t.optim.kind = DT_EMBED_SGD; t.pin_owner = 1; t.owner = 3;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_owner_out_of_world_is_named", st == DT_ERR_ARG, dt_ctx_error(&C), "owner = 3");
    t.pin_owner = 0; t.rows = (int64_t)1 << 62; t.dim = 1 << 20;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_rows_x_dim_overflow_is_named", st == DT_ERR_ARG, dt_ctx_error(&C), "overflows");

    e = one_table(DT_EMBED_SGD, DT_POOL_SUM, 0, 5, 3);
    kjt(&k, 0);
    k.lengths = bad_len;
    st = dt_embed_forward(e, &out, &k);
    dt_test_error("embed_negative_length_is_named", st == DT_ERR_ARG, dt_ctx_error(&C), "lengths[1]");
    kjt(&k, 0);
    k.ids = big_id;
    st = dt_embed_forward(e, &out, &k);
    dt_test_error("embed_id_out_of_range_names_table_feature_sample_id", st == DT_ERR_RANGE, dt_ctx_error(&C),
                  "table \"t\", feature 0, local sample 0, id 7");
    st = dt_embed_backward(e, &out);
    dt_test_error("embed_backward_without_forward_is_a_state_error", st == DT_ERR_STATE, dt_ctx_error(&C), "no dt_embed_forward");
    kjt(&k, 0);
    k.n_features = 2;
    st = dt_embed_forward(e, &out, &k);
    dt_test_error("embed_feature_count_mismatch_is_named", st == DT_ERR_ARG, dt_ctx_error(&C), "n_features = 2; expected 1");
    dt_embed_free(e);
    dt_tensor_free(&C, &out);
}

static void test_hash_and_empty(void) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_kjt k;
    dt_tensor out = dt_test_t2(&C, 3, 2), w, empty = dt_test_t2(&C, 0, 2);
    int64_t len[3] = {1, 0, 1}, ids[2] = {-5, (int64_t)1 << 60};
    int64_t r0 = (int64_t)(dt_embed_hash_id(-5) % 7), r1 = (int64_t)(dt_embed_hash_id((int64_t)1 << 60) % 7);
    memset(&t, 0, sizeof t);
    memset(&d, 0, sizeof d);
    t.name = "h"; t.rows = 7; t.dim = 2; t.ids = DT_IDS_HASH;
    d.tables = &t; d.n_tables = 1;
    if (dt_embed_create(&C, &e, &d)) { dt_test_fail("embed_hash_create", "%s", dt_ctx_error(&C)); return; }
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = 3; k.lengths = len; k.ids = ids;
    dt_embed_local_shard(e, &w, NULL, NULL, 0);
    if (dt_embed_forward(e, &out, &k)) dt_test_fail("embed_hash_forward", "%s", dt_ctx_error(&C));
    dt_test_check_all("embed_hashed_ids_look_up_hash_mod_rows",
                      memcmp(out.data, (float *)w.data + r0 * 2, 8) == 0 && memcmp((float *)out.data + 4, (float *)w.data + r1 * 2, 8) == 0 &&
                      ((float *)out.data)[2] == 0 && ((float *)out.data)[3] == 0,
                      "got %g %g | %g %g | %g %g, rows %lld and %lld", ((float *)out.data)[0], ((float *)out.data)[1],
                      ((float *)out.data)[2], ((float *)out.data)[3], ((float *)out.data)[4], ((float *)out.data)[5],
                      (long long)r0, (long long)r1);
    k.batch = 0; k.lengths = NULL; k.ids = NULL;
    dt_test_check_all("embed_empty_local_batch_is_valid",
                      dt_embed_forward(e, &empty, &k) == DT_OK && dt_embed_backward(e, &empty) == DT_OK, "%s",
                      dt_ctx_error(&C));
    dt_embed_free(e);
    dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &empty);
}

static void test_planner(void) {
    dt_embed_table_desc t[3];
    dt_embed_desc d;
    dt_embed *e = NULL;
    char buf[2048];
    memset(t, 0, sizeof t);
    memset(&d, 0, sizeof d);
    t[0].name = "small"; t[0].rows = 100; t[0].dim = 8;
    t[1].name = "big"; t[1].rows = 200000; t[1].dim = 8;
    t[2].name = "pinned"; t[2].rows = 10; t[2].dim = 8; t[2].sharding = DT_SHARD_ROW;
    d.tables = t; d.n_tables = 3; d.dp_max_bytes = 16384;
    if (dt_embed_create(&C, &e, &d)) { dt_test_fail("embed_planner", "%s", dt_ctx_error(&C)); return; }
    dt_embed_plan_format(e, buf, sizeof buf);
    dt_test_check_all("embed_planner_small_data_parallel_big_table_wise_pinned_kept",
                      dt_embed_table_sharding(e, 0, NULL) == DT_SHARD_DATA && dt_embed_table_sharding(e, 1, NULL) == DT_SHARD_TABLE &&
                      dt_embed_table_sharding(e, 2, NULL) == DT_SHARD_ROW && strstr(buf, "big") && strstr(buf, "bytes/rank"),
                      "plan:\n%s", buf);
    dt_embed_free(e);
}

/* Only the touched rows are exported, with their current values; numpy reads the file. */
static void test_export(void) {
    dt_embed *e = one_table(DT_EMBED_ADAGRAD, DT_POOL_SUM, 0, 5, 3);
    dt_tensor out = dt_test_t2(&C, 2, 3), w, ids, vals;
    dt_kjt k;
    dt_st_file f;
    char prefix[1024], path[1100], cmd[1400], line[512] = "";
    const char *py = "/usr/bin/python3"; /* Debian's, with numpy; else whatever python3 is on PATH */
    FILE *p = fopen(py, "rb");
    int ok;
    if (p) fclose(p);
    else py = "python3";
    kjt(&k, 0);
    snprintf(prefix, sizeof prefix, "%s/test_embed_export", dt_test_tmpdir());
    snprintf(path, sizeof path, "%s.rank_00000.safetensors", prefix);
    if (dt_embed_forward(e, &out, &k) || dt_embed_backward(e, &out) || dt_embed_export_changed(e, prefix)) {
        dt_test_fail("embed_export_runs", "%s", dt_ctx_error(&C));
        return;
    }
    dt_embed_local_shard(e, &w, NULL, NULL, 0);
    memset(&ids, 0, sizeof ids); memset(&vals, 0, sizeof vals);
    ok = dt_safetensors_open(&C, &f, path) == DT_OK;
    if (ok) {
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = DT_I64; d.shape[0] = 2; d.ndim = 1;
        dt_tensor_create(&C, &ids, &d);
        d.dtype = DT_F32; d.shape[1] = 3; d.ndim = 2;
        dt_tensor_create(&C, &vals, &d);
        ok = dt_safetensors_read(&C, &f, &ids, "t.ids") == DT_OK && dt_safetensors_read(&C, &f, &vals, "t.values") == DT_OK;
        dt_safetensors_close(&C, &f);
    }
    dt_test_check_all("embed_export_holds_exactly_the_changed_rows",
                      ok && ((int64_t *)ids.data)[0] == 1 && ((int64_t *)ids.data)[1] == 3 &&
                      memcmp(vals.data, (float *)w.data + 3, 12) == 0 && memcmp((float *)vals.data + 3, (float *)w.data + 9, 12) == 0,
                      "%s", ok ? "ids or values differ" : dt_ctx_error(&C));
    /* a second export with nothing changed holds no rows */
    ok = dt_embed_export_changed(e, prefix) == DT_OK && dt_safetensors_open(&C, &f, path) == DT_OK;
    if (ok) {
        const dt_st_entry *en = dt_safetensors_find(&f, "t.ids");
        ok = en && en->shape[0] == 0;
        dt_safetensors_close(&C, &f);
    }
    dt_test_check_all("embed_export_is_incremental", ok, "the second export is not empty");
    /* numpy (tests/safetensors_numpy.py) reads it: a plain safetensors file */
    dt_embed_forward(e, &out, &k);
    dt_embed_backward(e, &out);
    dt_embed_export_changed(e, prefix);
    snprintf(cmd, sizeof cmd, "%s -c 'import numpy' 2>/dev/null && %s tests/safetensors_numpy.py '%s' 2>&1 | grep t.ids", py, py, path);
    p = popen(cmd, "r");
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = 0;
        pclose(p);
    }
    if (!line[0]) dt_test_skip("embed_export_reads_in_numpy", "python3 with numpy not available");
    else dt_test_check_all("embed_export_reads_in_numpy", strstr(line, "t.ids I64 2 4.0") != NULL, "numpy says: %s", line);
    dt_tensor_free(&C, &ids); dt_tensor_free(&C, &vals); dt_tensor_free(&C, &out);
    dt_embed_free(e);
}


/* The changed rows over many bytes of the change map, touched out of order: exported once each,
   in row order, with their values, each export after one step, then one after two; and a step that
   touches new rows holds no more memory than the step before it (a list of the changed rows grew
   with them: 8 bytes a row, doubled past its count) */
static void test_export_rows(void) {
    static const int64_t len[2] = {4, 3}, ids1[7] = {69, 8, 0, 7, 40, 8, 9}, ids2[7] = {1, 69, 64, 15, 16, 33, 1};
    static const int64_t want1[6] = {0, 7, 8, 9, 40, 69}, want2[6] = {1, 15, 16, 33, 64, 69};
    static const int64_t want3[11] = {0, 1, 7, 8, 9, 15, 16, 33, 40, 64, 69};
    const int64_t *batches[4] = {ids1, ids2, ids1, ids2}, *wants[4] = {want1, want2, NULL, want3};
    const int nwant[4] = {6, 6, 0, 11};
    const char *names[4] = {"embed_export_rows_in_row_order", "embed_export_rows_second_export_in_row_order", "",
                            "embed_export_rows_two_steps_in_row_order"};
    dt_embed *e = one_table(DT_EMBED_SGD, DT_POOL_SUM, 0, 70, 2);
    dt_tensor out = dt_test_t2(&C, 2, 2), w;
    dt_kjt k;
    char prefix[1024], path[1100];
    size_t held[4] = {0, 0, 0, 0};
    int s, j;
    snprintf(prefix, sizeof prefix, "%s/test_embed_export_rows", dt_test_tmpdir());
    snprintf(path, sizeof path, "%s.rank_00000.safetensors", prefix);
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = 2; k.lengths = len;
    for (s = 0; s < 4; s++) {
        dt_st_file f;
        dt_tensor ids, vals;
        dt_tensor_desc d;
        const dt_st_entry *en;
        int ok;
        char why[DT_ERROR_MAX + 100] = "";
        k.ids = batches[s];
        dt_tensor_fill(&C, &out, 1.0);
        if (dt_embed_forward(e, &out, &k) || dt_embed_backward(e, &out)) {
            dt_test_fail("embed_export_rows_step", "%s", dt_ctx_error(&C));
            break;
        }
        held[s] = C.bytes_in_use;
        if (!wants[s]) continue; /* the third step: exported with the fourth's */
        if (dt_embed_export_changed(e, prefix) || dt_safetensors_open(&C, &f, path)) {
            dt_test_fail("embed_export_rows_export", "%s", dt_ctx_error(&C));
            break;
        }
        en = dt_safetensors_find(&f, "t.ids");
        memset(&d, 0, sizeof d);
        d.dtype = DT_I64; d.shape[0] = nwant[s]; d.ndim = 1;
        dt_tensor_create(&C, &ids, &d);
        d.dtype = DT_F32; d.shape[1] = 2; d.ndim = 2;
        dt_tensor_create(&C, &vals, &d);
        ok = en && en->shape[0] == nwant[s] && dt_safetensors_read(&C, &f, &ids, "t.ids") == DT_OK &&
             dt_safetensors_read(&C, &f, &vals, "t.values") == DT_OK;
        dt_safetensors_close(&C, &f);
        if (!ok) snprintf(why, sizeof why, "t.ids holds %lld rows, expected %d (%s)", en ? (long long)en->shape[0] : -1LL,
                          nwant[s], dt_ctx_error(&C));
        dt_embed_local_shard(e, &w, NULL, NULL, 0);
        for (j = 0; ok && j < nwant[s]; j++) {
            int64_t got = ((int64_t *)ids.data)[j];
            if (got != wants[s][j] || memcmp((float *)vals.data + 2 * j, (float *)w.data + 2 * wants[s][j], 8)) {
                snprintf(why, sizeof why, "export %d, entry %d: row %lld, expected %lld (or its values differ)", s + 1, j,
                         (long long)got, (long long)wants[s][j]);
                ok = 0;
            }
        }
        dt_test_check_all(names[s], ok, "%s", why);
        dt_tensor_free(&C, &ids); dt_tensor_free(&C, &vals);
    }
    dt_test_check_all("embed_backward_holds_no_more_for_new_rows", held[2] > 0 && held[3] == held[2],
                      "bytes held after a step: %zu, after the next (5 rows changed anew, none exported between): %zu",
                      held[2], held[3]);
    dt_tensor_free(&C, &out);
    dt_embed_free(e);
}

/* A dynamic table of 3 slots in one id-hash shard, admission at the 2nd sighting, LRU: against
   a model written here (plain arrays). Each step is one batch of one-id bags. */
static void test_dynamic(void) {
    /* the last two steps: four new ids for three slots in one batch, so the 4th is rejected
       (the rows in use by the batch are not evicted) */
    static const int64_t steps[8][4] = {{10, 11, 10, 12}, {11, 13, 13, 14}, {14, 15, 15, 10}, {16, 16, 17, 17},
                                        {12, 12, 10, 99}, {18, 18, 19, 19}, {30, 31, 32, 33}, {30, 31, 32, 33}};
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    int64_t slot_id[3], stamp[3], seen_id[64], seen_n[64], n_seen = 0, used = 0, clock = 0;
    int64_t adm = 0, ev = 0, rej = 0, len[4] = {1, 1, 1, 1};
    int s, j, bad = 0, i;
    dt_tensor out = dt_test_t2(&C, 4, 2);
    memset(&t, 0, sizeof t);
    memset(&d, 0, sizeof d);
    t.name = "dyn"; t.rows = 3; t.dim = 2; t.dynamic = 1; t.admit_after = 2; t.hash_shards = 1;
    d.tables = &t; d.n_tables = 1; d.seed = 9;
    if (dt_embed_create(&C, &e, &d)) { dt_test_fail("embed_dynamic_create", "%s", dt_ctx_error(&C)); return; }
    for (s = 0; s < 8; s++) {
        dt_kjt k;
        dt_embed_stats st;
        int64_t step0 = clock;
        memset(&st, 0, sizeof st);
        memset(&k, 0, sizeof k);
        k.n_features = 1; k.batch = 4; k.lengths = len; k.ids = steps[s];
        if (dt_embed_forward(e, &out, &k)) { dt_test_fail("embed_dynamic_forward", "%s", dt_ctx_error(&C)); break; }
        for (j = 0; j < 4; j++) {
            int64_t id = steps[s][j], x = -1, c;
            float want[2] = {0, 0};
            for (i = 0; i < used; i++) if (slot_id[i] == id) x = i;
            if (x < 0) {
                int64_t si = -1;
                for (i = 0; i < n_seen; i++) if (seen_id[i] == id) si = i;
                if (si < 0) { si = n_seen++; seen_id[si] = id; seen_n[si] = 0; }
                seen_n[si]++;
                if (seen_n[si] >= 2) {
                    if (used < 3) x = used++;
                    else {
                        int64_t lru = 0;
                        for (i = 1; i < 3; i++) if (stamp[i] < stamp[lru]) lru = i;
                        if (stamp[lru] > step0) x = -2; /* all used by this batch: rejected */
                        else { x = lru; ev++; }
                    }
                    if (x >= 0) { slot_id[x] = id; seen_n[si] = 0; adm++; }
                }
                if (x < 0) { rej++; x = -1; }
            }
            if (x >= 0) {
                dt_tensor v;
                dt_init_desc in;
                char name[64];
                stamp[x] = ++clock;
                memset(&in, 0, sizeof in);
                in.kind = DT_INIT_UNIFORM; in.low = -sqrt(1.0 / 3); in.high = sqrt(1.0 / 3); in.seed = 9;
                snprintf(name, sizeof name, "dyn#%lld", (long long)id);
                in.name = name;
                v = dt_test_t2(&C, 1, 2);
                dt_tensor_init(&C, &v, &in);
                want[0] = ((float *)v.data)[0]; want[1] = ((float *)v.data)[1];
                dt_tensor_free(&C, &v);
            }
            for (c = 0; c < 2; c++)
                if (((float *)out.data)[j * 2 + c] != want[c]) {
                    if (!bad) fprintf(stderr, "step %d sample %d (id %lld): got %g, model %g\n", s, j, (long long)id,
                                      ((float *)out.data)[j * 2 + c], want[c]);
                    bad++;
                }
        }
        dt_embed_stats_get(e, &st);
        if (st.admitted != adm || st.evicted != ev || st.rejected != rej) {
            if (!bad) fprintf(stderr, "step %d: admitted %lld evicted %lld rejected %lld; model %lld %lld %lld\n", s,
                              (long long)st.admitted, (long long)st.evicted, (long long)st.rejected, (long long)adm,
                              (long long)ev, (long long)rej);
            bad++;
        }
    }
    dt_test_check_all("embed_dynamic_admission_lru_eviction_match_a_model", bad == 0 && ev > 0 && rej > 0,
                      "%d differences (evicted %lld, rejected %lld: both must be > 0)", bad, (long long)ev, (long long)rej);
    dt_embed_free(e);
    dt_tensor_free(&C, &out);
}

/* out over a table's own rows (a view from dt_embed_local_shard): the forward read the rows and
   would write out over them, spoiling the table (1.98 off after a step, found by an audit); dout
   over the rows: the update moves rows the backward still reads. Both named, nothing changed. */
static void test_out_over_table(void) {
    dt_embed *e = one_table(DT_EMBED_SGD, DT_POOL_SUM, 0, 5, 3);
    dt_tensor w, ov, out = dt_test_t2(&C, 2, 3);
    int64_t sh[2] = {2, 3};
    float before[15];
    dt_kjt k;
    kjt(&k, 0);
    dt_embed_local_shard(e, &w, NULL, NULL, 0);
    memcpy(before, w.data, sizeof before);
    dt_tensor_view(&C, &ov, &w, 3, 2, sh);
    dt_test_error("embed_forward_out_over_table_rows_is_named", dt_embed_forward(e, &ov, &k), dt_ctx_error(&C),
                  "dt_embed_forward: out shares memory with table \"t\"'s rows");
    DT_TEST_CHECK("embed_forward_then_runs_apart", dt_embed_forward(e, &out, &k) == DT_OK);
    dt_test_error("embed_backward_dout_over_table_rows_is_named", dt_embed_backward(e, &ov), dt_ctx_error(&C),
                  "dt_embed_backward: dout shares memory with table \"t\"'s rows");
    dt_test_equal_bytes("embed_refusals_leave_the_table_as_it_was", w.data, before, sizeof before);
    dt_tensor_free(&C, &out);
    dt_embed_free(e);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    test_out_over_table();
    test_optimizers();
    test_accumulation();
    test_pooling();
    test_errors();
    test_hash_and_empty();
    test_planner();
    test_export();
    test_export_rows();
    test_dynamic();
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
