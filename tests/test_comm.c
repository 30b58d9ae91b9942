/* tests/test_comm.c - dt_comm.h without DT_MPI: a world of one rank on which every call works,
   bad arguments give named errors, and the bucketer and statistics behave. Started by a
   launcher for several processes (its environment variables set), dt_comm_create_world names
   -DDT_MPI instead; dt_comm_abort exits with its code, stdout flushed. */
#define _POSIX_C_SOURCE 200809L /* setenv, fork, pipe */
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static dt_ctx ctx;

static dt_tensor make(dt_dtype dt, int64_t n) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.shape[0] = n;
    if (dt_tensor_create(&ctx, &t, &d)) memset(&t, 0, sizeof t);
    return t;
}

static void fill(dt_tensor *t, float base) {
    int64_t i;
    for (i = 0; i < t->numel; i++) {
        float v = base + (float)i * 0.25f;
        switch (t->dtype) {
        case DT_F32: ((float *)t->data)[i] = v; break;
        case DT_BF16: ((uint16_t *)t->data)[i] = dt_f32_to_bf16(v); break;
        case DT_F16: ((uint16_t *)t->data)[i] = dt_f32_to_f16(v); break;
        case DT_I32: ((int32_t *)t->data)[i] = (int32_t)(base * 4) + (int32_t)i; break;
        case DT_I64: ((int64_t *)t->data)[i] = (int64_t)(base * 4) + i; break;
        default: break;
        }
    }
}

static void world_of_one_runs_every_collective(dt_comm *w) {
    static const dt_dtype dts[] = {DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64};
    int k, ok = 1;
    char why[700] = "";
    for (k = 0; k < 5; k++) {
        dt_tensor a = make(dts[k], 12), ref = make(dts[k], 12), out = make(dts[k], 12), big = make(dts[k], 24);
        int64_t sc[1] = {12}, rc[1] = {12};
        dt_status st;
        fill(&a, 1.5f);
        fill(&ref, 1.5f);
        st = dt_comm_allreduce(w, &a, DT_REDUCE_SUM);
        if (!st) st = dt_comm_allreduce(w, &a, DT_REDUCE_MAX);
        if (!st && (dts[k] == DT_F32 || dts[k] == DT_BF16 || dts[k] == DT_F16)) st = dt_comm_allreduce(w, &a, DT_REDUCE_AVG);
        if (!st) st = dt_comm_broadcast(w, &a, 0);
        if (!st && memcmp(a.data, ref.data, dt_tensor_bytes(&a)) != 0) { ok = 0; snprintf(why, sizeof why, "%s allreduce changed t", dt_dtype_name(dts[k])); }
        if (!st) st = dt_comm_allgather(w, &out, &a);
        if (!st && memcmp(out.data, ref.data, dt_tensor_bytes(&a)) != 0) { ok = 0; snprintf(why, sizeof why, "%s allgather", dt_dtype_name(dts[k])); }
        memset(out.data, 0, dt_tensor_bytes(&out));
        if (!st) st = dt_comm_reduce_scatter(w, &out, &a, DT_REDUCE_SUM);
        if (!st && memcmp(out.data, ref.data, dt_tensor_bytes(&a)) != 0) { ok = 0; snprintf(why, sizeof why, "%s reduce_scatter", dt_dtype_name(dts[k])); }
        memset(out.data, 0, dt_tensor_bytes(&out));
        if (!st) st = dt_comm_alltoall(w, &out, &a);
        if (!st && memcmp(out.data, ref.data, dt_tensor_bytes(&a)) != 0) { ok = 0; snprintf(why, sizeof why, "%s alltoall", dt_dtype_name(dts[k])); }
        if (!st) st = dt_comm_alltoallv(w, &big, NULL, &a, sc);
        if (!st && memcmp(big.data, ref.data, dt_tensor_bytes(&a)) != 0) { ok = 0; snprintf(why, sizeof why, "%s alltoallv", dt_dtype_name(dts[k])); }
        if (!st) st = dt_comm_alltoallv(w, &big, rc, &a, sc);
        if (!st) st = dt_comm_barrier(w);
        if (st) { ok = 0; snprintf(why, sizeof why, "%s: status %d: %s", dt_dtype_name(dts[k]), st, dt_ctx_error(&ctx)); }
        dt_tensor_free(&ctx, &a); dt_tensor_free(&ctx, &ref); dt_tensor_free(&ctx, &out); dt_tensor_free(&ctx, &big);
    }
    if (ok) dt_test_pass("world_of_one_runs_every_collective");
    else dt_test_fail("world_of_one_runs_every_collective", "%s", why);
}

