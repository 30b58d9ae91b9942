/* tests/test_embed_static.c - tests/test_embed.c again, built with DT_STATIC: every dt function
   static, and dynamic tables on dt_embed.h's private id map instead of stb_ds (which has no
   static mode). */
#define DT_STATIC
#define DT_IMPLEMENTATION /* its own static copy: built whole, without the shared objects */
#include "test_embed.c"
