// Attention's CUDA kernels and op, run by the SIMT emulator and compared with the CPU backend.
// The cases are shared with the real-GPU test (tests/gpu/test_attention_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/attention_cuda_cases.h"
#include "emu/emu_gpu.h"
#include "engine/cuda_runtime.h"

// sm_86, sm_89 and sm_120 let a block opt in to 101376 bytes: the dk/dv pass at head dim 128 runs
// with one stage there (two need 105472), and matches the CPU; two are refused by name.
TEST_CASE("attention CUDA backward on a GPU with 99 KiB of shared memory a block (L40S, RTX 4090)", "[emu][attention]") {
  using namespace attn_cases;
  ul_test::EmuGpu gpu("l40s", "");
  ul::init_cuda_backend();
  CHECK(ul::cuda_smem_optin() == 101376);
  REQUIRE(ul::cuda::attention_dkv_stages() == 0);
  const Case wide{1, 200, 2, 1, 128, Docs::cycling};
  // Against the CPU, at the stages the device holds: one.
  const std::vector<std::string> names = kernels_run([&] { check_kernels<__nv_bfloat16>(wide); });
  CHECK(launched(names, "attention_backward_dkv_mma_1stage"));
  CHECK_FALSE(launched(names, "attention_backward_dkv_mma"));
  DkvStages two(2);
  CHECK_THROWS_WITH(check_kernels<__nv_bfloat16>(wide),
                    Catch::Contains("head dim 128 with 2 stage(s) needs 105472 bytes") &&
                        Catch::Contains("this GPU allows 101376"));
}