static void world_of_one_f64_and_p2p(dt_comm *w) {
    double v[3] = {1.5, -2.0, 3.25};
    dt_tensor a = make(DT_F32, 5), b = make(DT_F32, 5), c3 = make(DT_F32, 3);
    dt_status st;
    dt_comm_req *r1 = NULL, *r2 = NULL;
    int done = 0;
    st = dt_comm_allreduce_f64(w, v, 3, DT_REDUCE_AVG);
    DT_TEST_CHECK("allreduce_f64_of_one_rank_is_identity", st == 0 && v[0] == 1.5 && v[1] == -2.0 && v[2] == 3.25);
    fill(&a, 7.0f);
    st = dt_comm_send(w, &a, 0, 3);
    if (!st) st = dt_comm_recv(w, &b, 0, 3);
    DT_TEST_CHECK("send_to_self_then_recv", st == 0 && memcmp(a.data, b.data, dt_tensor_bytes(&a)) == 0);
    st = dt_comm_recv(w, &b, 0, 4);
    dt_test_error("recv_without_send_names_tag", st, dt_ctx_error(&ctx), "tag 4");
    DT_TEST_CHECK("recv_without_send_is_timeout", st == DT_ERR_TIMEOUT);
    dt_comm_send(w, &a, 0, 5);
    st = dt_comm_recv(w, &c3, 0, 5);
    dt_test_error("recv_of_wrong_size_is_named", st, dt_ctx_error(&ctx), "has 5 x f32; t has 3 x f32");
    DT_TEST_CHECK("recv_of_wrong_size_is_comm_error_as_with_mpi", st == DT_ERR_COMM);
    st = dt_comm_recv(w, &a, 0, 5);
    DT_TEST_CHECK("recv_of_wrong_size_consumes_the_message_as_with_mpi", st == DT_ERR_TIMEOUT);
    st = dt_comm_isend(w, &a, 0, 6, &r1);
    if (!st) st = dt_comm_irecv(w, &b, 0, 6, &r2);
    if (!st) st = dt_comm_test(r2, &done);
    if (!st) st = dt_comm_wait(r1);
    if (!st) st = dt_comm_wait(r2);
    DT_TEST_CHECK("isend_irecv_complete", st == 0 && done == 1);
    dt_tensor_free(&ctx, &a); dt_tensor_free(&ctx, &b); dt_tensor_free(&ctx, &c3);
}

