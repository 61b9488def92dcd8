// Sums over rows (a norm's weight and bias gradients) that come out bit for bit the same whatever
// the OpenMP thread count or timing: the rows are cut into chunks fixed by N alone, one thread sums
// a chunk in row order into its own partial, and the partials are added in chunk order. (Partials
// per thread added under `omp critical` arrive in whatever order the threads finish, and float
// addition is not associative: the last bits of a step's gradient changed from run to run.)
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace ul {
namespace cpu {

// per_row(n, sums) does row n's own work and adds its W terms into sums[0..W); returns the W sums
// over every row.
template <class T, class F>
std::vector<T> chunked_row_sums(int N, int W, F&& per_row) {
  // About N / 16 chunks (each of more than 8 rows, 16 when N is a multiple), at most 256: enough to
  // keep the cores of a machine busy on a short micro-batch (GPT-2 124M at B = 4, T = 64: 16
  // chunks), few enough that the partials stay small (8 MiB at most for two sums of 4096 columns).
  const int K = std::max(1, std::min(256, (N + 15) / 16));
  std::vector<T> parts(size_t(K) * size_t(W), T(0));
#pragma omp parallel for schedule(static)
  for (int k = 0; k < K; k++) {
    T* p = parts.data() + size_t(k) * size_t(W);
    const int end = int(int64_t(N) * (k + 1) / K);
    for (int n = int(int64_t(N) * k / K); n < end; n++) per_row(n, p);
  }
  std::vector<T> sums(parts.begin(), parts.begin() + W);
  for (int k = 1; k < K; k++)
    for (int i = 0; i < W; i++) sums[size_t(i)] += parts[size_t(k) * size_t(W) + size_t(i)];
  return sums;
}

}  // namespace cpu
}  // namespace ul
