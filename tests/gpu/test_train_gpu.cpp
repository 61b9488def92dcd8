// `train --device cuda` on a real GPU against `--device cpu`: the same cases as the emulated test
// (tests/emu/train_cuda_cases.h), built with -DULYSSES_CUDA=ON. One rank per case: the local
// communicator moves host memory, so multi-rank runs on real device memory belong to NCCL.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/train_cuda_cases.h"