static void bad_inputs_are_named(dt_comm *w) {
    dt_tensor f = make(DT_F32, 8), h = make(DT_BF16, 8), s4 = make(DT_F32, 4), i = make(DT_I32, 8);
    int64_t sc[1] = {9}, rc[1] = {3};
    dt_status st;
    st = dt_comm_allreduce(w, NULL, DT_REDUCE_SUM);
    dt_test_error("allreduce_null_tensor_is_named", st, dt_ctx_error(&ctx), "t is NULL");
    st = dt_comm_allreduce(NULL, &f, DT_REDUCE_SUM);
    DT_TEST_CHECK("null_comm_is_arg_error", st == DT_ERR_ARG);
    st = dt_comm_allreduce(w, &i, DT_REDUCE_AVG);
    dt_test_error("avg_on_integers_is_named", st, dt_ctx_error(&ctx), "avg on i32");
    st = dt_comm_allreduce(w, &f, (dt_reduce_op)17);
    dt_test_error("bad_op_is_named", st, dt_ctx_error(&ctx), "op = 17");
    st = dt_comm_allgather(w, &f, &h);
    dt_test_error("mismatched_dtypes_are_named", st, dt_ctx_error(&ctx), "out has dtype f32, in has bf16");
    DT_TEST_CHECK("mismatched_dtypes_is_dtype_error", st == DT_ERR_DTYPE);
    st = dt_comm_allgather(w, &s4, &f);
    dt_test_error("allgather_out_too_small_is_named", st, dt_ctx_error(&ctx), "out has 4 elements; expected size (1) x in (8) = 8");
    st = dt_comm_broadcast(w, &f, 1);
    dt_test_error("root_outside_group_is_named", st, dt_ctx_error(&ctx), "root = 1 is outside group world");
    DT_TEST_CHECK("root_outside_group_is_range_error", st == DT_ERR_RANGE);
    st = dt_comm_send(w, &f, -1, 0);
    dt_test_error("dst_outside_group_is_named", st, dt_ctx_error(&ctx), "dst = -1");
    st = dt_comm_alltoallv(w, &s4, NULL, &f, sc);
    dt_test_error("alltoallv_send_counts_past_in_are_named", st, dt_ctx_error(&ctx), "send_counts[0] = 9; in has only 8");
    sc[0] = 6;
    st = dt_comm_alltoallv(w, &s4, NULL, &f, sc);
    dt_test_error("alltoallv_out_too_small_reports_needed", st, dt_ctx_error(&ctx), "out needs at least 6");
    sc[0] = 2;
    st = dt_comm_alltoallv(w, &s4, rc, &f, sc);
    dt_test_error("alltoallv_wrong_recv_counts_are_named", st, dt_ctx_error(&ctx), "recv_counts[0] = 3, but rank 0 sends 2");
    st = dt_comm_alltoall(w, &f, &f);
    dt_test_error("alltoall_in_place_is_refused", st, dt_ctx_error(&ctx), "overlap");
    st = dt_comm_reduce_scatter(w, &s4, &f, DT_REDUCE_SUM);
    dt_test_error("reduce_scatter_sizes_are_named", st, dt_ctx_error(&ctx), "in has 8 elements; expected size (1) x out (4) = 4");
    DT_TEST_CHECK("comm_still_usable_after_bad_inputs", dt_comm_ok(w) && dt_comm_barrier(w) == 0);
    dt_tensor_free(&ctx, &f); dt_tensor_free(&ctx, &h); dt_tensor_free(&ctx, &s4); dt_tensor_free(&ctx, &i);
}

