/* tests/test_embed_inputs.c - several tables looking up one feature's ids (desc.n_inputs,
   features[f].input): the result equals, bit for bit, the same tables fed copies of those ids
   as separate kjt features (n_inputs = 0), forward and after SGD / Adagrad steps, weighted and
   mean-pooled, with empty bags; and the bad descs and kjts are named errors. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;

enum { T = 3, B = 9, STEPS = 3 };

/* tables: "a" (dim 4, SGD, weighted) and "b" (dim 3, Adagrad, mean) both read input 0; "c" (dim 5) reads
   input 1. shared = 1: two kjt inputs; 0: three kjt features (input 0's bags copied for "b"). */
static dt_embed *make(int shared) {
    static const char *names[T] = {"a", "b", "c"};
    dt_embed_table_desc t[T];
    dt_embed_feature_desc f[T];
    dt_embed_desc d;
    dt_embed *e = NULL;
    int i;
    memset(t, 0, sizeof t);
    memset(f, 0, sizeof f);
    for (i = 0; i < T; i++) {
        t[i].name = names[i]; t[i].rows = 20 + 7 * i; t[i].dim = 4 - i + 2 * (i == 2);
        t[i].init.kind = DT_INIT_NORMAL; t[i].init.std = 1; t[i].optim.lr = 0.1;
        t[i].optim.kind = i == 1 ? DT_EMBED_ADAGRAD : DT_EMBED_SGD;
        f[i].name = names[i]; f[i].table = i;
        f[i].input = i == 2 ? 1 : 0;
    }
    t[0].weighted = 1;
    t[1].pooling = DT_POOL_MEAN;
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = T; d.features = f; d.n_features = T; d.seed = 4;
    d.n_inputs = shared ? 2 : 0;
    if (dt_embed_create(&C, &e, &d)) dt_test_fail(shared ? "inputs_create_shared" : "inputs_create_copies", "%s", dt_ctx_error(&C));
    return e;
}

