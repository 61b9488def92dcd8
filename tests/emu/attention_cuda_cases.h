// Attention: the CUDA kernels and the op on Device::cuda against the CPU backend. Written only
// against the CUDA runtime API and the engine, so the same cases run emulated (tests/emu, in CI)
// and on a real GPU (tests/gpu); the including file picks the Catch2 tag.
//   - out and lse are poisoned (NaN) before the forward, so an element it fails to write fails;
//   - dqkv starts from random values, so a backward that overwrites instead of adding fails, and
//     the backward runs twice to show it is bitwise deterministic;
//   - T from 1 to 330: below, at and across the 64-row tiles, one T exactly two of them, up to five
//     tiles (so both cp.async stages are reused); MHA, GQA (Hq = 2 Hkv) and MQA (Hkv = 1); without
//     a document mask, with non-monotonic ids (a query sees an earlier stretch of its document
//     across another one), and with packed documents (tile pairs the kernels skip, checked to
//     occur); D 16, 32, 64, 128;
//   - f32 is held to 1e-5 relative of the element plus 1e-5 of the tensor's largest gradient or
//     output (a weighted mean's rounding follows the size of what it averages: an output that
//     cancels to 0.08 of values near 1 was 2e-6 off the CPU's on an AVX2-only CPU, in a different
//     summation order than AVX-512's); bf16 (see kBf16Rel) to 2^-7 relative of the element plus 2^-7
//     of the tensor's largest gradient or output: the kernels round P and dS to bf16 for the
//     tensor cores (2^-9 each) and the results to bf16 (2^-9), on bf16-rounded inputs.
// Emulated kernels run a fiber switch per barrier and two per tensor-core call, so the shapes are small.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/context.h"
#include "engine/cuda_launch.h"
#include "cuda_cases_util.h"
#include "engine/device.h"
#include "engine/gpu_profile.h"
#include "gradcheck.h"
#include "layers/attention.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including attention_cuda_cases.h"
#endif

