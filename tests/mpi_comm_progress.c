// np: 2 3
/* tests/mpi_comm_progress.c - the progress thread (dt_comm_desc.progress_us): the first world
   asks for it, so dt initialises MPI with MPI_THREAD_MULTIPLE; collectives posted before a
   stretch of compute and waited after give the sums computed here, bitwise (the thread only
   drives MPI's progress engine: dt's arithmetic and order are unchanged); the thread ends with
   its world; a later world without it works; a second world asking for it after MPI is up
   with a lower level is named, and so are bad values. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"

static dt_ctx ctx;

static float val(int r, int64_t i) { return dt_rng_normal(77, (uint64_t)r, (uint64_t)i); }

/* posts an all-reduce of n floats, computes for a while, waits; compares with rank order */
static int overlap_round(dt_comm *w, int64_t n, char *why, size_t size) {
    dt_tensor t;
    dt_tensor_desc d;
    dt_comm_req *q = NULL;
    int r, R = dt_comm_rank(w), N = dt_comm_size(w), ok = 1;
    int64_t i;
    volatile double sink = 0;
    memset(&d, 0, sizeof d);
    d.shape[0] = n;
    if (dt_tensor_create(&ctx, &t, &d)) return 0;
    for (i = 0; i < n; i++) ((float *)t.data)[i] = val(R, i);
    if (dt_comm_iallreduce(w, &t, DT_REDUCE_SUM, &q)) ok = 0;
    for (i = 0; i < 20000000; i++) sink += (double)i * 1e-9; /* compute while the thread drives MPI */
    if (ok && dt_comm_wait(q)) ok = 0;
    if (!ok) snprintf(why, size, "%s", dt_ctx_error(&ctx));
    for (i = 0; i < n && ok; i++) {
        float a = val(0, i);
        for (r = 1; r < N; r++) a = a + val(r, i);
        if (memcmp(&a, (float *)t.data + i, sizeof a) != 0) {
            snprintf(why, size, "element %lld: %.9g, want %.9g", (long long)i, ((float *)t.data)[i], a);
            ok = 0;
        }
    }
    dt_tensor_free(&ctx, &t);
    return ok;
}

int main(void) {
    dt_comm_desc d;
    dt_comm *w = NULL, *w2 = NULL;
    dt_status st;
    int level = 0, ok;
    char why[200] = "";
    dt_ctx_init(&ctx, NULL);
    memset(&d, 0, sizeof d);
    d.progress_us = 100;
    st = dt_comm_create_world(&ctx, &w, &d);
    if (st) {
        fprintf(stderr, "dt_comm_create_world: %s\n", dt_ctx_error(&ctx));
        return 1;
    }
    d.progress_us = -1;
    st = dt_comm_create_world(&ctx, &w2, &d);
    ok = st == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "progress_us = -1");
    dt_test_check_all("negative_progress_us_is_named", ok, "status %d: %s", st, dt_ctx_error(&ctx));
    d.progress_us = 2000000;
    st = dt_comm_create_world(&ctx, &w2, &d);
    ok = st == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "progress_us = 2000000");
    dt_test_check_all("progress_us_above_a_second_is_named", ok, "status %d: %s", st, dt_ctx_error(&ctx));
    d.progress_us = 100;
    MPI_Query_thread(&level);
    dt_test_check_all("mpi_initialised_with_thread_multiple", level == MPI_THREAD_MULTIPLE, "level %d", level);
    ok = overlap_round(w, 300007, why, sizeof why) && overlap_round(w, 1000, why, sizeof why);
    dt_test_check_all("allreduce_beside_the_progress_thread_is_bitwise_rank_order", ok, "%s", why);
    /* a second world asking for a thread while the first lives: MPI is up, at MULTIPLE: fine */
    st = dt_comm_create_world(&ctx, &w2, &d);
    ok = !st && overlap_round(w2, 5000, why, sizeof why);
    dt_test_check_all("a_second_world_with_its_own_thread_works", ok, "status %d: %s", st, st ? dt_ctx_error(&ctx) : why);
    dt_comm_free(w2);
    dt_comm_free(w); /* joins the thread: a hang here is a failure of the run */
    d.progress_us = 0;
    st = dt_comm_create_world(&ctx, &w, &d);
    ok = !st && overlap_round(w, 70001, why, sizeof why);
    dt_test_check_all("a_world_without_the_thread_after_it_works", ok, "status %d: %s", st, st ? dt_ctx_error(&ctx) : why);
    dt_comm_free(w);
    dt_test_check_all("every_byte_comes_back", ctx.bytes_in_use == 0, "%lld bytes still held", (long long)ctx.bytes_in_use);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
