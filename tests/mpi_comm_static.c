// np: 2 3
// with: tests/comm_static_b.c
/* tests/mpi_comm_static.c - two copies of dt in one program (DT_STATIC, two translation units:
   this file's and tests/comm_static_b.c's, as two libraries that each vendor dt would be) share
   one MPI. Each copy creates and frees worlds, interleaved; the copy that frees its last world
   first must not finalize MPI under the other, whose collectives keep working; no free finalizes
   MPI at all, and the copy that initialised MPI finalizes it at exit (else mpirun reports that
   the program exited without MPI_Finalize, and the run fails). Rank 0 lets this file's copy
   initialise MPI, the other ranks the other copy, so both orders run. */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"
#include "comm_static.h"

static dt_ctx actx;
static dt_comm *aw;

static int a_create(void) {
    if (dt_ctx_init(&actx, NULL)) return 1;
    return dt_comm_create_world(&actx, &aw, NULL);
}
static int a_allreduce(double *v, int n) { return dt_comm_allreduce_f64(aw, v, n, DT_REDUCE_SUM); }
static int a_allreduce_tensor(float *v, int n) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = v;
    t.dtype = DT_F32;
    t.device = DT_CPU;
    t.ndim = 1;
    t.shape[0] = t.numel = n;
    return dt_comm_allreduce(aw, &t, DT_REDUCE_SUM);
}
static void a_free(void) {
    dt_comm_free(aw);
    aw = NULL;
    dt_ctx_shutdown(&actx);
}
static const char *a_error(void) { return dt_ctx_error(&actx); }
static const comm_static_copy copy_a = {"a", a_create, a_allreduce, a_allreduce_tensor, a_free, a_error};

static int mpi_live(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

/* A sum over ranks through copy x: a scalar, and 100000 f32 (the chunked path); the rank sum of
   (rank + 1) is N(N+1)/2, computed here by formula. */
static int sums_work(const comm_static_copy *x, int rank, int size, char *why, size_t n) {
    double v = rank + 1, want = size * (size + 1) / 2.0;
    float *big = (float *)malloc(100000 * sizeof(float));
    int i, st = x->allreduce(&v, 1);
    for (i = 0; i < 100000; i++) big[i] = (float)(rank + 1);
    if (!st) st = x->allreduce_tensor(big, 100000);
    if (st || v != want || big[99999] != (float)want)
        snprintf(why, n, "copy %s: status %d, got %g and %g, want %g: %.120s", x->name, st, v, st ? 0.0 : (double)big[99999],
                 want, st ? x->error() : "");
    free(big);
    return !st && v == want && big != NULL;
}

int main(void) {
    int rank, size, ok;
    char why[300] = "";
    const comm_static_copy *first, *second;
    {
        /* the first world of this process initialises MPI: on rank 0 copy a's, elsewhere copy
           b's. Until MPI is up the rank is unknown, so ask the environment mpirun sets. */
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        int r0 = !r || atoi(r) == 0;
        first = r0 ? &copy_a : comm_static_b();
        second = r0 ? comm_static_b() : &copy_a;
    }
    if (first->create()) {
        fprintf(stderr, "copy %s: create_world failed: %s\n", first->name, first->error());
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ok = second->create() == 0;
    if (!ok) snprintf(why, sizeof why, "copy %s: create_world: %.200s", second->name, second->error());
    if (ok) ok = sums_work(first, rank, size, why, sizeof why) && sums_work(second, rank, size, why, sizeof why);
    dt_test_check_all("two_static_copies_share_one_mpi", ok, "%s", why);

    /* the copy that initialised MPI frees its world first: MPI stays up, the other copy works */
    first->free_world();
    ok = mpi_live();
    if (!ok) snprintf(why, sizeof why, "MPI was finalized when copy %s freed its world", first->name);
    if (ok) ok = sums_work(second, rank, size, why, sizeof why);
    dt_test_check_all("first_copy_freeing_its_world_leaves_mpi_to_the_other", ok, "%s", why);

    /* it makes a new world while the other copy's is alive, then the other copy frees its own */
    ok = first->create() == 0;
    if (!ok) snprintf(why, sizeof why, "copy %s: create_world again: %.200s", first->name, first->error());
    second->free_world();
    if (ok) ok = mpi_live() && sums_work(first, rank, size, why, sizeof why);
    if (!ok && !why[0]) snprintf(why, sizeof why, "MPI was finalized when copy %s freed its world", second->name);
    dt_test_check_all("worlds_of_two_copies_created_and_freed_interleaved", ok, "%s", why);

    first->free_world();
    dt_test_check_all("freeing_every_world_leaves_mpi_up_until_exit", mpi_live(), "MPI finalized before exit");
    /* returning finalizes MPI (the copy that initialised it, at exit): mpirun checks that */
    return dt_test_finish();
}
