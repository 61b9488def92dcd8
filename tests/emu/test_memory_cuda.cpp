// Long-context memory on the emulated CUDA device: offload, and the planner against the arena
// (tests/emu/memory_cuda_cases.h).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/memory_cuda_cases.h"
