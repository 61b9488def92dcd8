// The pieces the CPU flash loops share: layers/attention.cpp (the training op) and
// engine/sample.cpp (the KV-cache attention of sampling). Row-major Eigen tiles over per-thread
// scratch, and the online-softmax step that folds one key tile into the running output.
#pragma once
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace ul {
namespace cpu {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Tile = Eigen::Map<Mat<T>>;  // per-thread scratch, contiguous
// n consecutive tokens of one head inside a packed tensor: rows of D, `stride` elements apart.
template <class T>
using HeadRows = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstHeadRows = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;

template <class T>
ConstHeadRows<T> rows(const T* base, int64_t off, int n, int D, int64_t stride) {
  return ConstHeadRows<T>(base + off, n, D, Eigen::OuterStride<>(stride));
}
template <class T>
HeadRows<T> rows(T* base, int64_t off, int n, int D, int64_t stride) {
  return HeadRows<T>(base + off, n, D, Eigen::OuterStride<>(stride));
}

// Per-thread scratch whose start is 64-byte aligned. Eigen handles an unaligned head of a row with
// scalar code (another exp, another summation order), so a buffer wherever malloc put it would make
// results depend on addresses; aligned, they depend only on the shapes (deterministic).
template <class T>
struct Scratch {
  explicit Scratch(size_t n) : buf(n + 64 / sizeof(T)) {
    void* p = buf.data();
    size_t space = buf.size() * sizeof(T);
    data = static_cast<T*>(std::align(64, n * sizeof(T), p, space));
  }
  std::vector<T> buf;
  T* data;
};

// One key tile of the online softmax. S (nq, nk): the tile's scaled scores, masked entries -inf;
// m, l (nq): each row's running max of the scores and sum of exp(score - max); acc (nq, D): the
// unnormalised output so far. Rescales acc and l to the new max and turns S into exp(S - max);
// the caller then adds S v into acc (after zeroing masked entries: exp(-inf) is not exactly 0 in
// Eigen's vectorised exp). A row with nothing visible yet gets zeros. A NaN score makes the row's
// whole output NaN: the vectorised max may skip it, but then exp(NaN - max) carries it into l and
// acc; only a row whose other entries are all masked (its max -inf) is looked at again, since
// that read as "nothing visible" (std::max(-inf, NaN) is -inf too) and dropped the NaN, a finite
// wrong output where NaN must show. (Eigen's NaN-propagating max compiles to scalar compares:
// the forward took 10-15% longer with it.)
template <class T>
void online_softmax_tile(Tile<T>& S, T* m, T* l, Tile<T>& acc) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int i = 0; i < S.rows(); i++) {
    T tile_max = S.row(i).maxCoeff();
    if (tile_max == ninf && S.row(i).hasNaN()) tile_max = std::numeric_limits<T>::quiet_NaN();
    const T m_new = std::isnan(tile_max) ? tile_max : std::max(m[i], tile_max);
    if (m_new == ninf) {
      S.row(i).setZero();
      continue;
    }
    const T alpha = std::exp(m[i] - m_new);  // rescales what was summed under the old max
    S.row(i) = (S.row(i).array() - m_new).exp();
    m[i] = m_new;
    l[i] = l[i] * alpha + S.row(i).sum();
    acc.row(i) *= alpha;
  }
}

}  // namespace cpu
}  // namespace ul
