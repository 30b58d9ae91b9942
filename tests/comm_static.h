/* tests/comm_static.h - how tests/mpi_comm_static.c reaches the two static copies of dt it
   holds (its own, and tests/comm_static_b.c's): one table of entry points per copy. */
#ifndef COMM_STATIC_H
#define COMM_STATIC_H
typedef struct comm_static_copy {
    const char *name;
    int (*create)(void);                         /* dt_ctx_init + dt_comm_create_world */
    int (*allreduce)(double *v, int n);          /* dt_comm_allreduce_f64, sum */
    int (*allreduce_tensor)(float *v, int n);    /* dt_comm_allreduce of n f32, sum */
    void (*free_world)(void);                    /* dt_comm_free + dt_ctx_shutdown */
    const char *(*error)(void);
} comm_static_copy;
const comm_static_copy *comm_static_b(void);
#endif
