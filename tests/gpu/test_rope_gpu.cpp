// RoPE's CUDA kernels and op on a real GPU, compared with the CPU backend: the same cases as the
// emulated test (tests/emu/rope_cuda_cases.h), built with -DULYSSES_CUDA=ON.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/rope_cuda_cases.h"