static void bucketer_of_one_rank(dt_comm *w) {
    dt_params ps;
    dt_bucketer *b = NULL;
    dt_bucketer_desc bd;
    dt_status st = DT_OK;
    int i, ok = 1;
    memset(&ps, 0, sizeof ps);
    for (i = 0; i < 10 && !st; i++) {
        dt_param_desc d;
        char name[16];
        memset(&d, 0, sizeof d);
        snprintf(name, sizeof name, "p%d", i);
        d.name = name;
        d.shape[0] = 100 + 37 * i;
        st = dt_params_add(&ctx, &ps, NULL, &d);
    }
    memset(&bd, 0, sizeof bd);
    bd.bucket_bytes = 2000;
    bd.first_bucket_bytes = 500;
    if (!st) st = dt_bucketer_create(w, &b, &ps, &bd);
    DT_TEST_CHECK("bucketer_makes_several_buckets", st == 0 && dt_bucketer_count(b) > 3);
    for (i = 0; i < ps.count; i++) fill(&ps.items[i]->grad, (float)i);
    for (i = ps.count - 1; i >= 0 && !st; i--) st = dt_bucketer_mark_ready(b, ps.items[i]);
    if (!st) st = dt_bucketer_finish(b);
    for (i = 0; i < ps.count && ok; i++) {
        dt_tensor ref = make(DT_F32, ps.items[i]->grad.numel);
        fill(&ref, (float)i);
        ok = memcmp(ref.data, ps.items[i]->grad.data, dt_tensor_bytes(&ref)) == 0;
        dt_tensor_free(&ctx, &ref);
    }
    DT_TEST_CHECK("bucketer_of_one_rank_keeps_grads", st == 0 && ok);
    if (!st) st = dt_bucketer_mark_ready(b, ps.items[2]);
    st = dt_bucketer_mark_ready(b, ps.items[2]);
    dt_test_error("bucketer_mark_twice_is_named", st, dt_ctx_error(&ctx), "\"p2\" was marked ready twice");
    dt_bucketer_finish(b);
    dt_bucketer_free(b);
    /* grads as views into the buckets: same values, no copies, own memory back at the end */
    bd.grad_views = 1;
    st = dt_bucketer_create(w, &b, &ps, &bd);
    for (i = 0; i < ps.count && !st; i++) fill(&ps.items[i]->grad, (float)i + 0.5f);
    for (i = ps.count - 1; i >= 0 && !st; i--) st = dt_bucketer_mark_ready(b, ps.items[i]);
    if (!st) st = dt_bucketer_finish(b);
    ok = st == 0 && !ps.items[0]->grad.owns;
    dt_bucketer_free(b);
    for (i = 0; i < ps.count && ok; i++) {
        dt_tensor ref = make(DT_F32, ps.items[i]->grad.numel);
        fill(&ref, (float)i + 0.5f);
        ok = ps.items[i]->grad.owns && memcmp(ref.data, ps.items[i]->grad.data, dt_tensor_bytes(&ref)) == 0;
        dt_tensor_free(&ctx, &ref);
    }
    DT_TEST_CHECK("bucketer_grad_views_keep_values_and_give_memory_back", ok);
    dt_params_free(&ctx, &ps);
}

static void stats_count_calls(dt_comm *w) {
    dt_comm_stat s;
    char buf[1024];
    dt_tensor a = make(DT_F32, 256);
    dt_comm_stats_reset(w);
    dt_comm_allreduce(w, &a, DT_REDUCE_SUM);
    dt_comm_allreduce(w, &a, DT_REDUCE_SUM);
    dt_comm_stats(w, &s, DT_COLL_ALLREDUCE);
    DT_TEST_CHECK("stats_count_calls_and_bytes", s.calls == 2 && s.bytes == 2048.0);
    dt_comm_stats_format(w, buf, sizeof buf);
    DT_TEST_CHECK("stats_table_lists_allreduce", strstr(buf, "allreduce") != NULL);
    dt_test_close("bus_factor_allreduce_4", dt_coll_bus_factor(DT_COLL_ALLREDUCE, 4), 1.5, 0);
    dt_test_close("bus_factor_allgather_4", dt_coll_bus_factor(DT_COLL_ALLGATHER, 4), 0.75, 0);
    dt_test_close("bus_factor_broadcast_4", dt_coll_bus_factor(DT_COLL_BROADCAST, 4), 1.0, 0);
    dt_tensor_free(&ctx, &a);
}

typedef struct { int left; } failing;
static void *fail_alloc(size_t n, void *u) { failing *f = (failing *)u; return f->left-- > 0 ? malloc(n) : NULL; }
static void fail_release(void *p, void *u) { (void)u; free(p); }

static void add_params(dt_ctx *c, dt_params *ps, int n, int first) {
    int i;
    for (i = first; i < first + n; i++) {
        dt_param_desc d;
        char name[16];
        memset(&d, 0, sizeof d);
        snprintf(name, sizeof name, "q%d", i);
        d.name = name;
        d.shape[0] = 50 + i;
        dt_params_add(c, ps, NULL, &d);
    }
}

/* Every allocation of dt_bucketer_create failing in turn (grad_views on, the path that moves
   grads into buckets) gives DT_ERR_OOM and leaves nothing allocated, never a crash. */
