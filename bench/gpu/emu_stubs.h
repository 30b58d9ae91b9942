/* bench/gpu/emu_stubs.h - the emulator's test controls, for the emulated kernel tests
   (tests/cuda_emu/k_*.cpp) built against the REAL CUDA runtime by bench/gpu/run.sh, which
   force-includes this header (-include) and links bench/gpu/emu_stubs.c.

   On the emulator these come from tests/cuda_emu/include/cuda_runtime.h ("emulator controls");
   the real <cuda_runtime.h> has none of them, so without this file a test that asks for its thread
   order or for the runtime's own counts would not compile on a GPU machine. What they answer
   there, and why:
     dt_emu_mode()          "gpu": there is one order, the hardware's (a test that prints its mode
                            in a check name says where it ran)
     dt_emu_streams_mode()  "gpu"
     dt_emu_report_count()  0 and dt_emu_last_report() "": nothing watches the kernels (a test that
                            expects a planted bug to be reported fails, as it should: k_detect.cpp,
                            which checks the emulator itself, is not built for the GPU at all)
     dt_emu_set_mode()      a no-op returning 0: a "same bits in every order" check reruns in the
                            hardware's order, which still checks run-to-run determinism
     dt_emu_vector_accesses()  -1: which path a launch took is not observable on a GPU
     dt_emu_lt_count()      -1: which cuBLASLt epilogue ran is not observable either
     dt_emu_get_counters()  every count -1: the real runtime does not count for us, so a check
                            that compares dt's ctx->counters with the runtime's own cannot pass by
                            accident; such a test can say `#ifdef DT_EMU_STUBS` and skip it.
   DT_EMU_STUBS is defined for that. */
#ifndef DT_EMU_STUBS_H
#define DT_EMU_STUBS_H
#define DT_EMU_STUBS 1

#ifdef __cplusplus
/* what the emulator's <cuda_runtime.h> brings in besides C's headers (libstdc++'s <functional>
   pulls <vector> in too): a test that compiles against it compiles here */
#include <functional>
extern "C" {
#endif

typedef struct dt_emu_counters {
    long long syncs, allocs, frees, h2d_bytes, h2d_calls, d2h_bytes, d2h_calls;
} dt_emu_counters;

const char *dt_emu_mode(void);
const char *dt_emu_streams_mode(void);
int dt_emu_report_count(void);
const char *dt_emu_last_report(void);
void dt_emu_get_counters(dt_emu_counters *c);
int dt_emu_set_mode(const char *mode);     /* 0, a no-op: the hardware has one order */
long long dt_emu_vector_accesses(void);    /* -1: not observable (a test checks DT_EMU_STUBS) */
long dt_emu_lt_count(int index);           /* -1: not observable */
void dt_emu_lt_refuse(unsigned mask);      /* a no-op: a GPU's heuristic answers for itself */

#ifdef __cplusplus
}
#endif
#endif /* DT_EMU_STUBS_H */
