/* Which instruction set the kernels use: AVX2 (+FMA, F16C) where the CPU has it, else portable C.
 * Checked once at run time, so one binary serves every x86-64 machine. */
#include "kernels.h"

static int force_portable = 0;

int wb_use_avx2(void) {
#if WB_HAVE_X86_AVX2
    static int cached = -1;
    if (force_portable) return 0;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return cached;
#else
    return 0;
#endif
}

const char *wb_isa(void) { return wb_use_avx2() ? "avx2" : "portable"; }

void wb_force_portable(int flag) { force_portable = flag; }