namespace attn_cases {

// Document ids: none; stretches cycling through 3 ids (every tile holds all of them); packed
// documents of 40 to 150 tokens with rising ids (tile pairs that share no document, which the CUDA
// kernels skip, and pairs inside one document, which they do not mask); or whole tiles whose
// document returns: tiles 0, 3, 4, 7, ... hold id 0, the others an id of their own, so the second
// half of a 128-row query block shares a document with key tiles that its first half does not.
enum class Docs { none, cycling, packed, returning };

struct Case {
  int B, Tn, Hq, Hkv, D;
  Docs doc;
  int window = 0;  // the sliding window (0: none)
};

const Case kCases[] = {
    {1, 1, 1, 1, 32, Docs::none},    // one token
    {2, 100, 4, 2, 16, Docs::cycling},  // the narrowest head (the tiny models' 64 / 4)
    {2, 17, 2, 2, 64, Docs::none},   // MHA, one partial tile, two sequences
    {1, 70, 4, 2, 32, Docs::none},   // GQA, a full tile and a partial one
    {1, 130, 2, 1, 64, Docs::cycling},   // MQA across three tiles, document mask
    {1, 65, 2, 2, 32, Docs::cycling},    // one row past a tile, document mask
    {1, 70, 2, 1, 128, Docs::none},  // the widest head
    {1, 128, 2, 1, 64, Docs::none},  // exactly two tiles: no partial one (128 query rows: one block)
    {1, 300, 2, 1, 64, Docs::none},  // GQA over five tiles: both cp.async stages reused, unmasked tiles (4/2 once)
    {1, 200, 2, 2, 128, Docs::cycling},  // the widest head over four tiles, document mask
    // Packed documents: skipped and unmasked tile pairs. (Two sequences once: one halves CI's
    // largest emulated case; the cycling documents above hold a second sequence's ids.)
    {1, 330, 4, 2, 64, Docs::packed},
    {1, 260, 2, 1, 128, Docs::packed},
    {1, 300, 2, 1, 32, Docs::returning},  // document 0 returns in tile 3: key tile 0 serves only half a block
    // Sliding windows: across tiles (tiles before the first row's window never visited, tiles its
    // last row's window starts in masked, warps of a block idle on tiles older than their rows'
    // windows); 127 (a tile's last row sees all of the previous tile but its first key); inside one
    // tile; 1 (each query sees itself only); 2 (key tile kt's last query tile ends exactly at a
    // tile's first row); and with packed documents.
    {1, 300, 2, 1, 64, Docs::none, 100},
    {1, 200, 2, 1, 128, Docs::none, 127},
    {1, 200, 2, 2, 16, Docs::none, 1},
    {1, 200, 2, 1, 16, Docs::cycling, 2},
    {1, 330, 2, 1, 32, Docs::packed, 70},
    {1, 70, 2, 1, 32, Docs::none, INT_MAX},  // as wide as an int allows: no window (k + W overflowed)
};

constexpr double kBf16Rel = 1.0 / 128;

using cuda_cases::DeviceBuffer;
using cuda_cases::expect_close;
using cuda_cases::inputs;
using cuda_cases::max_abs;
using cuda_cases::same_bits;
using cuda_cases::round_bf16;
using cuda_cases::rounded;
using cuda_cases::to_elem;
using cuda_cases::to_f32;
using cuda_cases::read_floats;

// Document ids (B, T), different per sequence. cycling: stretches of 1 to 23 tokens cycling
// through 3 ids, so a document resumes after another one. packed: 40 to 150 tokens per document.
inline std::vector<int32_t> doc_ids(int B, int Tn, uint64_t seed, Docs kind = Docs::cycling) {
  std::vector<float> r = ul_test::randn_f(size_t(B) * Tn, seed);
  std::vector<int32_t> d(size_t(B) * Tn);
  for (int b = 0; b < B; b++) {
    int id = b, left = 0;
    for (int t = 0; t < Tn; t++) {
      if (kind == Docs::returning) {
        const int tile = t / 64;
        d[size_t(b) * Tn + t] = tile % 4 == 0 || tile % 4 == 3 ? 0 : 100 + tile;
        continue;
      }
      if (left == 0 && kind == Docs::packed) {
        id++;
        left = 40 + int(std::fabs(r[size_t(b) * Tn + t]) * 97) % 111;
      } else if (left == 0) {
        id = (id + 1) % 3;
        left = 1 + int(std::fabs(r[size_t(b) * Tn + t]) * 11) % 23;
      }
      d[size_t(b) * Tn + t] = id;
      left--;
    }
  }
  return d;
}

// Tolerance floor for a gradient added onto `start`: a fraction of the gradient's own scale.
inline double grad_scale(const std::vector<float>& with, const std::vector<float>& start) {
  double m = 0;
  for (size_t i = 0; i < with.size(); i++) m = std::max(m, std::fabs(double(with[i]) - double(start[i])));
  return std::max(m, 1e-3);
}

// What the kernels wrote, as stored: the forward's out and lse, the backward's dqkv.
template <class T>
struct KernelResult {
  std::vector<T> out, dqkv;
  std::vector<float> lse;
};

template <class T>
KernelResult<T> check_kernels(const Case& c) {
  const bool bf = !std::is_same<T, float>::value;
  INFO((bf ? "bf16" : "f32") << " B=" << c.B << " T=" << c.Tn << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
                             << (c.doc == Docs::cycling  ? " cycling docs"
                                 : c.doc == Docs::packed   ? " packed docs"
                                 : c.doc == Docs::returning ? " returning docs"
                                                            : "")
                             << " window=" << c.window);
  const double rel = bf ? kBf16Rel : 1e-5;
  const size_t nqkv = size_t(c.B) * c.Tn * (c.Hq + 2 * c.Hkv) * c.D, nout = size_t(c.B) * c.Tn * c.Hq * c.D,
               nlse = size_t(c.B) * c.Hq * c.Tn;
  const uint64_t seed = 100 * uint64_t(c.Tn) + 10 * c.D + c.Hq;
  const std::vector<float> qkv = inputs<T>(nqkv, seed), dout = inputs<T>(nout, seed + 1),
                           dqkv0 = inputs<T>(nqkv, seed + 2);
  const bool has_doc = c.doc != Docs::none;
  const std::vector<int32_t> doc = has_doc ? doc_ids(c.B, c.Tn, seed + 3, c.doc) : std::vector<int32_t>();
  const int32_t* docp = has_doc ? doc.data() : nullptr;
  if (c.doc == Docs::packed) {  // the ids must give tile pairs that share no document, and pairs inside one
    int disjoint = 0, inside = 0;
    for (int qt = 0; qt * 64 < c.Tn; qt++)
      for (int kt = 0; kt < qt; kt++) {
        auto range = [&](int tile) {
          const auto* p = doc.data() + tile * 64;
          return std::minmax_element(p, p + std::min(64, c.Tn - tile * 64));
        };
        const auto q = range(qt), k = range(kt);
        disjoint += *q.second < *k.first || *k.second < *q.first;
        inside += *q.first == *q.second && *k.first == *k.second && *q.first == *k.first;
      }
    REQUIRE(disjoint > 0);
    REQUIRE(inside > 0);
  }

  // CPU reference (float, on the values the kernels read). The backward gets the forward's output
  // as T stores it, as the kernels do.
  std::vector<float> out_ref(nout), lse_ref(nlse);
  ul::cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), docp, c.window, c.B, c.Tn, c.Hq, c.Hkv, c.D);
  const std::vector<float> out_stored = bf ? rounded(out_ref) : out_ref;
  std::vector<float> dqkv_ref = dqkv0;
  ul::cpu::attention_backward(dqkv_ref.data(), dout.data(), out_stored.data(), lse_ref.data(), qkv.data(), docp,
                              c.window, c.B, c.Tn, c.Hq, c.Hkv, c.D);

  DeviceBuffer<T> d_qkv(nqkv), d_out(nout), d_dout(nout), d_dqkv(nqkv);
  DeviceBuffer<float> d_lse(nlse),
      scratch(ul::cuda::attention_backward_scratch_bytes(c.B, c.Tn, c.Hq, has_doc) / sizeof(float));
  DeviceBuffer<int> fwd_scratch(std::max<size_t>(1, ul::cuda::attention_forward_scratch_bytes(c.B, has_doc) / sizeof(int)));
  DeviceBuffer<int32_t> d_doc(doc.size());
  if (has_doc) d_doc.set(doc);
  const int32_t* d_docp = has_doc ? d_doc.p : nullptr;
  d_qkv.set(to_elem<T>(qkv));
  ul::cuda::attention_forward(d_out.p, d_lse.p, d_qkv.p, d_docp, c.window, fwd_scratch.p, c.B, c.Tn, c.Hq, c.Hkv, c.D,
                              nullptr);
  KernelResult<T> got{d_out.get(), {}, d_lse.get()};
  // An output is a weighted mean of values: its rounding follows their size, not its own (a mean
  // that cancels to 0.08 of values near 1 keeps their absolute error), hence the absolute part.
  expect_close("out", to_f32(got.out), out_ref, rel, (bf ? kBf16Rel : 1e-5) * max_abs(out_ref));
  expect_close("lse", got.lse, lse_ref, 1e-5, bf ? 1e-4 : 1e-5);

  // Backward from the reference forward, so it is checked on its own.
  d_out.set(to_elem<T>(out_stored));
  d_lse.set(lse_ref);
  d_dout.set(to_elem<T>(dout));
  auto run_backward = [&] {
    d_dqkv.set(to_elem<T>(dqkv0));
    ul::cuda::attention_backward(d_dqkv.p, d_dout.p, d_out.p, d_lse.p, d_qkv.p, d_docp, c.window, scratch.p, c.B,
                                 c.Tn, c.Hq, c.Hkv, c.D, nullptr);
    return d_dqkv.get();
  };
  const std::vector<T> g1 = run_backward();
  const double gs = grad_scale(dqkv_ref, dqkv0);
  expect_close("dqkv", to_f32(g1), dqkv_ref, rel, (bf ? kBf16Rel : 1e-5) * gs);
  const std::vector<T> g2 = run_backward();
  CHECK(std::memcmp(g1.data(), g2.data(), nqkv * sizeof(T)) == 0);
  // As the gradient's first writer (accumulate = false) on a NaN-filled buffer, which it must not
  // read: the bits of adding into zeros.
  auto run_into = [&](float fill, bool accumulate) {
    d_dqkv.set(to_elem<T>(std::vector<float>(nqkv, fill)));
    ul::cuda::attention_backward(d_dqkv.p, d_dout.p, d_out.p, d_lse.p, d_qkv.p, d_docp, c.window, scratch.p, c.B,
                                 c.Tn, c.Hq, c.Hkv, c.D, nullptr, accumulate);
    return d_dqkv.get();
  };
  const std::vector<T> from_zero = run_into(0.f, true), stored = run_into(std::nanf(""), false);
  CHECK(std::memcmp(from_zero.data(), stored.data(), nqkv * sizeof(T)) == 0);
  got.dqkv = g1;
  return got;
}

