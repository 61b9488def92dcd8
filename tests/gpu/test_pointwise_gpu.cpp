// RMSNorm, GELU, SwiGLU and residual CUDA kernels and ops on a real GPU, compared with the CPU
// backend: the same cases as the emulated test (tests/emu/pointwise_cuda_cases.h), built with -DULYSSES_CUDA=ON.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/pointwise_cuda_cases.h"
