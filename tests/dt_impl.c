/* tests/dt_impl.c - every dt implementation in one translation unit (not a test program).

   tests/run.sh compiles it once per build variant (plain, mpicc -DDT_MPI, each again with
   ASan+UBSan) into build/tests/impl/ and links that object into every test program that does not
   define DT_IMPLEMENTATION itself, so that the five implementations are not compiled again for
   each test. The emulator's tests (tests/cuda_emu/k_*.cpp) link it too, compiled as C++ against
   the fake CUDA headers, with and without DT_CUDA, each also under ThreadSanitizer
   (build/cuda_emu/impl/). The example headers some tests read (examples/dlrm/dlrm_data.h,
   examples/gpt/gpt_data.h) are not here: such a test defines their own
   DT_..._IMPLEMENTATION. */
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_embed.h"
#include "dt_plan.h"