// Sets the query rows per block of the bf16 kernels for a scope.
struct QueryRows {
  int old;
  explicit QueryRows(int rows) : old(ul::cuda::set_attention_query_rows(rows)) {}
  ~QueryRows() { ul::cuda::set_attention_query_rows(old); }
};

// Sets the stages of the bf16 dk/dv pass for a scope.
struct DkvStages {
  int old;
  explicit DkvStages(int stages) : old(ul::cuda::set_attention_dkv_stages(stages)) {}
  ~DkvStages() { ul::cuda::set_attention_dkv_stages(old); }
};

// The names of the kernels f launched (through the GPU profile: each launch is a row).
template <class F>
std::vector<std::string> kernels_run(F&& f) {
  ul::gpu_profile::start();
  try {
    f();
  } catch (...) {
    ul::gpu_profile::stop();
    ul::gpu_profile::report();
    throw;
  }
  ul::gpu_profile::stop();
  std::vector<std::string> names;
  for (const ul::gpu_profile::Row& r : ul::gpu_profile::report()) names.push_back(r.name);
  return names;
}
inline bool launched(const std::vector<std::string>& names, const std::string& kernel) {
  return std::find(names.begin(), names.end(), kernel) != names.end();
}

struct OpResult {
  std::vector<float> out, dqkv;
};

// out = attention(qkv, Hq, Hkv, doc), then backward from dout, on one device and dtype; read back as float.
inline OpResult run_op(ul::Device dev, ul::DType dt, const Case& c, const std::vector<float>& qkv,
                       const std::vector<int32_t>& doc, const std::vector<float>& dout) {
  ul::Context ctx(dev);
  ul::ContextGuard guard(ctx);
  ul::Recording rec(true);
  auto put = [&](void* dst, const std::vector<float>& v, size_t bytes) {
    if (dt == ul::DType::bf16) ul::device_copy(dst, dev, to_elem<__nv_bfloat16>(v).data(), ul::Device::cpu, bytes);
    else ul::device_copy(dst, dev, v.data(), ul::Device::cpu, bytes);
  };
  auto read = [&](const void* p, size_t n) { return read_floats(p, n, dt == ul::DType::bf16, dev); };
  ul::Tensor tq = ctx.tape.track(ctx.empty({c.B, c.Tn, c.Hq + 2 * c.Hkv, c.D}, dt));
  put(tq.ptr, qkv, tq.nbytes());
  ul::Tensor tdoc;
  if (c.doc != Docs::none) {
    tdoc = ctx.empty({c.B, c.Tn}, ul::DType::i32);
    ul::copy_from_host(tdoc, doc.data());
  }
  ul::Tensor out = ul::attention(tq, c.Hq, c.Hkv, tdoc, c.window);
  REQUIRE(out.device == dev);
  REQUIRE(out.dtype == dt);
  REQUIRE(out.requires_grad());
  void* gout = ctx.tape.grad(out);
  put(gout, dout, out.nbytes());
  void* gq = ctx.tape.grad(tq);
  ctx.tape.backward();
  return {read(out.ptr, size_t(out.numel())), read(gq, size_t(tq.numel()))};
}

}  // namespace attn_cases

