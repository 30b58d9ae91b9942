/* tests/test_opt_nommap.c - tests/test_opt.c again with DT_OPT_NO_MMAP: dt_checkpoint_load
   reads each rank file into memory instead of mapping it, the path it also takes when mmap
   fails (some FUSE file systems). Every checkpoint test (resume bitwise, crash safety, corrupt
   and foreign files, resharding of pieces, misaligned conversion) runs on that path too. */
/* A switch of the implementation: this test compiles its own (tests/run.sh builds a test that
   defines DT_IMPLEMENTATION whole, without the shared objects). */
#define DT_OPT_NO_MMAP
#define DT_IMPLEMENTATION
#include "test_opt.c"
