// The fp32 GEMM rate Eigen reaches on this machine: a large square product, the number other
// benchmarks divide by ("GEMM peak measured in the same run"), so their ratios mean the same thing
// on any machine and under any load.
#pragma once
#include <Eigen/Core>
#include <algorithm>
#include <chrono>

// Best GFLOP/s of `reps` timed (n, n)(n, n) products, after one untimed warm-up (first-touch page
// faults, OpenMP thread start). Eigen uses omp_get_max_threads() threads; call it outside any omp
// parallel region.
inline double eigen_gemm_peak_gflops(int n = 2048, int reps = 5) {
  using M = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  M a = M::Random(n, n), b = M::Random(n, n), c(n, n);
  c.noalias() = a * b;
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    auto t0 = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count());
  }
  return 2.0 * double(n) * n * n / best * 1e-9;
}
