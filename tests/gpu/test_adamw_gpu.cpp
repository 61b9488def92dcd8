// AdamW (fp32 and bf16 with stochastic rounding) and the gradient norm on a real GPU, compared with
// the CPU backend: the same cases as the emulated test (tests/emu/adamw_cuda_cases.h).
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/adamw_cuda_cases.h"