TEST_CASE("attention CUDA kernels match the CPU backend (f32)", UL_CUDA_TEST_TAG "[attention]") {
  for (const attn_cases::Case& c : attn_cases::kCases) attn_cases::check_kernels<float>(c);
}

// Blocks of 64 and of 128 query rows (the forward and the dq pass) walk the same key tiles for each
// row in the same order and skip only work that adds nothing, so they agree to the bit.
TEST_CASE("attention CUDA kernels match the CPU backend (bf16, tensor cores, 64 and 128 query rows a block)",
          UL_CUDA_TEST_TAG "[attention]") {
  using namespace attn_cases;
  for (const Case& c : kCases) {
    KernelResult<__nv_bfloat16> r64, r128;
    {
      QueryRows rows(64);
      r64 = check_kernels<__nv_bfloat16>(c);
    }
    {
      QueryRows rows(128);
      r128 = check_kernels<__nv_bfloat16>(c);
    }
    INFO("T=" << c.Tn << " D=" << c.D << ": 128 query rows a block against 64");
    CHECK(same_bits(r64.out, r128.out));
    CHECK(same_bits(r64.lse, r128.lse));
    CHECK(same_bits(r64.dqkv, r128.dqkv));
  }
  CHECK_THROWS_WITH(ul::cuda::set_attention_query_rows(96), Catch::Contains("64 or 128"));
  CHECK(ul::cuda::attention_query_rows() == 64);
}

// The dk/dv pass with one stage of (Q, dout) tiles, as on GPUs whose blocks hold 99 KiB (sm_86,
// sm_89, sm_120) at D = 128, fetches after each step instead of during it: the same arithmetic in
// the same order, so the same bits as two stages, and both match the CPU. The cases of several
// query tiles a key tile (the one stage refilled), with documents, windows and both wide heads.
TEST_CASE("attention CUDA backward: one stage of the dk/dv pass gives two stages' bits", UL_CUDA_TEST_TAG "[attention]") {
  using namespace attn_cases;
  int cases = 0;
  for (const Case& c : kCases) {
    if (c.D < 64 || c.Tn < 130) continue;
    KernelResult<__nv_bfloat16> one, two;
    std::vector<std::string> ran1, ran2;
    {
      DkvStages stages(1);
      ran1 = kernels_run([&] { one = check_kernels<__nv_bfloat16>(c); });
    }
    {
      DkvStages stages(2);
      ran2 = kernels_run([&] { two = check_kernels<__nv_bfloat16>(c); });
    }
    INFO("T=" << c.Tn << " D=" << c.D << ": one stage against two");
    CHECK(launched(ran1, "attention_backward_dkv_mma_1stage"));
    CHECK_FALSE(launched(ran1, "attention_backward_dkv_mma"));
    CHECK(launched(ran2, "attention_backward_dkv_mma"));
    CHECK_FALSE(launched(ran2, "attention_backward_dkv_mma_1stage"));
    CHECK(same_bits(one.dqkv, two.dqkv));
    cases++;
  }
  CHECK(cases >= 5);
  CHECK_THROWS_WITH(ul::cuda::set_attention_dkv_stages(3), Catch::Contains("0 (as the GPU allows), 1 or 2"));
  CHECK(ul::cuda::attention_dkv_stages() == 0);
}

