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

namespace attn_cases {
// Forward and backward with the document ids at the very end of their allocation: the emulator
// puts a guard page right after a buffer whose size is a multiple of 256 bytes (64 ids), so a
// kernel that reads the id of a row at or past T faults (on a GPU it reads a neighbour's memory).
template <class T>
void check_doc_ids_at_buffer_end(const Case& c) {
  INFO((std::is_same<T, float>::value ? "f32" : "bf16") << " T=" << c.Tn << " D=" << c.D);
  const size_t nqkv = size_t(c.B) * c.Tn * (c.Hq + 2 * c.Hkv) * c.D, nout = size_t(c.B) * c.Tn * c.Hq * c.D;
  const std::vector<float> qkv = inputs<T>(nqkv, 31), dout = inputs<T>(nout, 32);
  const std::vector<int32_t> doc = doc_ids(c.B, c.Tn, 33, c.doc);
  REQUIRE(doc.size() % 64 != 0);  // a partial last tile
  const size_t cap = (doc.size() + 63) / 64 * 64;
  DeviceBuffer<int32_t> ids_at_end(cap), ids(doc.size());
  int32_t* d_doc_end = ids_at_end.p + (cap - doc.size());
  cuda_cases::upload(d_doc_end, doc, doc.size());
  ids.set(doc);
  const KernelResult<T> at_end = run_kernels<T>(c, qkv, dout, d_doc_end),
                        inside = run_kernels<T>(c, qkv, dout, ids.p);
  CHECK(same_bits(at_end.out, inside.out));
  CHECK(same_bits(at_end.lse, inside.lse));
  CHECK(same_bits(at_end.dqkv, inside.dqkv));
}
}  // namespace attn_cases

// A tile's rows past T have no document id: the kernels must not read one (the tile-skipping rule
// reduces the ids of a tile's rows below T only).
TEST_CASE("attention CUDA kernels read no document id past T (the ids end at a guard page)", "[emu][attention]") {
  using namespace attn_cases;
  for (const Case& c : {Case{1, 65, 2, 1, 32, Docs::cycling}, Case{1, 150, 2, 1, 16, Docs::packed}}) {
    check_doc_ids_at_buffer_end<float>(c);
    for (int rows : {64, 128}) {
      QueryRows q(rows);
      check_doc_ids_at_buffer_end<__nv_bfloat16>(c);
    }
  }
}
