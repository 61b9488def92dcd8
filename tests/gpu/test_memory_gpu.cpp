// Long-context memory on a real GPU: --offload with real asynchronous copies on the side stream,
// bitwise against --recompute alone, and the planner against the arena (tests/emu/memory_cuda_cases.h).
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/memory_cuda_cases.h"
