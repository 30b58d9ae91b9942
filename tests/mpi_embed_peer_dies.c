// mpi-driver
/* tests/mpi_embed_peer_dies.c - a peer that stops in the middle of the embedding id exchange is
   named within about the comm's timeout, not once per request still waiting on it.

   Run directly (not under mpirun), this program is the driver: for np 2 and 3 it starts
       $DT_MPIRUN -np N <this program> worker DIR T
   whose ranks set the world's timeout to T seconds, run one forward + backward of a row-sharded
   weighted table, then call dt_embed_forward_begin; the last rank then stops (SIGSTOP, after
   writing its pid: its posted ids, too large to go eagerly, never move) while the others time
   dt_embed_forward_end. Each of them writes its status, seconds and message to DIR/result_R and
   leaves once all of them have; mpirun then takes the job down and the driver kills the stopped rank if it is left.
   The driver checks that every other rank got DT_ERR_TIMEOUT naming the id exchange and the
   stopped rank within 1.5 T. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

static dt_ctx C;

#define LB 64  /* local samples */
#define BAG 48 /* ids per bag: 3072 ids a rank, most of them to other ranks: past the eager limit */

static int worker(char **argv) {
    dt_comm *world = NULL;
    dt_embed *e = NULL;
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_kjt k;
    dt_tensor out, dout;
    static int64_t len[LB], ids[LB * BAG];
    static float wts[LB * BAG];
    double T = atof(argv[3]), t0, took;
    char path[1200];
    FILE *fp;
    int R, W, i, s;
    dt_status st;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "world: %s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    dt_comm_set_timeout(world, T);
    memset(&t, 0, sizeof t);
    t.name = "big"; t.rows = 1 << 14; t.dim = 4; t.weighted = 1; t.sharding = DT_SHARD_ROW;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = world; d.seed = 3;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "create: %s\n", dt_ctx_error(&C)); return 2; }
    out = dt_test_t2(&C, LB, 4);
    dout = dt_test_t2(&C, LB, 4);
    for (i = 0; i < LB; i++) len[i] = BAG;
    for (i = 0; i < LB * BAG; i++) { ids[i] = (int64_t)(((uint64_t)i * 2654435761u + (uint64_t)R) % (1u << 14)); wts[i] = 1.0f; }
    for (i = 0; i < LB * 4; i++) ((float *)dout.data)[i] = 0.01f;
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = LB; k.lengths = len; k.ids = ids; k.weights = wts;
    for (s = 0; s < 1; s++)
        if (dt_embed_forward(e, &out, &k) || dt_embed_backward(e, &dout)) {
            fprintf(stderr, "[rank %d] step %d: %s\n", R, s, dt_ctx_error(&C));
            return 2;
        }
    if (dt_embed_forward_begin(e, &k)) { fprintf(stderr, "[rank %d] begin: %s\n", R, dt_ctx_error(&C)); return 2; }
    if (R == W - 1) { /* the peer that stops: its ids never leave */
        snprintf(path, sizeof path, "%s/victim_pid", argv[2]);
        if ((fp = fopen(path, "w")) != NULL) { fprintf(fp, "%ld\n", (long)getpid()); fclose(fp); }
        raise(SIGSTOP);
        _exit(0);
    }
    t0 = dt_comm_now();
    st = dt_embed_forward_end(e, &out);
    took = dt_comm_now() - t0;
    snprintf(path, sizeof path, "%s/result_%d", argv[2], R);
    if ((fp = fopen(path, "w")) != NULL) {
        fprintf(fp, "%d %.3f %s\n", (int)st, took, dt_ctx_error(&C));
        fclose(fp);
    }
    for (s = 0; s < 60; s++) { /* the first rank to leave ends the job: wait for the others' results */
        int all = 1;
        for (i = 0; i < W - 1 && all; i++) {
            snprintf(path, sizeof path, "%s/result_%d", argv[2], i);
            if ((fp = fopen(path, "r")) != NULL) fclose(fp);
            else all = 0;
        }
        if (all) break;
        sleep(1);
    }
    _exit(0); /* the comm is abandoned: no clean MPI_Finalize; mpirun ends the job */
}

static void one_case(const char *self, int np, double T) {
    char dir[1024], cmd[4096], path[1200], name[128], line[DT_ERROR_MAX + 64], want[64];
    FILE *fp;
    int r, status;
    snprintf(dir, sizeof dir, "%s/mpi_embed_peer_dies_np%d", dt_test_tmpdir(), np);
    snprintf(name, sizeof name, "embed_exchange_names_a_stopped_peer_within_one_timeout_np%d", np);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) { dt_test_fail(name, "cannot make %s", dir); return; }
    snprintf(cmd, sizeof cmd, "timeout 120 %s -np %d '%s' worker '%s' %g > '%s/worker.log' 2>&1", dt_test_mpirun(), np,
             self, dir, T, dir);
    status = system(cmd);
    (void)status;
    snprintf(path, sizeof path, "%s/victim_pid", dir);
    if ((fp = fopen(path, "r")) != NULL) { /* still stopped if mpirun left it */
        long pid = 0;
        if (fscanf(fp, "%ld", &pid) == 1 && pid > 0) kill((pid_t)pid, SIGKILL);
        fclose(fp);
    }
    snprintf(want, sizeof want, "rank %d", np - 1);
    for (r = 0; r < np - 1; r++) {
        int st = -1;
        double took = -1;
        char *msg;
        snprintf(path, sizeof path, "%s/result_%d", dir, r);
        line[0] = 0;
        if ((fp = fopen(path, "r")) != NULL) {
            if (!fgets(line, sizeof line, fp)) line[0] = 0;
            fclose(fp);
        }
        if (sscanf(line, "%d %lf", &st, &took) != 2) {
            dt_test_fail(name, "rank %d wrote no result (see %s/worker.log)", r, dir);
            return;
        }
        msg = strchr(line, ' ');
        msg = msg ? strchr(msg + 1, ' ') : NULL;
        if (st != DT_ERR_TIMEOUT || took > 1.5 * T || !msg || !strstr(msg, "id exchange") || !strstr(msg, want)) {
            dt_test_fail(name, "rank %d: status %d after %.2f s (timeout %g s, want DT_ERR_TIMEOUT within %.2f s naming "
                         "the id exchange and %s): %.200s", r, st, took, T, 1.5 * T, want, msg ? msg : "");
            return;
        }
    }
    dt_test_pass(name);
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "worker") == 0) return worker(argv);
    one_case(argv[0], 2, 2.0);
    one_case(argv[0], 3, 2.0);
    return dt_test_finish();
}
