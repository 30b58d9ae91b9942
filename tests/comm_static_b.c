/* tests/comm_static_b.c - the second copy of dt in tests/mpi_comm_static.c: a translation unit
   of its own with DT_STATIC, as a library that vendors dt would be. Built with that test (its
   "// with:" line), never on its own. */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "comm_static.h"

static dt_ctx bctx;
static dt_comm *bw;

static int b_create(void) {
    if (dt_ctx_init(&bctx, NULL)) return 1;
    return dt_comm_create_world(&bctx, &bw, NULL);
}
static int b_allreduce(double *v, int n) { return dt_comm_allreduce_f64(bw, v, n, DT_REDUCE_SUM); }
static int b_allreduce_tensor(float *v, int n) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = v;
    t.dtype = DT_F32;
    t.device = DT_CPU;
    t.ndim = 1;
    t.shape[0] = t.numel = n;
    return dt_comm_allreduce(bw, &t, DT_REDUCE_SUM);
}
static void b_free(void) {
    dt_comm_free(bw);
    bw = NULL;
    dt_ctx_shutdown(&bctx);
}
static const char *b_error(void) { return dt_ctx_error(&bctx); }

const comm_static_copy *comm_static_b(void) {
    static const comm_static_copy ops = {"b", b_create, b_allreduce, b_allreduce_tensor, b_free, b_error};
    return &ops;
}
