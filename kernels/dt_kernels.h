/* kernels/dt_kernels.h - the C ABI of dt's CUDA kernels (kernels/*.cu). No CUDA types: the dt
   headers call these under DT_CUDA, and a user builds them with
       nvcc -O2 -c kernels/*.cu            (then links the objects with -lcudart -lcublas)
   Every launcher has the name stem of the CPU op it mirrors (dt_layernorm_fwd -> dt_k_layernorm_fwd),
   takes device pointers, sizes and the stream (a cudaStream_t passed as void *, NULL = the default
   stream) last, and returns 0 or the cudaError_t of the failing launch (dt_k_error_string names it).
   Gradients accumulate (+=), as in dt_tensor.h.                       MIT licence (see dt_tensor.h) */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The message of a status these functions return ("cudaErrorInvalidValue: invalid argument"). */
const char *dt_k_error_string(int status);

/* ---------------------------------------------------------------- elementwise and casts */

/* ---------------------------------------------------------------- reductions and layernorm */

/* ---------------------------------------------------------------- softmax and cross entropy */

/* ---------------------------------------------------------------- attention */

/* ---------------------------------------------------------------- embedding */

/* ---------------------------------------------------------------- optimizer */

/* ---------------------------------------------------------------- comm packing */

#ifdef __cplusplus
}
#endif
#endif /* DT_KERNELS_H */
