/* tests/compile/tu.c - one translation unit of the header compile checks.

   tests/run.sh compiles this file many times, as C99 and as C++11, with gcc and clang,
   with and without the implementations, DT_STATIC, DT_MPI and DT_CUDA, and links pairs of
   the objects together. The macros it passes choose what this unit is:

     DT_CT_H1 .. DT_CT_H5   the headers to include, in order, e.g. -DDT_CT_H1='"dt_tensor.h"'
                            (a header comes after the headers it needs)
     DT_CT_MAIN             also define main(), so the object can be linked into a program
     DT_CT_USES             path of a file, written by the runner, listing public functions
                            as DT_CT_USE(name) lines; main() takes the address of each, so
                            the link proves they are declared extern "C" and defined once
     DT_*_IMPLEMENTATION, DT_IMPLEMENTATION, DT_STATIC, DT_CBLAS, DT_MPI, DT_CUDA, DT_NCCL
                            passed straight to the headers
*/
#ifdef DT_CT_H1
#include DT_CT_H1
#endif
#ifdef DT_CT_H2
#include DT_CT_H2
#endif
#ifdef DT_CT_H3
#include DT_CT_H3
#endif
#ifdef DT_CT_H4
#include DT_CT_H4
#endif
#ifdef DT_CT_H5
#include DT_CT_H5
#endif

/* ISO C wants at least one declaration in a unit, and a header may be all macros. */
typedef int dt_ct_nonempty;

#ifdef DT_CT_MAIN
#ifdef DT_CT_USES
/* void (*)(void) is the one function pointer type -Wcast-function-type lets anything cast to. */
typedef void (*dt_ct_fn)(void);
#define DT_CT_USE(name) (dt_ct_fn)&name,
static const dt_ct_fn dt_ct_used[] = {
#include DT_CT_USES
    (dt_ct_fn)0
};
int main(void) {
    int i, n = 0;
    for (i = 0; dt_ct_used[i]; i++) n++;
    return n < 0;
}
#else
int main(void) { return 0; }
#endif
#endif
