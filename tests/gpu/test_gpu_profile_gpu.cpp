// The per-op GPU profile on a real GPU (CUDA events): the same cases as the emulated test
// (tests/emu/gpu_profile_cases.h), built with -DULYSSES_CUDA=ON.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/gpu_profile_cases.h"