namespace attn_cases {
// Forward, then backward from its own output, on the kernels directly (dqkv from zero): out, lse, dqkv.
// d_doc: device (B, T) ids, or nullptr for none.
template <class T>
KernelResult<T> run_kernels(const Case& c, const std::vector<float>& qkv, const std::vector<float>& dout,
                            const int32_t* d_doc) {
  const size_t nout = size_t(c.B) * c.Tn * c.Hq * c.D, nlse = size_t(c.B) * c.Hq * c.Tn;
  const bool has_doc = d_doc != nullptr;
  DeviceBuffer<T> d_qkv(qkv.size()), d_out(nout), d_dout(nout), d_dqkv(qkv.size());
  DeviceBuffer<float> d_lse(nlse),
      scratch(ul::cuda::attention_backward_scratch_bytes(c.B, c.Tn, c.Hq, has_doc) / sizeof(float));
  DeviceBuffer<int> fwd_scratch(std::max<size_t>(1, ul::cuda::attention_forward_scratch_bytes(c.B, has_doc) / sizeof(int)));
  d_qkv.set(to_elem<T>(qkv));
  d_dout.set(to_elem<T>(dout));
  d_dqkv.set(to_elem<T>(std::vector<float>(qkv.size(), 0.f)));
  ul::cuda::attention_forward(d_out.p, d_lse.p, d_qkv.p, d_doc, c.window, fwd_scratch.p, c.B, c.Tn, c.Hq, c.Hkv, c.D,
                              nullptr);
  ul::cuda::attention_backward(d_dqkv.p, d_dout.p, d_out.p, d_lse.p, d_qkv.p, d_doc, c.window, scratch.p, c.B, c.Tn,
                               c.Hq, c.Hkv, c.D, nullptr);
  return {d_out.get(), d_dqkv.get(), d_lse.get()};
}
// The same with host ids (B, T), uploaded first; empty for none.
template <class T>
KernelResult<T> run_kernels(const Case& c, const std::vector<float>& qkv, const std::vector<float>& dout,
                            const std::vector<int32_t>& doc = {}) {
  if (doc.empty()) return run_kernels<T>(c, qkv, dout, static_cast<const int32_t*>(nullptr));
  DeviceBuffer<int32_t> d_doc(doc.size());
  d_doc.set(doc);
  return run_kernels<T>(c, qkv, dout, d_doc.p);
}

// Rows [r0, r1) of a (T, width) slice starting at column c0, c1 columns wide, as a flat vector.
template <class T>
std::vector<T> rows_of(const std::vector<T>& v, int width, int r0, int r1, int c0, int c1) {
  std::vector<T> r;
  for (int t = r0; t < r1; t++) r.insert(r.end(), v.begin() + size_t(t) * width + c0, v.begin() + size_t(t) * width + c1);
  return r;
}

// Nothing crosses the window, to the bit: key k* is seen by queries k* .. k* + W - 1 only. Changing
// its K and V rows leaves every later query's out, lse and dq as they were; changing the Q and
// dout rows of those later queries leaves its dk and dv as they were. A tile mask one key off at
// the window's edge changes them (the tolerance checks against the CPU may not see one key).
template <class T>
void check_window_edge(const Case& c, int kstar) {
  INFO((std::is_same<T, float>::value ? "f32" : "bf16") << " T=" << c.Tn << " D=" << c.D << " window=" << c.window
                                                       << " key " << kstar);
  const int H3 = c.Hq + 2 * c.Hkv, row = H3 * c.D, orow = c.Hq * c.D, first_unseen = kstar + c.window;
  REQUIRE((c.B == 1 && c.Hkv == 1 && first_unseen < c.Tn));
  const std::vector<float> qkv = inputs<T>(size_t(c.Tn) * row, 71), dout = inputs<T>(size_t(c.Tn) * orow, 72);
  const KernelResult<T> base = run_kernels<T>(c, qkv, dout);

  std::vector<float> moved_kv = qkv;  // key k*'s K and V rows (the single kv head), new values
  const std::vector<float> noise = inputs<T>(size_t(2) * c.D, 73);
  for (int i = 0; i < 2 * c.D; i++) moved_kv[size_t(kstar) * row + c.Hq * c.D + i] = 4 * noise[i];
  const KernelResult<T> a = run_kernels<T>(c, moved_kv, dout);
  CHECK(same_bits(rows_of(base.out, orow, first_unseen, c.Tn, 0, orow), rows_of(a.out, orow, first_unseen, c.Tn, 0, orow)));
  CHECK(same_bits(rows_of(base.dqkv, row, first_unseen, c.Tn, 0, c.Hq * c.D),
                  rows_of(a.dqkv, row, first_unseen, c.Tn, 0, c.Hq * c.D)));
  for (int h = 0; h < c.Hq; h++)
    CHECK(same_bits(rows_of(base.lse, c.Tn, h, h + 1, first_unseen, c.Tn), rows_of(a.lse, c.Tn, h, h + 1, first_unseen, c.Tn)));
  CHECK_FALSE(same_bits(base.out, a.out));  // the queries that see it do change

  std::vector<float> moved_q = qkv, moved_dout = dout;  // every later query's Q and dout rows
  const std::vector<float> qn = inputs<T>(moved_q.size(), 74), dn = inputs<T>(moved_dout.size(), 75);
  for (int t = first_unseen; t < c.Tn; t++) {
    for (int i = 0; i < c.Hq * c.D; i++) moved_q[size_t(t) * row + i] = qn[size_t(t) * row + i];
    for (int i = 0; i < orow; i++) moved_dout[size_t(t) * orow + i] = dn[size_t(t) * orow + i];
  }
  const KernelResult<T> b = run_kernels<T>(c, moved_q, moved_dout);
  CHECK(same_bits(rows_of(base.dqkv, row, kstar, kstar + 1, c.Hq * c.D, row),
                  rows_of(b.dqkv, row, kstar, kstar + 1, c.Hq * c.D, row)));
  CHECK_FALSE(same_bits(base.dqkv, b.dqkv));
}
}  // namespace attn_cases

