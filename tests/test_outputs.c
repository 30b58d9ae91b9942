/* tests/test_outputs.c - every public function with an output pointer writes it on every
   path, errors included (a zero, NULL or empty value), so that a caller who reads the output
   after an unchecked status reads a defined value, and gcc -O2 -Wall (-Wmaybe-uninitialized)
   finds no path that leaves a caller's local unset. This file is itself that caller: the
   functions at the top read outputs of calls whose status they ignore, and compiled with the
   implementation in the same unit at -O2 -Wall -Werror (the test build's flags) they must not
   warn. The checks below call each function on an error path with the outputs poisoned. */
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_embed.h"
#include "dt_test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic error "-Wmaybe-uninitialized"
#endif

static dt_ctx C;

/* ---- user code: the status is ignored, the output read (what must not warn) */

float user_seed(dt_optimizer *o, int micro) {
    float dloss;
    dt_opt_micro_begin(o, &dloss, NULL, micro);
    return dloss;
}
float user_zero_seed(dt_zero *z, int micro) {
    float dloss;
    dt_zero_micro_begin(z, &dloss, micro);
    return dloss;
}
long long user_shard(dt_embed *e, int table) {
    dt_tensor v;
    int64_t r0, c0;
    dt_embed_local_shard(e, &v, &r0, &c0, table);
    return (long long)(r0 + c0 + v.numel);
}
long long user_batch(const dt_layout *l, int64_t gb) {
    int64_t first, count;
    dt_layout_batch_range(l, gb, &first, &count);
    return (long long)(first + count);
}
double user_norm(dt_optimizer *o) {
    dt_opt_step_info info;
    dt_opt_step(o, &info);
    return info.grad_norm;
}
int user_owner(const dt_embed *e, int table) {
    int owner;
    dt_embed_table_sharding(e, table, &owner);
    return owner;
}

/* ---- the error paths, outputs poisoned */

#define POISON ((void *)16)

static void scalars_written_on_errors(void) {
    float f = 123.0f, f2 = 123.0f;
    int64_t a = 123, b = 123, r0 = 123, c0 = 123;
    int owner = 123;
    double d = 123.0, d2 = 123.0;
    uint64_t u = 123, u2 = 123;
    dt_opt_step_info info;
    dt_zero_memory zm;
    dt_embed_stats es;
    dt_comm_stat cs;
    dt_tensor v;
    unsigned char first8[8] = {0};
    dt_optimizer *o = NULL;
    dt_params ps;
    dt_param *p;
    dt_param_desc pd;
    dt_opt_desc od;

    dt_opt_micro_begin(NULL, &f, NULL, 0);
    DT_TEST_CHECK("opt_micro_begin_null_writes_dloss", f == 0.0f);
    memset(&ps, 0, sizeof ps);
    memset(&pd, 0, sizeof pd);
    pd.name = "w"; pd.shape[0] = 4;
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_SGD; od.lr = 0.1;
    if (dt_params_add(&C, &ps, &p, &pd) || dt_opt_create(&C, &o, &ps, &od)) {
        dt_test_fail("opt_setup", "%s", dt_ctx_error(&C));
        return;
    }
    f = 123.0f;
    dt_test_expect("opt_micro_begin_bad_micro_writes_dloss", dt_opt_micro_begin(o, &f, NULL, 5) == DT_ERR_RANGE &&
                   f == 0.0f, "dloss %g", (double)f);
    f = 123.0f;
    dt_test_expect("opt_micro_begin_ok_still_gives_the_seed", dt_opt_micro_begin(o, &f, NULL, 0) == DT_OK && f == 1.0f,
                   "dloss %g", (double)f);
    dt_opt_free(o);
    dt_params_free(&C, &ps);

    memset(&info, 0x7f, sizeof info);
    dt_opt_step(NULL, &info);
    DT_TEST_CHECK("opt_step_null_writes_info", info.grad_norm == 0);
    f = 123.0f;
    dt_zero_micro_begin(NULL, &f, 0);
    DT_TEST_CHECK("zero_micro_begin_null_writes_dloss", f == 0.0f);
    memset(&info, 0x7f, sizeof info);
    dt_zero_step(NULL, &info);
    DT_TEST_CHECK("zero_step_null_writes_info", info.grad_norm == 0);
    memset(&zm, 0x7f, sizeof zm);
    dt_zero_memory_get(NULL, &zm);
    DT_TEST_CHECK("zero_memory_get_null_writes_out", zm.total_bytes == 0 && zm.formula == NULL);
    dt_layout_batch_range(NULL, 8, &a, &b);
    DT_TEST_CHECK("layout_batch_range_null_writes_first_and_count", a == 0 && b == 0);
    f = 123.0f; a = 123;
    dt_tp_xent_fwd(NULL, &f, &a, NULL, NULL, NULL, 0, 0, -1);
    DT_TEST_CHECK("tp_xent_fwd_null_writes_loss_and_n_valid", f == 0.0f && a == 0);

    memset(&v, 0x7f, sizeof v);
    dt_embed_local_shard(NULL, &v, &r0, &c0, 0);
    DT_TEST_CHECK("embed_local_shard_null_writes_every_output", v.data == NULL && v.numel == 0 && r0 == 0 && c0 == 0);
    memset(&es, 0x7f, sizeof es);
    dt_embed_stats_get(NULL, &es);
    DT_TEST_CHECK("embed_stats_get_null_writes_out", es.forwards == 0 && es.ids == 0);
    dt_embed_table_sharding(NULL, 0, &owner);
    DT_TEST_CHECK("embed_table_sharding_null_writes_owner", owner == -1);

    memset(&cs, 0x7f, sizeof cs);
    dt_comm_stats(NULL, &cs, DT_COLL_ALLREDUCE);
    DT_TEST_CHECK("comm_stats_null_writes_out", cs.calls == 0);

    f = 123.0f; a = 123;
    dt_softmax_xent_fwd(NULL, &f, &a, NULL, NULL, NULL, -1);
    DT_TEST_CHECK("softmax_xent_fwd_null_writes_loss_and_n_valid", f == 0.0f && a == 0);
    f2 = 123.0f;
    dt_bce_logits_fwd(NULL, &f2, NULL, NULL);
    DT_TEST_CHECK("bce_logits_fwd_null_writes_loss", f2 == 0.0f);
    dt_sum(NULL, &d, NULL);
    dt_sumsq(NULL, &d2, NULL);
    DT_TEST_CHECK("sum_and_sumsq_null_write_out", d == 0 && d2 == 0);
    dt_safetensors_header_len(NULL, &u, first8, 0, NULL);
    dt_safetensors_prefix(NULL, NULL, &u2, NULL, NULL, 0, NULL, 0);
    DT_TEST_CHECK("safetensors_lengths_null_write_out", u == 0 && u2 == 0);
    memset(&v, 0x7f, sizeof v);
    dt_tensor_create(NULL, &v, NULL);
    DT_TEST_CHECK("tensor_create_null_ctx_writes_t", v.data == NULL && v.numel == 0);
}

