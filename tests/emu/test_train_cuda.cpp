// `train --device cuda` end to end on the emulated device: one rank against the CPU
// (train_cuda_cases.h) and several ranks on device buffers (train_ranks_cuda_cases.h), the same
// cases as the GPU test (tests/gpu/test_train_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/train_cuda_cases.h"
#include "emu/train_ranks_cuda_cases.h"