namespace attn_cases {
// Nothing leaks through any mask, to the value (+0 and -0 equal): one key (sequence 0, kv head g,
// position k*) given new K and V rows leaves out, lse and dq unchanged for every query that cannot
// see it (the other sequence, the other kv heads' queries, earlier positions, positions past the
// window, other documents), and changes some that can; one query (sequence 0, head h*, position
// q*) given new Q and dout rows leaves dk and dv unchanged for every key it cannot see. The checks
// against the CPU have a tolerance, under which one masked key's small weight could hide.
template <class T>
void check_no_leak(const Case& c, int kstar, int g, int qstar, int hstar) {
  INFO((std::is_same<T, float>::value ? "f32" : "bf16") << " T=" << c.Tn << " Hq=" << c.Hq << " Hkv=" << c.Hkv
                                                       << " D=" << c.D << " window=" << c.window << " key " << kstar
                                                       << " of kv head " << g << ", query " << qstar << " of head "
                                                       << hstar);
  const int H3 = c.Hq + 2 * c.Hkv, D = c.D, group = c.Hq / c.Hkv;
  const size_t row = size_t(H3) * D, orow = size_t(c.Hq) * D;
  const std::vector<float> qkv = inputs<T>(size_t(c.B) * c.Tn * row, 81), dout = inputs<T>(size_t(c.B) * c.Tn * orow, 82);
  const std::vector<int32_t> doc = doc_ids(c.B, c.Tn, 83, c.doc);
  const KernelResult<T> base = run_kernels<T>(c, qkv, dout, doc);
  // Query (b, h, q) sees key (b', kvh, k) of sequence 0.
  auto sees = [&](int b, int h, int q, int kvh, int k) {
    return b == 0 && h / group == kvh && k <= q && (c.window == 0 || q - k < c.window) && doc[size_t(q)] == doc[size_t(k)];
  };
  auto same = [](const std::vector<T>& a, const std::vector<T>& b, size_t at, size_t n) {
    const std::vector<float> x = to_f32(std::vector<T>(a.begin() + long(at), a.begin() + long(at + n))),
                             y = to_f32(std::vector<T>(b.begin() + long(at), b.begin() + long(at + n)));
    return x == y;
  };

  std::vector<float> moved = qkv;  // key k*'s K and V rows of kv head g
  const std::vector<float> noise = inputs<T>(size_t(2) * D, 84);
  for (int i = 0; i < D; i++) {
    moved[size_t(kstar) * row + size_t(c.Hq + g) * D + i] = 4 * noise[size_t(i)];
    moved[size_t(kstar) * row + size_t(c.Hq + c.Hkv + g) * D + i] = 4 * noise[size_t(D + i)];
  }
  const KernelResult<T> a = run_kernels<T>(c, moved, dout, doc);
  int blind = 0, seeing_changed = 0;
  for (int b = 0; b < c.B; b++)
    for (int q = 0; q < c.Tn; q++)
      for (int h = 0; h < c.Hq; h++) {
        const size_t at = (size_t(b) * c.Tn + q) * orow + size_t(h) * D, lse_at = (size_t(b) * c.Hq + h) * c.Tn + q,
                     dq_at = (size_t(b) * c.Tn + q) * row + size_t(h) * D;
        const bool unchanged = same(base.out, a.out, at, D) && base.lse[lse_at] == a.lse[lse_at] &&
                               same(base.dqkv, a.dqkv, dq_at, D);
        if (!sees(b, h, q, g, kstar)) {
          blind++;
          if (!unchanged) FAIL_CHECK("query " << q << " of head " << h << " in sequence " << b << " moved");
        } else {
          seeing_changed += !unchanged;
        }
      }
  CHECK(blind > 0);
  CHECK(seeing_changed > 0);

  std::vector<float> moved_q = qkv, moved_dout = dout;  // query q*'s Q row of head h*, and its dout
  const std::vector<float> qn = inputs<T>(size_t(2) * D, 85);
  for (int i = 0; i < D; i++) {
    moved_q[size_t(qstar) * row + size_t(hstar) * D + i] = 4 * qn[size_t(i)];
    moved_dout[size_t(qstar) * orow + size_t(hstar) * D + i] = 4 * qn[size_t(D + i)];
  }
  const KernelResult<T> q = run_kernels<T>(c, moved_q, moved_dout, doc);
  int unseen = 0, seen_changed = 0;
  for (int b = 0; b < c.B; b++)
    for (int k = 0; k < c.Tn; k++)
      for (int kvh = 0; kvh < c.Hkv; kvh++) {
        const size_t dk_at = (size_t(b) * c.Tn + k) * row + size_t(c.Hq + kvh) * D,
                     dv_at = (size_t(b) * c.Tn + k) * row + size_t(c.Hq + c.Hkv + kvh) * D;
        const bool unchanged = same(base.dqkv, q.dqkv, dk_at, D) && same(base.dqkv, q.dqkv, dv_at, D);
        if (!sees(b, hstar, qstar, kvh, k)) {
          unseen++;
          if (!unchanged) FAIL_CHECK("dk/dv of key " << k << " of kv head " << kvh << " in sequence " << b << " moved");
        } else {
          seen_changed += !unchanged;
        }
      }
  CHECK(unseen > 0);
  CHECK(seen_changed > 0);
}
}  // namespace attn_cases