static void constructors_write_null_on_errors(void) {
    dt_comm *w = (dt_comm *)POISON, *s = (dt_comm *)POISON;
    dt_bucketer *b = (dt_bucketer *)POISON;
    dt_optimizer *o = (dt_optimizer *)POISON;
    dt_layout *l = (dt_layout *)POISON;
    dt_arena *a = (dt_arena *)POISON;
    dt_zero *z = (dt_zero *)POISON;
    dt_trace *t = (dt_trace *)POISON;
    dt_embed *e = (dt_embed *)POISON;
    dt_json *j = (dt_json *)POISON;
    dt_param *p = (dt_param *)POISON;
    dt_params ps;
    memset(&ps, 0, sizeof ps);
    dt_comm_create_world(NULL, &w, NULL);
    dt_comm_split(NULL, &s, 0, 0);
    dt_bucketer_create(NULL, &b, NULL, NULL);
    dt_opt_create(NULL, &o, NULL, NULL);
    dt_layout_create(NULL, &l, NULL);
    dt_arena_create(NULL, &a, NULL, NULL);
    dt_zero_create(NULL, &z, NULL, NULL);
    dt_trace_create(NULL, &t);
    dt_embed_create(NULL, &e, NULL);
    dt_json_parse(NULL, &j, "1", 1);
    dt_params_add(NULL, &ps, &p, NULL);
    dt_test_expect("constructors_with_a_null_first_argument_write_null", !w && !s && !b && !o && !l && !a && !z && !t &&
                   !e && !j && !p, "world %p split %p bucketer %p opt %p layout %p arena %p zero %p trace %p embed %p "
                   "json %p param %p", (void *)w, (void *)s, (void *)b, (void *)o, (void *)l, (void *)a, (void *)z,
                   (void *)t, (void *)e, (void *)j, (void *)p);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    scalars_written_on_errors();
    constructors_write_null_on_errors();
    (void)user_seed; (void)user_zero_seed; (void)user_shard; (void)user_batch; (void)user_norm; (void)user_owner;
    DT_TEST_CHECK("no_bytes_leak", C.bytes_in_use == 0);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
