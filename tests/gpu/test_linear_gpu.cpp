// The linear layer's CUDA code and op on a real GPU (cuBLASLt GEMMs), compared with the CPU
// backend: the same cases as the emulated test (tests/emu/linear_cuda_cases.h).
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/linear_cuda_cases.h"