// Groups of 4 query heads a kv head (the tested shapes above have 1 or 2), packed documents whose
// boundaries fall inside tiles, a window, two sequences.
TEST_CASE("attention CUDA kernels: nothing leaks through the causal, document, window or head masks", UL_CUDA_TEST_TAG "[attention]") {
  using namespace attn_cases;
  for (const Case& c : {Case{2, 200, 8, 2, 32, Docs::packed}, Case{2, 150, 4, 1, 16, Docs::cycling, 40}}) {
    const int kstar = 70, qstar = 130;
    check_no_leak<float>(c, kstar, c.Hkv - 1, qstar, c.Hq - 1);
    for (int rows : {64, 128}) {
      QueryRows q(rows);
      check_no_leak<__nv_bfloat16>(c, kstar, c.Hkv - 1, qstar, c.Hq - 1);
    }
  }
}

// A NaN key reaches every row that sees it, and no other, as on the CPU: fmaxf drops a NaN, so a
// NaN key alone in a row's tile (a document starting at the tile's last key, or a window's first
// key) once read as "nothing visible" and gave those rows a finite, wrong output.
TEST_CASE("attention CUDA forward passes a NaN key on to every row that sees it, and to no other", UL_CUDA_TEST_TAG "[attention]") {
  using namespace attn_cases;
  struct Nan { int bad, doc_from, window; };  // doc_from: the second document's first key (0: none)
  auto check = [](auto zero, const Nan& k) {
    using T = decltype(zero);
    const Case c{1, 130, 1, 1, 16, Docs::none, k.window};
    INFO((std::is_same<T, float>::value ? "f32" : "bf16") << ": NaN key at " << k.bad << ", documents from "
                                                         << k.doc_from << ", window " << k.window);
    const int row = 3 * c.D;
    std::vector<float> qkv = inputs<T>(size_t(c.Tn) * row, 91), dout = inputs<T>(size_t(c.Tn) * c.D, 92);
    qkv[size_t(k.bad) * row + c.D] = NAN;  // the key head's first element
    std::vector<int32_t> doc;
    if (k.doc_from) doc.assign(size_t(c.Tn), 0), std::fill(doc.begin() + k.doc_from, doc.end(), 1);
    const KernelResult<T> r = run_kernels<T>(c, qkv, dout, doc);
    const std::vector<float> out = to_f32(r.out);
    int wrong = 0;
    for (int t = 0; t < c.Tn; t++) {
      const bool sees = t >= k.bad && (doc.empty() || doc[size_t(t)] == doc[size_t(k.bad)]) &&
                        (!k.window || t - k.bad < k.window);
      for (int i = 0; i < c.D; i++) wrong += std::isnan(out[size_t(t) * c.D + i]) != sees;
    }
    CHECK(wrong == 0);
  };
  // 63: the last key of a 64-key tile (bf16); 31: of a 32-key step (f32); 5: amid other keys.
  for (const Nan& k : {Nan{63, 63, 0}, Nan{31, 31, 0}, Nan{63, 0, 2}, Nan{5, 0, 0}}) {
    check(float(0), k);
    for (int rows : {64, 128}) {
      QueryRows q(rows);
      check(__nv_bfloat16{}, k);
    }
  }
}

TEST_CASE("attention CUDA kernels: rising document ids give the bits of the same documents numbered down", UL_CUDA_TEST_TAG "[attention]") {
  using namespace attn_cases;
  // Rising ids: the bf16 kernels find the tiles of a tile's documents by bisection (32 probes a
  // round: over 35 tiles, rounds of 2 tiles a probe, then 1); falling ids: every earlier tile's
  // ids are tested. Either way the same tiles are multiplied, so the bits are the same. A 1300-token
  // document (21 tiles), one of a single token, then documents of 40 to 150 tokens; in the other
  // sequence only the short ones, numbered down in the first run and up in the second (a flag a
  // sequence). A window on the second pass: documents and window both bound the walk.
  for (int window : {0, 700}) {
    const Case c{2, 2200, 2, 1, 16, Docs::packed, window};
    std::vector<int32_t> up = doc_ids(c.B, c.Tn, 91, Docs::packed), down(up.size());
    for (int t = 0; t < 1301; t++) up[t] = t < 1300 ? 0 : 1;  // (the packed ids after them are larger)
    for (size_t i = 0; i < up.size(); i++) down[i] = -up[i];
    std::vector<int32_t> rising = up, falling = down;  // sequence 1 the other way in each
    std::copy(down.begin() + c.Tn, down.end(), rising.begin() + c.Tn);
    std::copy(up.begin() + c.Tn, up.end(), falling.begin() + c.Tn);
    const size_t nqkv = size_t(c.B) * c.Tn * (c.Hq + 2 * c.Hkv) * c.D, nout = size_t(c.B) * c.Tn * c.Hq * c.D;
    const std::vector<float> qkv = inputs<__nv_bfloat16>(nqkv, 92), dout = inputs<__nv_bfloat16>(nout, 93);
    std::vector<float> out_ref(nout), lse_ref(size_t(c.B) * c.Hq * c.Tn);
    ul::cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), up.data(), c.window, c.B, c.Tn, c.Hq, c.Hkv,
                               c.D);
    for (int rows : {64, 128}) {
      QueryRows q(rows);
      INFO(rows << " query rows a block, window " << window);
      const KernelResult<__nv_bfloat16> a = run_kernels<__nv_bfloat16>(c, qkv, dout, rising),
                                        b = run_kernels<__nv_bfloat16>(c, qkv, dout, falling);
      expect_close("out", to_f32(a.out), out_ref, kBf16Rel, kBf16Rel * max_abs(out_ref));
      CHECK(same_bits(a.out, b.out));
      CHECK(same_bits(a.lse, b.lse));
      CHECK(same_bits(a.dqkv, b.dqkv));
    }
  }
}