static void bucketer_create_out_of_memory(void) {
    int k, bad = 0;
    for (k = 0; k < 12; k++) {
        failing f = {1 << 20};
        dt_ctx c2;
        dt_ctx_desc cd;
        dt_comm *w2 = NULL;
        dt_params ps;
        dt_bucketer *b = NULL;
        dt_bucketer_desc bd;
        size_t before;
        dt_status st;
        memset(&cd, 0, sizeof cd);
        cd.allocator.alloc_fn = fail_alloc; cd.allocator.release_fn = fail_release; cd.allocator.user = &f;
        dt_ctx_init(&c2, &cd);
        memset(&ps, 0, sizeof ps);
        dt_comm_create_world(&c2, &w2, NULL);
        add_params(&c2, &ps, 3, 0);
        memset(&bd, 0, sizeof bd);
        bd.grad_views = 1;
        before = c2.bytes_in_use;
        f.left = k;
        st = dt_bucketer_create(w2, &b, &ps, &bd);
        f.left = 1 << 20;
        if (st == DT_OK) dt_bucketer_free(b);
        else if (st != DT_ERR_OOM || c2.bytes_in_use != before) bad++;
        dt_params_free(&c2, &ps);
        dt_comm_free(w2);
        dt_ctx_shutdown(&c2);
    }
    DT_TEST_CHECK("bucketer_create_out_of_memory_is_clean", bad == 0);
}

/* A parameter added after the bucketer was made: mark_ready and finish say so, and finish still
   waits for the buckets already in flight, so the bucketer can be freed without a hang. */
static void bucketer_grown_parameter_set(dt_comm *w) {
    dt_params ps;
    dt_bucketer *b = NULL;
    dt_status st;
    memset(&ps, 0, sizeof ps);
    add_params(&ctx, &ps, 2, 0);
    st = dt_bucketer_create(w, &b, &ps, NULL);
    if (!DT_TEST_CHECK("bucketer_for_grown_set_created", st == 0)) return;
    dt_bucketer_mark_ready(b, ps.items[1]);
    add_params(&ctx, &ps, 1, 2);
    dt_test_error("bucketer_finish_grown_set_is_named", dt_bucketer_finish(b), dt_ctx_error(&ctx), "make a new bucketer");
    dt_test_error("bucketer_mark_ready_grown_set_is_named", dt_bucketer_mark_ready(b, ps.items[0]), dt_ctx_error(&ctx),
                  "the bucketer was made for 2");
    dt_bucketer_free(b);
    dt_params_free(&ctx, &ps);
}

/* On/off fields and setters take 0 or 1: anything else is a named DT_ERR_ARG that changes
   nothing, never a silent "off" (grad_views = 2 used to mean grads copied). */
