// mpi-driver
/* tests/mpi_comm_abort.c - dt_comm_abort ends every rank of a job at once with the code given.

   Run directly (not under mpirun), this program is the driver: it starts
       $DT_MPIRUN -np 2 <this program> worker
   whose rank 1 meets an error only it sees, prints a line without a newline and calls
   dt_comm_abort(world, 3), while rank 0 waits in a barrier whose timeout is 10 minutes. The
   job must end within seconds (not at rank 0's timeout) with exit status 3, and rank 1's line
   must have been flushed.
   Then `worker-timeout`: rank 0's barrier times out after 0.5 s (rank 1 is busy for 1 s) and
   rank 0 calls dt_comm_abort(world, 4) at once; the abort waits out its grace after a timeout,
   so rank 1, reaching the barrier later, still writes its own report before the job ends with
   status 4. Without the grace MPI_Abort ended rank 1 before it could say anything. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"

#include <sys/wait.h>
#include <time.h>

static int worker(void) {
    dt_ctx ctx;
    dt_comm *world;
    dt_comm_desc d;
    dt_ctx_init(&ctx, NULL);
    memset(&d, 0, sizeof d);
    d.timeout_s = 600;
    if (dt_comm_create_world(&ctx, &world, &d)) { fprintf(stderr, "%s\n", dt_ctx_error(&ctx)); return 2; }
    if (dt_comm_rank(world) == 1) {
        printf("rank 1 cannot go on"); /* no newline: dt_comm_abort flushes it */
        dt_comm_abort(world, 3);
    }
    dt_comm_barrier(world); /* rank 0: waits for rank 1, which never comes */
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return 0;
}

static int worker_timeout(void) {
    dt_ctx ctx;
    dt_comm *world;
    dt_comm_desc d;
    dt_status st;
    dt_ctx_init(&ctx, NULL);
    memset(&d, 0, sizeof d);
    d.timeout_s = 0.5;
    if (dt_comm_create_world(&ctx, &world, &d)) { fprintf(stderr, "%s\n", dt_ctx_error(&ctx)); return 2; }
    if (dt_comm_rank(world) == 1) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL); /* busy elsewhere */
    }
    st = dt_comm_barrier(world);
    printf("rank %d: status %d: %s\n", dt_comm_rank(world), (int)st, st ? dt_ctx_error(&ctx) : "ok");
    if (st) dt_comm_abort(world, 4);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    char cmd[4096], log[512], text[4096];
    const char *tmp;
    double t0, took;
    int status, code;
    size_t n = 0;
    FILE *fp;
    if (argc == 2 && strcmp(argv[1], "worker") == 0) return worker();
    if (argc == 2 && strcmp(argv[1], "worker-timeout") == 0) return worker_timeout();
    tmp = dt_test_tmpdir();
    snprintf(log, sizeof log, "%s/abort.log", tmp);
    /* timeout: a job that does not end is this check's failure, not a hang of the whole run */
    snprintf(cmd, sizeof cmd, "timeout 120 %s -np 2 '%s' worker > '%s' 2>&1 < /dev/null", dt_test_mpirun(), argv[0], log);
    t0 = now();
    status = system(cmd);
    took = now() - t0;
    code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    text[0] = 0;
    if ((fp = fopen(log, "r")) != NULL) {
        n = fread(text, 1, sizeof text - 1, fp);
        text[n] = 0;
        fclose(fp);
    }
    dt_test_expect("abort_ends_every_rank_with_the_code", code == 3, "exit status %d, want 3; output: %.600s", code, text);
    dt_test_expect("abort_ends_the_job_promptly", took < 30.0, "took %.1f s (rank 0 waits 600 s on its own)", took);
    dt_test_expect("abort_flushes_stdout", strstr(text, "rank 1 cannot go on") != NULL, "output: %.600s", text);

    snprintf(cmd, sizeof cmd, "timeout 120 %s -np 2 '%s' worker-timeout > '%s' 2>&1 < /dev/null", dt_test_mpirun(), argv[0],
             log);
    status = system(cmd);
    code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    text[0] = 0;
    if ((fp = fopen(log, "r")) != NULL) {
        n = fread(text, 1, sizeof text - 1, fp);
        text[n] = 0;
        fclose(fp);
    }
    dt_test_expect("abort_after_a_timeout_lets_the_others_report_first",
                   code == 4 && strstr(text, "rank 0: status") && strstr(text, "rank 1: status"),
                   "exit status %d (want 4), both ranks' reports wanted; output: %.900s", code, text);
    return dt_test_finish();
}
