// The fused classifier's CUDA kernels and op on a real GPU, compared with the CPU backend: the
// same cases as the emulated test (tests/emu/classifier_cuda_cases.h).
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/classifier_cuda_cases.h"