static void flags_take_0_or_1(dt_comm *w) {
    dt_comm_desc cd;
    dt_comm *w2 = NULL;
    dt_params ps;
    dt_bucketer *b = NULL;
    dt_bucketer_desc bd;
    dt_status st;
    double before = dt_comm_timeout(w);
    memset(&cd, 0, sizeof cd);
    cd.check_mismatch = 2;
    st = dt_comm_create_world(&ctx, &w2, &cd);
    dt_test_error("check_mismatch_2_is_named", st, dt_ctx_error(&ctx), "desc.check_mismatch = 2; expected 0");
    DT_TEST_CHECK("check_mismatch_2_is_arg_error_and_no_world", st == DT_ERR_ARG && w2 == NULL);
    cd.check_mismatch = 0;
    cd.use_nccl = 1;
    st = dt_comm_create_world(&ctx, &w2, &cd);
    dt_test_error("use_nccl_without_nccl_is_named", st, dt_ctx_error(&ctx), "built without DT_NCCL");
    DT_TEST_CHECK("use_nccl_without_nccl_is_device_error", st == DT_ERR_DEVICE && w2 == NULL);
    st = dt_comm_set_check(w, -1);
    dt_test_error("set_check_minus_1_is_named", st, dt_ctx_error(&ctx), "on = -1; expected 0");
    DT_TEST_CHECK("set_check_0_and_1_are_ok", dt_comm_set_check(w, 0) == DT_OK && dt_comm_set_check(w, 1) == DT_OK);
    st = dt_comm_set_timeout(w, (double)NAN);
    dt_test_error("set_timeout_nan_is_named", st, dt_ctx_error(&ctx), "seconds is NaN");
    if (dt_comm_timeout(w) != before)
        dt_test_fail("set_timeout_nan_keeps_the_timeout", "timeout %g s, want %g s", dt_comm_timeout(w), before);
    else dt_test_pass("set_timeout_nan_keeps_the_timeout");
    memset(&ps, 0, sizeof ps);
    memset(&bd, 0, sizeof bd);
    add_params(&ctx, &ps, 2, 0);
    bd.grad_views = 2;
    st = dt_bucketer_create(w, &b, &ps, &bd);
    dt_test_error("grad_views_2_is_named", st, dt_ctx_error(&ctx), "desc.grad_views = 2; expected 0");
    DT_TEST_CHECK("grad_views_2_is_arg_error_and_grads_untouched", st == DT_ERR_ARG && b == NULL && ps.items[0]->grad.owns);
    bd.grad_views = 0;
    st = dt_bucketer_create(w, &b, &ps, &bd);
    if (!st) {
        dt_status s2 = dt_bucketer_set_sync(b, 2);
        dt_test_error("set_sync_2_is_named", s2, dt_ctx_error(&ctx), "sync = 2; expected 1");
        DT_TEST_CHECK("set_sync_0_and_1_are_ok", dt_bucketer_set_sync(b, 0) == DT_OK && dt_bucketer_set_sync(b, 1) == DT_OK);
        dt_bucketer_free(b);
    } else
        dt_test_fail("set_sync_2_is_named", "bucketer_create: status %d: %s", st, dt_ctx_error(&ctx));
    dt_params_free(&ctx, &ps);
}

/* Timeouts must not fire when the wall clock steps (NTP, an admin): dt's clock is the monotonic
   one, counted from boot, not the wall clock's seconds since 1970 (~1.8e9). (dt__cm_now is the
   one clock every timeout and statistic of dt_comm.h reads; this file includes the
   implementation, so it can ask it directly.) */
static void timeouts_use_the_monotonic_clock(void) {
    double dt_now = dt__cm_now(), wall = (double)time(NULL);
    if (fabs(dt_now - wall) > 1e8) dt_test_pass("timeouts_use_the_monotonic_clock_not_the_wall_clock");
    else dt_test_fail("timeouts_use_the_monotonic_clock_not_the_wall_clock", "dt clock %.3f s, wall clock %.0f s: "
                      "want them more than 1e8 s apart (seconds since boot vs since 1970)", dt_now, wall);
}

/* Built without DT_MPI but started by a launcher for several processes, each process would
   train alone in a world of one: dt_comm_create_world refuses, naming -DDT_MPI. A launcher of
   one process, or a value that is no whole number, is not refused. */
static void launcher_without_mpi_is_named(void) {
    static const char *vars[4] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "PMIX_RANK"};
    static const struct { const char *var, *value, *name, *want; } cases[] = {
        {"OMPI_COMM_WORLD_SIZE", "2", "mpirun_np_2_without_dt_mpi_is_named", "OMPI_COMM_WORLD_SIZE = 2"},
        {"PMI_SIZE", "4", "pmi_size_4_without_dt_mpi_is_named", "PMI_SIZE = 4"},
        {"PMIX_RANK", "1", "pmix_rank_1_without_dt_mpi_is_named", "PMIX_RANK = 1"},
        {"OMPI_COMM_WORLD_SIZE", "1", "mpirun_np_1_without_dt_mpi_runs", NULL},
        {"PMIX_RANK", "0", "pmix_rank_0_without_dt_mpi_runs", NULL},
        {"OMPI_COMM_WORLD_SIZE", "2x", "launcher_size_not_a_number_is_ignored", NULL},
        {"PMI_SIZE", "99999999999999999999999", "launcher_size_out_of_range_is_ignored", NULL},
    };
    char *saved[4];
    size_t i;
    for (i = 0; i < 4; i++) { /* the runner itself may run under mpirun -np 1 */
        const char *v = getenv(vars[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(vars[i]);
    }
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_comm *w = (dt_comm *)1;
        dt_status st;
        setenv(cases[i].var, cases[i].value, 1);
        st = dt_comm_create_world(&ctx, &w, NULL);
        if (cases[i].want)
            dt_test_expect(cases[i].name, st == DT_ERR_STATE && w == NULL && strstr(dt_ctx_error(&ctx), "-DDT_MPI") &&
                           strstr(dt_ctx_error(&ctx), cases[i].want), "status %d, message \"%s\", want DT_ERR_STATE "
                           "naming -DDT_MPI and \"%s\"", (int)st, dt_ctx_error(&ctx), cases[i].want);
        else
            dt_test_expect(cases[i].name, st == DT_OK && dt_comm_size(w) == 1, "status %d: %s", (int)st,
                           dt_ctx_error(&ctx));
        if (st == DT_OK) dt_comm_free(w);
        unsetenv(cases[i].var);
    }
    for (i = 0; i < 4; i++)
        if (saved[i]) { setenv(vars[i], saved[i], 1); free(saved[i]); }
}

