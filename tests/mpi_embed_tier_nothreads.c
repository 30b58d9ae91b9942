// np: 2
/* tests/mpi_embed_tier_nothreads.c - tests/mpi_embed_tier.c with dt_embed.h built as
   DT_EMBED_NO_THREADS: the prefetch's lookups and copies and the log's folds all run in the
   calling thread. The same checks: bit for bit against the resident tables. */
#define DT_EMBED_NO_THREADS
#define DT_IMPLEMENTATION
#include "mpi_embed_tier.c"
