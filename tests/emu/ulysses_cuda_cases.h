// The Ulysses pack/unpack permutes on CUDA against the CPU loops, and the two all-to-all ops on
// Device::cuda tensors under the local communicator (ranks as threads, collectives staged through
// host memory) against the same ops on the CPU. The cases run emulated (tests/emu) and on a GPU
// (tests/gpu).
//   - outputs are poisoned (NaN) unless the permute accumulates; accumulating ones start from
//     random values, so `=` instead of `+=` fails;
//   - head splits with kv heads >= P, < P (replicated: their gradients are summed), GQA, P = 3;
//     Tl and B small and odd, D odd (one element at a time) and a multiple of 8 (16-byte packs);
//   - f32 is exact (the same additions in the same order); bf16 is exact for copies and the CPU's
//     float sum rounded once for accumulations.
#pragma once
#include "emu/cuda_cases_util.h"
#include "engine/context.h"
#include "engine/device.h"
#include "parallel/comm_local.h"
#include "parallel/ulysses.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including ulysses_cuda_cases.h"
#endif

namespace ulysses_cases {
using namespace cuda_cases;

const ul::HeadSplit kSplits[] = {{4, 4, 2}, {8, 4, 4}, {8, 2, 4}, {8, 1, 4},
                                 {6, 3, 3}, {6, 1, 3}, {6, 0, 3}, {4, 0, 1}};
const int B = 2, Tl = 3;

// Reference of an accumulating permute for T: the CPU's float result, rounded once for bf16.
template <class T>
std::vector<float> as_stored(std::vector<float> v) {
  return is_bf16<T>() ? rounded(v) : v;
}

// D = 5 takes the kernels' one-element path, D = 16 their 16-byte packs (8 bf16, 4 floats).
template <class T>
void check_heads(const ul::HeadSplit& hs, int D) {
  const int P = hs.P, H = hs.Hq + 2 * hs.Hkv, W = hs.width();
  INFO(type_name<T>() << " Hq=" << hs.Hq << " Hkv=" << hs.Hkv << " P=" << P << " D=" << D);
  const size_t n_src = size_t(B) * Tl * H * D, n_chunks = size_t(P) * B * Tl * W * D;
  const std::vector<float> src = inputs<T>(n_src, 1 + H), recv = inputs<T>(n_chunks, 2 + W), dst0 = inputs<T>(n_src, 3);

  std::vector<float> send_ref(n_chunks), acc_ref = dst0, set_ref(n_src, NAN);
  ul::cpu::heads_to_chunks(send_ref.data(), src.data(), hs, B, Tl, D);
  ul::cpu::chunks_to_heads(acc_ref.data(), recv.data(), hs, B, Tl, D, true);
  ul::cpu::chunks_to_heads(set_ref.data(), recv.data(), hs, B, Tl, D, false);

  DeviceBuffer<T> d_src(n_src), d_send(n_chunks), d_recv(n_chunks), d_dst(n_src);
  d_src.set(to_elem<T>(src));
  ul::cuda::heads_to_chunks<T>(d_send.p, d_src.p, hs, B, Tl, D, nullptr);
  expect_close("heads_to_chunks", to_f32(d_send.get()), send_ref, 0, 0);

  d_recv.set(to_elem<T>(recv));
  d_dst.set(to_elem<T>(dst0));
  ul::cuda::chunks_to_heads<T>(d_dst.p, d_recv.p, hs, B, Tl, D, true, nullptr);
  expect_close("chunks_to_heads +=", to_f32(d_dst.get()), as_stored<T>(acc_ref), 0, 0);
  d_dst.poison();
  ul::cuda::chunks_to_heads<T>(d_dst.p, d_recv.p, hs, B, Tl, D, false, nullptr);
  expect_close("chunks_to_heads =", to_f32(d_dst.get()), set_ref, 0, 0);
}

template <class T>
void check_sequence(int P, int R) {
  INFO(type_name<T>() << " P=" << P << " R=" << R);
  const size_t n = size_t(P) * B * Tl * R;
  const std::vector<float> seq = inputs<T>(n, 4 + R), chunks = inputs<T>(n, 5 + P), dst0 = inputs<T>(n, 6);
  std::vector<float> send_ref(n), acc_ref = dst0, set_ref(n);
  ul::cpu::sequence_to_chunks(send_ref.data(), seq.data(), P, B, Tl, R);
  ul::cpu::chunks_to_sequence(acc_ref.data(), chunks.data(), P, B, Tl, R, true);
  ul::cpu::chunks_to_sequence(set_ref.data(), chunks.data(), P, B, Tl, R, false);

  DeviceBuffer<T> d_seq(n), d_send(n), d_chunks(n), d_dst(n);
  d_seq.set(to_elem<T>(seq));
  ul::cuda::sequence_to_chunks<T>(d_send.p, d_seq.p, P, B, Tl, R, nullptr);
  expect_close("sequence_to_chunks", to_f32(d_send.get()), send_ref, 0, 0);
  d_chunks.set(to_elem<T>(chunks));
  d_dst.set(to_elem<T>(dst0));
  ul::cuda::chunks_to_sequence<T>(d_dst.p, d_chunks.p, P, B, Tl, R, true, nullptr);
  expect_close("chunks_to_sequence +=", to_f32(d_dst.get()), as_stored<T>(acc_ref), 0, 0);
  d_dst.poison();
  ul::cuda::chunks_to_sequence<T>(d_dst.p, d_chunks.p, P, B, Tl, R, false, nullptr);
  expect_close("chunks_to_sequence =", to_f32(d_dst.get()), set_ref, 0, 0);
}

struct RankResult {
  std::vector<float> out, grad;
};

// On P local ranks: rank r's input (B, rows, H, D) from `full` (B, P*rows, H, D) when `by_tokens`,
// else its own slice of `full` (P, ...); out = op(input); backward from dout; out and the input
// gradient read back as float. Rank threads only record (Catch2 is not thread-safe).
template <class Op>
std::vector<RankResult> run_ranks(ul::Device dev, ul::DType dt, int P, ul::Shape in_shape, const std::vector<float>& in,
                                  const std::vector<float>& dout, Op op) {
  std::vector<RankResult> res(P);
  const bool bf = dt == ul::DType::bf16;
  ul::LocalOptions opt;
  opt.device = dev;
  ul::run_local(P, [&](ul::Comm& comm) {
    ul::Context c(dev);
    ul::ContextGuard guard(c);
    ul::Recording rec(true);
    const int r = comm.rank();
    const size_t n_in = size_t(in_shape.numel());
    auto upload = [&](const ul::Tensor& t, const float* v) {
      const std::vector<float> h(v, v + t.numel());
      if (bf) ul::copy_from_host(t, to_elem<__nv_bfloat16>(h).data());
      else ul::copy_from_host(t, h.data());
    };
    auto download = [&](const void* p, size_t n) {
      std::vector<float> h(n);
      if (bf) {
        std::vector<__nv_bfloat16> b(n);
        ul::device_copy(b.data(), ul::Device::cpu, p, dev, n * 2);
        h = to_f32(b);
      } else {
        ul::device_copy(h.data(), ul::Device::cpu, p, dev, n * 4);
      }
      return h;
    };
    ul::Tensor x = c.tape.track(c.empty(in_shape, dt));
    upload(x, in.data() + r * n_in);
    ul::Tensor y = op(x, comm);
    upload(ul::Tensor{c.tape.grad(y), y.shape, dt, dev}, dout.data() + r * size_t(y.numel()));
    void* gx = c.tape.grad(x);
    res[r].out = download(y.ptr, size_t(y.numel()));
    c.tape.backward();
    res[r].grad = download(gx, n_in);
  }, opt);
  return res;
}

inline void check_ops(const ul::HeadSplit& hs, ul::DType dt) {
  ul::init_cuda_backend();
  const int P = hs.P, H = hs.Hq + 2 * hs.Hkv, W = hs.width();
  const int D = 8;  // the kernels' 16-byte packs on arena tensors (the odd D is covered above)
  const bool bf = dt == ul::DType::bf16;
  INFO(ul::dtype_name(dt) << " Hq=" << hs.Hq << " Hkv=" << hs.Hkv << " P=" << P);
  auto in = [&](size_t n, uint64_t seed) {
    std::vector<float> v = ul_test::randn_f(n, seed);
    return bf ? rounded(v) : v;
  };
  // Replicated kv heads sum P/Hkv gradients: bf16 stores that sum rounded.
  const double rel = bf ? 1.0 / 256 : 0;
  auto compare = [&](const char* what, const std::vector<RankResult>& got, const std::vector<RankResult>& ref) {
    for (int r = 0; r < P; r++) {
      INFO(what << " rank " << r);
      expect_close("out", got[r].out, ref[r].out, 0, 0);
      expect_close("input gradient", got[r].grad, ref[r].grad, rel, 0);
    }
  };
  if (hs.Hkv > 0) {  // scatter: (B, Tl, H, D) -> (B, P*Tl, W, D)
    const std::vector<float> x = in(size_t(P) * B * Tl * H * D, 31), dout = in(size_t(P) * B * P * Tl * W * D, 32);
    auto op = [&](const ul::Tensor& t, ul::Comm& comm) { return ul::ulysses_scatter_heads(t, hs.Hq, hs.Hkv, comm); };
    const auto ref = run_ranks(ul::Device::cpu, ul::DType::f32, P, {B, Tl, H, D}, x, dout, op);
    const auto got = run_ranks(ul::Device::cuda, dt, P, {B, Tl, H, D}, x, dout, op);
    compare("scatter_heads", got, ref);
  }
  // gather: (B, P*Tl, Hq/P, D) -> (B, Tl, Hq, D)
  const int Hl = hs.Hq / P;
  const std::vector<float> y = in(size_t(P) * B * P * Tl * Hl * D, 33), dout = in(size_t(P) * B * Tl * hs.Hq * D, 34);
  auto op = [&](const ul::Tensor& t, ul::Comm& comm) { return ul::ulysses_gather_heads(t, hs.Hq, comm); };
  const auto ref = run_ranks(ul::Device::cpu, ul::DType::f32, P, {B, P * Tl, Hl, D}, y, dout, op);
  const auto got = run_ranks(ul::Device::cuda, dt, P, {B, P * Tl, Hl, D}, y, dout, op);
  compare("gather_heads", got, ref);
}

}  // namespace ulysses_cases