/* dt_comm_abort without MPI: flushes stdout, exits with the code (in a child process). */
static void abort_exits_with_the_code(dt_comm *w) {
    int k;
    for (k = 0; k < 2; k++) {
        int fd[2], status = 0;
        char out[64];
        size_t got = 0;
        ssize_t n;
        pid_t pid;
        const char *name = k ? "abort_of_world_exits_with_code_and_flushes" : "abort_of_null_exits_with_code_and_flushes";
        fflush(stdout);
        fflush(stderr);
        if (pipe(fd) != 0) { dt_test_fail(name, "pipe failed"); return; }
        pid = fork();
        if (pid == 0) {
            close(fd[0]);
            dup2(fd[1], 1);
            printf("unflushed"); /* no newline: still in the buffer at the abort */
            dt_comm_abort(k ? w : NULL, 7 + k);
            _exit(99); /* not reached */
        }
        close(fd[1]);
        while (pid > 0 && got < sizeof out - 1 && (n = read(fd[0], out + got, sizeof out - 1 - got)) > 0) got += (size_t)n;
        out[got] = 0;
        close(fd[0]);
        if (pid > 0) waitpid(pid, &status, 0);
        dt_test_expect(name, pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 7 + k &&
                       strcmp(out, "unflushed") == 0, "exit status %d (want %d), output \"%s\" (want \"unflushed\")",
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1, 7 + k, out);
    }
}

int main(void) {
    dt_comm *w = NULL, *sub = NULL, *none = (dt_comm *)1;
    dt_comm_desc d;
    dt_status st;
    dt_ctx_init(&ctx, NULL);
    memset(&d, 0, sizeof d);
    d.check_mismatch = 1;
    st = dt_comm_create_world(&ctx, &w, &d);
    if (!DT_TEST_CHECK("init_world_without_mpi", st == 0 && dt_comm_size(w) == 1 && dt_comm_rank(w) == 0 &&
                                                     dt_comm_local_rank(w) == 0))
        return dt_test_finish();
    world_of_one_runs_every_collective(w);
    world_of_one_f64_and_p2p(w);
    bad_inputs_are_named(w);
    bucketer_of_one_rank(w);
    bucketer_create_out_of_memory();
    bucketer_grown_parameter_set(w);
    stats_count_calls(w);
    timeouts_use_the_monotonic_clock();
    flags_take_0_or_1(w);
    abort_exits_with_the_code(w);
    launcher_without_mpi_is_named();
    st = dt_comm_split(w, &sub, 3, 0);
    DT_TEST_CHECK("split_of_one_rank", st == 0 && sub && dt_comm_size(sub) == 1 && strcmp(dt_comm_name(sub), "world.3") == 0);
    st = dt_comm_split(w, &none, -1, 0);
    DT_TEST_CHECK("split_negative_color_gives_null", st == 0 && none == NULL);
    dt_comm_free(sub);
    dt_comm_free(w);
    DT_TEST_CHECK("no_bytes_leak", ctx.bytes_in_use == 0);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