TEST_CASE("attention CUDA kernels: nothing crosses the sliding window's edge (bitwise)", UL_CUDA_TEST_TAG "[attention]") {
  using namespace attn_cases;
  // 127: key 0's last query is row 126, and row 127 ends the next tile; 64 and 100 elsewhere.
  for (const Case& c : {Case{1, 200, 2, 1, 32, Docs::none, 127}, Case{1, 200, 2, 1, 64, Docs::none, 64},
                        Case{1, 260, 2, 1, 32, Docs::none, 100}})
    for (int kstar : {0, 37}) {
      check_window_edge<float>(c, kstar);
      for (int rows : {64, 128}) {
        QueryRows q(rows);
        check_window_edge<__nv_bfloat16>(c, kstar);
      }
    }
}

TEST_CASE("attention op on Device::cuda matches the op on the CPU", UL_CUDA_TEST_TAG "[attention]") {
  ul::init_cuda_backend();
  for (const attn_cases::Case c : {attn_cases::Case{2, 70, 4, 2, 32, attn_cases::Docs::cycling},
                                   attn_cases::Case{2, 70, 4, 2, 32, attn_cases::Docs::cycling, 20}}) {
    for (ul::DType dt : {ul::DType::f32, ul::DType::bf16}) {
      const bool bf = dt == ul::DType::bf16;
      INFO(ul::dtype_name(dt) << " window=" << c.window);
      auto in = [&](size_t n, uint64_t seed) {
        std::vector<float> v = ul_test::randn_f(n, seed);
        return bf ? attn_cases::rounded(v) : v;
      };
      const std::vector<float> qkv = in(size_t(c.B) * c.Tn * (c.Hq + 2 * c.Hkv) * c.D, 21),
                               dout = in(size_t(c.B) * c.Tn * c.Hq * c.D, 22);
      const std::vector<int32_t> doc = attn_cases::doc_ids(c.B, c.Tn, 23);
      const attn_cases::OpResult ref = attn_cases::run_op(ul::Device::cpu, ul::DType::f32, c, qkv, doc, dout);
      const attn_cases::OpResult got = attn_cases::run_op(ul::Device::cuda, dt, c, qkv, doc, dout);
      // bf16: the op also backpropagates through its own bf16 output (Di = rowsum(dout * out)).
      const double rel = bf ? 2 * attn_cases::kBf16Rel : 1e-5;
      attn_cases::expect_close("out", got.out, ref.out, rel, rel * attn_cases::max_abs(ref.out));
      const std::vector<float> zero(ref.dqkv.size(), 0.f);
      attn_cases::expect_close("dqkv", got.dqkv, ref.dqkv, rel, rel * attn_cases::grad_scale(ref.dqkv, zero));
    }
  }
}

TEST_CASE("attention op on Device::cuda refuses unsupported head dims and misplaced doc ids",
          UL_CUDA_TEST_TAG "[attention]") {
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  CHECK_THROWS_WITH(ul::attention(c.zeros({1, 4, 3, 48}), 1, 1, ul::Tensor()),
                    Catch::Contains("attention") && Catch::Contains("D = 48"));
  CHECK_THROWS_WITH(ul::attention(c.zeros({1, 4, 3, 32}, ul::DType::i32), 1, 1, ul::Tensor()),
                    Catch::Contains("attention") && Catch::Contains("i32"));
  ul::Context host;
  ul::Tensor doc_on_host = host.zeros({1, 4}, ul::DType::i32);
  CHECK_THROWS_WITH(ul::attention(c.zeros({1, 4, 3, 32}), 1, 1, doc_on_host),
                    Catch::Contains("doc ids") && Catch::Contains("cpu"));
  {  // and the CPU op refuses doc ids in device memory, which it would read as host memory
    ul::ContextGuard on_host(host);
    CHECK_THROWS_WITH(ul::attention(host.zeros({1, 4, 3, 32}), 1, 1, c.zeros({1, 4}, ul::DType::i32)),
                      Catch::Contains("doc ids on cuda but qkv on cpu"));
  }
  CHECK_THROWS_WITH(ul::cuda::attention_forward<float>(nullptr, nullptr, nullptr, nullptr, 0, nullptr, 1, 4, 1, 1, 96, nullptr),
                    Catch::Contains("D = 96"));
  CHECK_THROWS_WITH(ul::attention(c.zeros({1, 4, 3, 32}), 1, 1, ul::Tensor(), -2), Catch::Contains("window"));
  CHECK_THROWS_WITH(ul::cuda::attention_forward<float>(nullptr, nullptr, nullptr, nullptr, -2, nullptr, 1, 4, 1, 1, 32, nullptr),
                    Catch::Contains("window"));
}
