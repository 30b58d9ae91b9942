// np: 1 2 4
/* tests/mpi_parallel_trace.c - the timeline of dt_parallel.h: every rank records compute spans
   (nested) and the collectives of two attached comms (world and the dp group, through
   dt_comm_set_observer); dt_trace_write leaves one Chrome-trace JSON that dt_json_parse reads
   back, with a process per rank, named tracks, every rank's spans and collectives, clock
   offsets that are small (one host: the ranks share CLOCK_MONOTONIC, so the ping-pong estimate
   must come out near 0) and a barrier whose aligned spans all overlap (no rank leaves before
   the last arrives). dt_trace_overlap: an all-reduce posted inside a 5 ms compute span and
   waited after it is overlapped for about those 5 ms, one outside any span not at all, and the
   overlap is within [0, comm time]. NULL traces are no-ops; bad paths are named. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;

static void spin(double seconds) {
    double end = dt_comm_now() + seconds;
    volatile double x = 0;
    while (dt_comm_now() < end) x += 1;
}

int main(void) {
    dt_comm *world;
    dt_layout *l = NULL;
    dt_trace *t = NULL;
    dt_tensor v;
    dt_tensor_desc td;
    dt_comm_req *req = NULL;
    double comm = -1, over = -1, comm1, over1, comm2, over2;
    char path[512];
    int W, R, ok;
    dt_status st;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);
    dt_layout_create(world, &l, NULL);
    memset(&td, 0, sizeof td);
    td.shape[0] = 1000;
    dt_tensor_create(&C, &v, &td);
    dt_tensor_fill(&C, &v, 1.0);

    st = dt_trace_create(world, &t);
    if (!st) st = dt_trace_attach(t, world);
    if (!st) st = dt_trace_attach(t, l->dp_comm);
    if (!st) st = dt_trace_attach(t, world); /* twice: one track */
    dt_test_check_all("trace_create_and_attach", st == DT_OK, "%.150s", dt_ctx_error(&C));

    /* 1. an all-reduce outside any span: not overlapped */
    st = dt_comm_allreduce(l->dp_comm, &v, DT_REDUCE_SUM);
    dt_trace_overlap(t, &comm1, &over1);
    dt_test_check_all("collective_outside_spans_is_not_overlapped", st == DT_OK && comm1 > 0 && over1 == 0,
                      "comm %g s, overlapped %g s", comm1, over1);
    /* 2. posted inside a 5 ms compute span (with a nested one), waited after it */
    dt_trace_begin(t, "forward");
    st = dt_comm_iallreduce(l->dp_comm, &v, DT_REDUCE_SUM, &req);
    dt_trace_begin(t, "matmul");
    spin(0.005);
    dt_trace_end(t);
    dt_trace_end(t);
    if (!st) st = dt_comm_wait(req);
    dt_trace_overlap(t, &comm2, &over2);
    if (W == 1) /* a collective of one rank completes as it is posted: nothing to overlap */
        dt_test_skip("async_collective_under_5ms_span_overlaps_about_5ms", "needs 2 ranks or more");
    else
        dt_test_check_all("async_collective_under_5ms_span_overlaps_about_5ms", st == DT_OK && over2 - over1 >= 0.004 &&
                          over2 - over1 <= comm2 - comm1, "overlap %g s of %g s", over2 - over1, comm2 - comm1);
    /* 3. a barrier on the world (the alignment check below) and a blocking collective in a span */
    dt_trace_begin(t, "step");
    st = dt_comm_barrier(world);
    dt_trace_end(t);
    dt_trace_overlap(t, &comm, &over);
    dt_test_check_all("overlap_within_zero_and_comm_time", st == DT_OK && over >= 0 && over <= comm && comm >= comm2,
                      "overlap %g s, comm %g s", over, comm);

    /* the file */
    snprintf(path, sizeof path, "%s/trace.json", dt_test_tmpdir());
    st = dt_trace_write(t, path);
    dt_test_check_all("trace_write_succeeds", st == DT_OK, "%.150s", dt_ctx_error(&C));
    if (R == 0) {
        FILE *f = fopen(path, "rb");
        char *text = NULL;
        long len = 0;
        dt_json *j = NULL;
        if (f) {
            fseek(f, 0, SEEK_END);
            len = ftell(f);
            fseek(f, 0, SEEK_SET);
            text = (char *)malloc((size_t)len + 1);
            if (fread(text, 1, (size_t)len, f) != (size_t)len) len = 0;
            fclose(f);
        }
        st = text ? dt_json_parse(&C, &j, text, (size_t)len) : DT_ERR_IO;
        if (DT_TEST_CHECK("trace_file_parses_as_json", st == DT_OK)) {
            const dt_json *ev = dt_json_get(j, "traceEvents"), *other = dt_json_get(j, "otherData");
            const dt_json *offs = other ? dt_json_get(other, "clock_offset_s") : NULL;
            int r, i, has_proc[8] = {0}, has_fwd[8] = {0}, has_comm[8] = {0}, has_names[8] = {0}, bad_x = 0, n_comm_tracks = 0;
            double bar_post_max = -1e30, bar_done_min = 1e30, worst = 0;
            DT_TEST_CHECK("trace_has_trace_events_array", ev && ev->type == DT_JSON_ARRAY);
            for (i = 0; ev && i < ev->count; i++) {
                const dt_json *e = &ev->items[i], *ph = dt_json_get(e, "ph"), *name = dt_json_get(e, "name");
                const dt_json *pid = dt_json_get(e, "pid"), *tid = dt_json_get(e, "tid");
                int64_t p = -1, tt = -1;
                if (!ph || !name || !dt_json_count(pid, &p) || !dt_json_count(tid, &tt) || p >= W) { bad_x++; continue; }
                if (strcmp(ph->string, "M") == 0) {
                    if (strcmp(name->string, "process_name") == 0) has_proc[p] = 1;
                    if (strcmp(name->string, "thread_name") == 0) {
                        has_names[p]++;
                        if (p == 0 && tt > 0) n_comm_tracks++;
                    }
                } else if (strcmp(ph->string, "X") == 0) {
                    const dt_json *ts = dt_json_get(e, "ts"), *dur = dt_json_get(e, "dur");
                    if (!ts || !dur || ts->type != DT_JSON_NUMBER || dur->type != DT_JSON_NUMBER || dur->number < 0) {
                        bad_x++;
                        continue;
                    }
                    if (tt == 0 && strcmp(name->string, "forward") == 0) has_fwd[p] = 1;
                    if (tt > 0 && strcmp(name->string, "allreduce") == 0) has_comm[p] = 1;
                    if (tt > 0 && strcmp(name->string, "barrier") == 0) {
                        if (ts->number > bar_post_max) bar_post_max = ts->number;
                        if (ts->number + dur->number < bar_done_min) bar_done_min = ts->number + dur->number;
                    }
                } else bad_x++;
            }
            for (r = 0, ok = 1; r < W; r++) ok &= has_proc[r] && has_fwd[r] && has_comm[r] && has_names[r] == 3;
            DT_TEST_CHECK("trace_has_every_ranks_process_tracks_spans_and_collectives", ok);
            DT_TEST_CHECK("trace_events_well_formed", bad_x == 0);
            DT_TEST_CHECK("trace_has_one_track_per_attached_comm", n_comm_tracks == 2);
            for (r = 0, ok = offs && offs->type == DT_JSON_ARRAY && offs->count == W; ok && r < W; r++)
                if (fabs(offs->items[r].number) > fabs(worst)) worst = offs->items[r].number;
            printf("clock offsets to rank 0: largest %.3g s; barrier: last post %.1f us, first completion %.1f us\n",
                   worst, bar_post_max, bar_done_min);
            if (ok && fabs(worst) < 0.01) dt_test_pass("clock_offsets_small_on_one_host");
            else dt_test_fail("clock_offsets_small_on_one_host", "largest offset %g s (%d offsets)", worst, ok);
            /* after alignment no rank leaves the barrier before the last one arrived (0.5 ms slack) */
            dt_test_close("aligned_barrier_spans_overlap", bar_post_max > bar_done_min + 500 ? bar_post_max - bar_done_min : 0,
                          0, 0);
        }
        dt_json_free(&C, j);
        free(text);
    }
    /* bad input, and NULL traces */
    st = dt_trace_write(t, "/nonexistent_dir_dt/trace.json");
    {
        char want[64];
        snprintf(want, sizeof want, "%s", R == 0 ? "cannot write" : "rank 0 could not write");
        dt_test_check_all("unwritable_path_is_io_error_on_every_rank", st == DT_ERR_IO && strstr(dt_ctx_error(&C), want),
                          "status %d: %.150s", (int)st, dt_ctx_error(&C));
    }
    st = dt_trace_write(t, NULL);
    if (R == 0) dt_test_error("null_path_is_named", st, dt_ctx_error(&C), "path is NULL");
    st = dt_trace_attach(t, NULL);
    if (R == 0) dt_test_error("attach_null_comm_is_named", st, dt_ctx_error(&C), "c is NULL");
    st = dt_trace_overlap(t, NULL, &over);
    if (R == 0) dt_test_error("overlap_null_out_is_named", st, dt_ctx_error(&C), "comm_seconds is NULL");
    dt_trace_begin(NULL, "x");
    dt_trace_end(NULL);
    dt_trace_end(t); /* more ends than begins: ignored */
    comm = over = 1;
    if (R == 0)
        DT_TEST_CHECK("null_trace_is_a_no_op", dt_trace_attach(NULL, world) == DT_OK && dt_trace_write(NULL, path) == DT_OK &&
                      dt_trace_overlap(NULL, &comm, &over) == DT_OK && comm == 0 && over == 0 &&
                      dt_trace_create(NULL, &t) == DT_ERR_ARG);
    dt_trace_free(t);
    dt_trace_free(NULL);
    /* after the free the comms have no observer: this collective touches no freed memory (ASan) */
    dt_comm_allreduce(world, &v, DT_REDUCE_SUM);
    dt_tensor_free(&C, &v);
    dt_layout_free(l);
    {
        int rc = dt_test_finish();
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
