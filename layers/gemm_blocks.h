// dst += a b on the CPU, threaded by the project and the same bits at any thread count: the CPU
// linear layer (layers/linear.cpp) and the emulated cuBLASLt GEMM (engine/gemm.cpp) both use it.
//
// Why not Eigen's own OpenMP GEMM: its threads share packed panels and spin-wait on each other at
// every panel, so when the cores are also busy with anything else (another rank's thread, a
// compile) one preempted thread stalls the others and the rate drops severalfold; and its split
// follows the thread count, as does the inner blocking Eigen picks for each part (how the K sum is
// cut into panels), so the bits changed with --threads. Here dst is cut into blocks of rows (or
// of columns, whichever dimension is longer) fixed by the shape alone; each block is one
// single-threaded Eigen GEMM, and the threads share out whole blocks, meeting once at the end.
#pragma once
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>

namespace ul {
namespace cpu {
namespace gemm_detail {

// dst += a b, at most kMaxBlockCols columns at a time, one Eigen GEMM each. Why: Eigen packs the
// whole (K, width) right operand into one buffer it allocates per call; past glibc's largest mmap
// threshold (32 MB) every call maps fresh pages and faults them in. That once cost ~150 MB of page
// clearing per GPT-2 step (the classifier split by threads: 25152 columns of 768 each, ~39 MB);
// the blocks below (about 48 a product) now keep GPT-2's calls far narrower, and this cap guards a
// long side past 48 x 4096 columns. 4096 columns keep the buffer under 13 MB at K = 768, which the
// heap reuses; the left operand is repacked per chunk, a copy of (M, K) per 4096 x M x K
// multiply-adds.
constexpr int64_t kMaxBlockCols = 4096;

template <class Dst, class A, class B> void product_add(Dst dst, const A& a, const B& b) {
  for (int64_t j = 0; j < dst.cols(); j += kMaxBlockCols) {
    const int64_t w = std::min(kMaxBlockCols, int64_t(dst.cols()) - j);
    dst.middleCols(j, w).noalias() += a * b.middleCols(j, w);
  }
}

// Eigen threads a large product itself unless it runs inside a team of more than one thread or
// sees one thread allowed: this makes it see one, for the calling thread only (an OpenMP setting
// of the thread's own task, so other ranks' threads are untouched), until the scope ends.
class OneEigenThread {
 public:
  OneEigenThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneEigenThread() { omp_set_num_threads(saved_); }
  OneEigenThread(const OneEigenThread&) = delete;
  OneEigenThread& operator=(const OneEigenThread&) = delete;

 private:
  int saved_;
};

}  // namespace gemm_detail

// dst += a b. Dst is a writable Eigen view (a Map, a block); a and b any Eigen matrix expressions
// (maps, transposes). Called inside a parallel region it runs serially, over the same blocks.
template <class Dst, class A, class B> void gemm_add(Dst dst, const A& a, const B& b) {
  const int64_t M = dst.rows(), N = dst.cols(), K = a.cols();
  const bool by_rows = M >= N;
  const int64_t len = by_rows ? M : N, other = by_rows ? N : M;
  // Blocks of a multiple of 16 rows or columns (column blocks then start on 64-byte lines): about
  // 48 of them (48 shares out evenly over 2, 3, 4, 6, 8, 12, 16, 24 or 48 threads), but none under
  // 128 (each block packs all of the operand that is not split: at most 1/128 of its work) nor
  // under ~4M multiply-adds (~0.1 ms of one core), so that a small GEMM stays one block.
  auto round16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  const int64_t per_line = std::max<int64_t>(1, other * K);
  const int64_t block = std::max({int64_t(128), round16((len + 47) / 48), round16(((int64_t(1) << 22) + per_line - 1) / per_line)});
  const int64_t blocks = (len + block - 1) / block;
  auto run = [&](int64_t i) {
    const gemm_detail::OneEigenThread serial;
    const int64_t i0 = i * block, w = std::min(block, len - i0);
    if (by_rows)
      gemm_detail::product_add(dst.middleRows(i0, w), a.middleRows(i0, w), b);
    else
      gemm_detail::product_add(dst.middleCols(i0, w), a, b.middleCols(i0, w));
  };
  const int64_t threads = std::min<int64_t>(omp_get_max_threads(), blocks);
  if (threads <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < blocks; i++) run(i);
    return;
  }
#pragma omp parallel for num_threads(int(threads)) schedule(static)
  for (int64_t i = 0; i < blocks; i++) run(i);
}

}  // namespace cpu
}  // namespace ul
