// RMSNorm, GELU, SwiGLU and residual CUDA kernels and ops, run by the SIMT emulator and compared with
// the CPU backend. The cases are shared with the real-GPU test (tests/gpu/test_pointwise_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/pointwise_cuda_cases.h"
