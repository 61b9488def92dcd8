// parallel/comm_nccl.cpp as it builds against an NCCL older than 2.28, which has no ncclAlltoAll:
// its all_to_all is then grouped send/recv. Compiled here a second time, beside the library's own
// copy, with its two entry points renamed (tests/emu/test_nccl_emu.cpp declares them).
#define ULYSSES_EMU_NCCL_VERSION_CODE 22703
#define nccl_world_from nccl_world_from_pre_2_28
#define nccl_world_from_file nccl_world_from_file_pre_2_28
#include "parallel/comm_nccl.cpp"

static_assert(NCCL_VERSION_CODE < 22800, "this copy must take comm_nccl's send/recv branch");
