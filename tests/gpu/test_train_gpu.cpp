// `train --device cuda` on a real GPU: one rank against `--device cpu` (train_cuda_cases.h) and
// several ranks as threads on the one GPU, their collectives staged through host memory
// (train_ranks_cuda_cases.h): the same cases as the emulated test, built with -DULYSSES_CUDA=ON.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/train_cuda_cases.h"
#include "emu/train_ranks_cuda_cases.h"
