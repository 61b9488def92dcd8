// AdamW (fp32 and bf16 with stochastic rounding) and the gradient norm on CUDA, run by the SIMT
// emulator and compared with the CPU backend. The cases are shared with the real-GPU test
// (tests/gpu/test_adamw_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/adamw_cuda_cases.h"