TEST_CASE("ulysses head permutes on CUDA match the CPU", UL_CUDA_TEST_TAG "[ulysses]") {
  for (const auto& hs : ulysses_cases::kSplits) {
    for (int D : {5, 16}) {
      ulysses_cases::check_heads<float>(hs, D);
      ulysses_cases::check_heads<__nv_bfloat16>(hs, D);
    }
  }
}

TEST_CASE("ulysses sequence permutes on CUDA match the CPU", UL_CUDA_TEST_TAG "[ulysses]") {
  for (int P : {1, 2, 3})
    for (int R : {1, 7, 40}) {
      ulysses_cases::check_sequence<float>(P, R);
      ulysses_cases::check_sequence<__nv_bfloat16>(P, R);
    }
}

TEST_CASE("ulysses ops on Device::cuda (local communicator) match the ops on the CPU", UL_CUDA_TEST_TAG "[ulysses]") {
  // A few splits (the kernels above cover them all): each rank context costs a 64 MiB arena block.
  for (const ul::HeadSplit& hs : {ul::HeadSplit{4, 4, 2}, ul::HeadSplit{8, 1, 4}, ul::HeadSplit{6, 3, 3}})
    for (ul::DType dt : {ul::DType::f32, ul::DType::bf16}) ulysses_cases::check_ops(hs, dt);
}

TEST_CASE("ulysses ops refuse a communicator for another device", UL_CUDA_TEST_TAG "[ulysses]") {
  ul::init_cuda_backend();
  std::string err;
  ul::run_local(2, [&](ul::Comm& comm) {  // a cpu communicator, cuda tensors
    ul::Context c(ul::Device::cuda);
    ul::ContextGuard guard(c);
    try {
      ul::ulysses_gather_heads(c.zeros({1, 4, 1, 2}), 2, comm);
    } catch (const std::exception& e) {
      if (comm.rank() == 0) err = e.what();
    }
  });
  CHECK_THAT(err, Catch::Contains("communicator is for cpu"));
}