int main(void) {
    dt_embed *es, *ec;
    int64_t len[2 * B], ids[2 * B * 4], len3[3 * B], ids3[3 * B * 4], n0 = 0, n1 = 0, i, j, s, pd;
    float w[2 * B * 4], w3[3 * B * 4];
    dt_kjt ks, kc;
    dt_tensor os, oc, g;
    dt_tensor_desc td;
    dt_ctx_init(&C, NULL);
    es = make(1); ec = make(0);
    if (!es || !ec) return dt_test_finish();
    pd = dt_embed_pooled_dim(es);
    DT_TEST_CHECK("inputs_pooled_dim_is_every_feature_s", pd == 4 + 3 + 4 && dt_embed_pooled_dim(ec) == pd);
    memset(&td, 0, sizeof td);
    td.ndim = 2; td.shape[0] = B; td.shape[1] = pd;
    if (dt_tensor_create(&C, &os, &td) || dt_tensor_create(&C, &oc, &td) || dt_tensor_create(&C, &g, &td)) return 2;
    for (s = 0; s < STEPS; s++) {
        int64_t n = 0, m = 0, f;
        for (f = 0; f < 2; f++) /* bags of 0..3 ids; input 0 feeds "a" and "b", input 1 "c" */
            for (i = 0; i < B; i++) {
                len[f * B + i] = (int64_t)(dt_rng_uniform(61, (uint64_t)s, (uint64_t)(f * B + i)) * 4.0f) % 4;
                for (j = 0; j < len[f * B + i]; j++, n++) {
                    ids[n] = (int64_t)(dt_rng_uniform(62, (uint64_t)s, (uint64_t)n) * 20.0f) % 20;
                    w[n] = dt_rng_normal(63, (uint64_t)s, (uint64_t)n);
                }
            }
        n0 = 0; for (i = 0; i < B; i++) n0 += len[i];
        n1 = n - n0;
        /* the copies: input 0, input 0 again, input 1 */
        for (i = 0; i < B; i++) { len3[i] = len[i]; len3[B + i] = len[i]; len3[2 * B + i] = len[B + i]; }
        memcpy(ids3 + m, ids, sizeof(int64_t) * (size_t)n0); memcpy(w3 + m, w, sizeof(float) * (size_t)n0); m += n0;
        memcpy(ids3 + m, ids, sizeof(int64_t) * (size_t)n0); memcpy(w3 + m, w, sizeof(float) * (size_t)n0); m += n0;
        memcpy(ids3 + m, ids + n0, sizeof(int64_t) * (size_t)n1); memcpy(w3 + m, w + n0, sizeof(float) * (size_t)n1);
        memset(&ks, 0, sizeof ks); memset(&kc, 0, sizeof kc);
        ks.n_features = 2; ks.batch = B; ks.lengths = len; ks.ids = ids; ks.weights = w;
        kc.n_features = 3; kc.batch = B; kc.lengths = len3; kc.ids = ids3; kc.weights = w3;
        for (i = 0; i < B * pd; i++) ((float *)g.data)[i] = dt_rng_normal(64, (uint64_t)s, (uint64_t)i);
        if (dt_embed_forward(es, &os, &ks) || dt_embed_backward(es, &g)) dt_test_fail("inputs_shared_step", "%s", dt_ctx_error(&C));
        if (dt_embed_forward(ec, &oc, &kc) || dt_embed_backward(ec, &g)) dt_test_fail("inputs_copies_step", "%s", dt_ctx_error(&C));
        {
            char name[64];
            snprintf(name, sizeof name, "inputs_shared_lookup_equals_copies_step%lld", (long long)s);
            DT_TEST_CHECK(name, memcmp(os.data, oc.data, sizeof(float) * (size_t)(B * pd)) == 0);
        }
    }
    for (i = 0; i < T; i++) { /* the tables after the updates */
        dt_tensor wa, wb;
        int64_t r0, c0;
        char name[64];
        snprintf(name, sizeof name, "inputs_table_%lld_rows_equal_after_%d_steps", (long long)i, STEPS);
        if (dt_embed_local_shard(es, &wa, &r0, &c0, (int)i) || dt_embed_local_shard(ec, &wb, &r0, &c0, (int)i))
            dt_test_fail(name, "%s", dt_ctx_error(&C));
        else DT_TEST_CHECK(name, dt_tensor_bytes(&wa) == dt_tensor_bytes(&wb) && memcmp(wa.data, wb.data, dt_tensor_bytes(&wa)) == 0);
    }
    { /* a kjt with the features' count, not the inputs' */
        dt_status st = dt_embed_forward(es, &os, &kc);
        dt_test_error("inputs_kjt_must_hold_the_inputs", st, dt_ctx_error(&C), "kjt.n_features = 3; expected 2");
    }
    { /* bad descs */
        dt_embed_table_desc t;
        dt_embed_feature_desc f[2];
        dt_embed_desc d;
        dt_embed *e = NULL;
        dt_status st;
        memset(&t, 0, sizeof t); memset(f, 0, sizeof f); memset(&d, 0, sizeof d);
        t.name = "t"; t.rows = 5; t.dim = 2;
        f[0].name = "x"; f[1].name = "y"; f[1].input = 2;
        d.tables = &t; d.n_tables = 1; d.features = f; d.n_features = 2; d.n_inputs = 2;
        st = dt_embed_create(&C, &e, &d);
        dt_test_error("inputs_feature_input_out_of_range_is_named", st, dt_ctx_error(&C), "features[1].input = 2");
        d.features = NULL; d.n_features = 0;
        st = dt_embed_create(&C, &e, &d);
        dt_test_error("inputs_without_features_is_named", st, dt_ctx_error(&C), "desc.n_inputs = 2");
        d.n_inputs = -1; d.features = f; d.n_features = 2;
        st = dt_embed_create(&C, &e, &d);
        dt_test_error("inputs_negative_is_named", st, dt_ctx_error(&C), "desc.n_inputs = -1");
    }
    dt_tensor_free(&C, &os); dt_tensor_free(&C, &oc); dt_tensor_free(&C, &g);
    dt_embed_free(es); dt_embed_free(ec);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
