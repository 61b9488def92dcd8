// RoPE's CUDA kernels and op, run by the SIMT emulator and compared with the CPU backend. The cases
// are shared with the real-GPU test (tests/gpu/test_rope_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/rope_cuda_cases.h"
