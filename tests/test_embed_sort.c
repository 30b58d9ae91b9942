/* tests/test_embed_sort.c - the backward's sort of the gradient contributions by row (an LSD
   radix sort whose digits follow the table's size: one, two and three passes) merges duplicate
   ids exactly: one SGD step (lr 1) on tables of 3, 100000 and 2^25 + 5 rows, with ids at the
   digit boundaries (2^k - 1, 2^k, the last row) and many duplicates, leaves every touched row at
   w - (summed gradient), every other row as it was, and counts each distinct row once. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"
#include <math.h>

static dt_ctx C;

static void one_table(int64_t R) {
    enum { B = 400, MAXL = 5 };
    static const int64_t edges[] = {0, 1, 2, 511, 512, 4095, 4096, 8191, 8192, 65535, 65536, 99999, 16777215, 16777216,
                                    33554431, 33554432, 33554436};
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_embed_stats st;
    dt_tensor out, dout, w;
    dt_tensor_desc td;
    dt_kjt k;
    int64_t lengths[B], ids[B * MAXL], n = 0, i, j, r0, c0, distinct = 0, n_edges = 0;
    int64_t cand[sizeof edges / sizeof edges[0] + 64];
    double *gsum = (double *)calloc(B * MAXL, sizeof(double)), worst = 0;
    float *before = (float *)malloc(sizeof(float) * B * MAXL), near_before[3];
    char name[64];
    for (i = 0; i < (int64_t)(sizeof edges / sizeof edges[0]); i++)
        if (edges[i] < R) cand[n_edges++] = edges[i];
    for (i = 0; i < 64; i++) cand[n_edges++] = (int64_t)(dt_rng_uniform(41, (uint64_t)R, (uint64_t)i) * (float)R) % R;
    memset(&t, 0, sizeof t);
    t.name = "t"; t.rows = R; t.dim = 1; t.optim.kind = DT_EMBED_SGD; t.optim.lr = 1.0; t.sharding = DT_SHARD_TABLE;
    t.init.kind = DT_INIT_NORMAL; t.init.std = 1;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.seed = 5;
    snprintf(name, sizeof name, "sort_R%lld_create", (long long)R);
    if (dt_embed_create(&C, &e, &d)) { dt_test_fail(name, "%s", dt_ctx_error(&C)); free(gsum); free(before); return; }
    for (i = 0; i < B; i++) { /* bags of 1..5 ids drawn from few candidates: duplicates in and across bags */
        lengths[i] = 1 + (int64_t)(dt_rng_uniform(42, 0, (uint64_t)i) * (float)MAXL) % MAXL;
        for (j = 0; j < lengths[i]; j++, n++)
            ids[n] = cand[(int64_t)(dt_rng_uniform(43, 0, (uint64_t)n) * (float)n_edges) % n_edges];
    }
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = B; k.lengths = lengths; k.ids = ids;
    memset(&td, 0, sizeof td);
    td.shape[0] = B; td.shape[1] = 1; td.ndim = 2;
    if (dt_tensor_create(&C, &out, &td) || dt_tensor_create(&C, &dout, &td)) exit(2);
    for (i = 0; i < B; i++) ((float *)dout.data)[i] = dt_rng_normal(44, 0, (uint64_t)i);
    if (dt_embed_local_shard(e, &w, &r0, &c0, 0)) exit(2);
    for (j = 0; j < n; j++) before[j] = ((float *)w.data)[ids[j]];
    for (i = 0, j = 0; i < B; i++) /* gsum[j]: the summed gradient of ids[j]'s row */
        for (int64_t l = 0; l < lengths[i]; l++, j++) {
            int64_t m;
            for (m = 0; m < n && ids[m] != ids[j]; m++) {}
            gsum[m] += ((float *)dout.data)[i];
        }
    for (j = 0; j < 3; j++) near_before[j] = ((float *)w.data)[R - 1 - j];
    snprintf(name, sizeof name, "sort_R%lld_step", (long long)R);
    if (dt_embed_forward(e, &out, &k) || dt_embed_backward(e, &dout)) dt_test_fail(name, "%s", dt_ctx_error(&C));
    else {
        for (j = 0; j < n; j++) {
            int64_t m;
            double got, ref, err;
            for (m = 0; m < n && ids[m] != ids[j]; m++) {}
            if (m != j) continue; /* the first occurrence stands for the row */
            distinct++;
            got = ((float *)w.data)[ids[j]];
            ref = (double)before[j] - gsum[j];
            err = fabs(got - ref) / (1.0 + fabs(ref));
            if (err > worst) worst = err;
        }
        snprintf(name, sizeof name, "sort_R%lld_rows_are_w_minus_summed_grad", (long long)R);
        dt_test_close(name, worst, 0.0, 1e-5);
        for (j = 0; j < 3 && R - 1 - j >= 0; j++) { /* rows near the end that no id touched stay */
            int64_t row = R - 1 - j, m, hit = 0;
            for (m = 0; m < n; m++) hit |= ids[m] == row;
            if (hit) continue;
            snprintf(name, sizeof name, "sort_R%lld_untouched_row_%lld_unchanged", (long long)R, (long long)row);
            dt_test_close(name, ((float *)w.data)[row], near_before[j], 0.0);
        }
        dt_embed_stats_get(e, &st);
        snprintf(name, sizeof name, "sort_R%lld_each_distinct_row_updated_once", (long long)R);
        dt_test_close(name, (double)st.rows_updated, (double)distinct, 0.0);
    }
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &dout);
    dt_embed_free(e);
    free(gsum); free(before);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    one_table(3);
    one_table(100000);
    one_table(((int64_t)1 << 25) + 5);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
