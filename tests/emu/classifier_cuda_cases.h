// The fused classifier + cross-entropy on CUDA against the CPU backend: the softmax kernel alone
// against float64, the chunked kernels against cpu::classifier_forward_backward, and the op on
// Device::cuda against the op on the CPU. The same cases run emulated (tests/emu) and on a GPU
// (tests/gpu); the including file picks the Catch2 tag.
//   - dlogits, losses and hits are poisoned before the softmax kernel: unwritten elements fail;
//   - dx and dw start from random values, so `=` instead of `+=` fails; padded vocabulary rows of w
//     are NaN (a read of them poisons the loss) and their dw rows must stay as they were;
//   - ignored targets (-1) are scattered, and fill whole chunks, so chunks are trimmed and skipped;
//   - V below, at and above a warp, not a multiple of 32, and large enough for many threads a row;
//   - f32 within 1e-5 relative; bf16 (x, w, dx, dlogits in bf16, logits, losses, dw in fp32) within
//     1e-2 relative of the gradients' scale (dlogits are rounded to bf16 before the dx/dw GEMMs);
//     dw's increment (dw - dw0) is held to that of each element's own scale, sum_n |dlogits x|, and
//     most elements must be far enough from 0 that a missing term would show;
//   - each token's loss (fp32 from fp32 logits in both dtypes) within 1e-5.
#pragma once
#include "emu/cuda_cases_util.h"
#include "engine/context.h"
#include "engine/device.h"
#include "layers/classifier.h"

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including classifier_cuda_cases.h"
#endif

namespace classifier_cases {
using namespace cuda_cases;

// Targets in [0, V), with about `ignored` of them -1, and rows [lo, hi) all -1 (a whole chunk).
inline std::vector<int32_t> make_targets(int N, int V, uint64_t seed, double ignored, int lo = 0, int hi = 0) {
  std::vector<double> r = ul_test::randn(size_t(N) * 2, seed);
  std::vector<int32_t> t(N);
  for (int n = 0; n < N; n++) {
    const double u = 0.5 * (1 + std::erf(r[2 * n] / std::sqrt(2.0)));  // uniform in (0, 1)
    const double k = 0.5 * (1 + std::erf(r[2 * n + 1] / std::sqrt(2.0)));
    t[n] = u < ignored || (n >= lo && n < hi) ? -1 : std::min(V - 1, int(k * V));
  }
  return t;
}

// The softmax kernel on R rows of V logits against float64.
template <class T>
void check_softmax(int R, int V, bool grad) {
  INFO(type_name<T>() << " softmax R=" << R << " V=" << V << (grad ? " grad" : " no grad"));
  const std::vector<float> logits = ul_test::randn_f(size_t(R) * V, 100 + V, 3.f);
  const std::vector<int32_t> tg = make_targets(R, V, 200 + R, 0.25);
  const float grad_scale = 0.37f;
  std::vector<float> loss_ref(R, 0.f), d_ref(size_t(R) * V, 0.f);
  std::vector<int32_t> hit_ref(R, 0);
  for (int r = 0; r < R; r++) {
    if (tg[r] < 0) continue;
    const float* l = &logits[size_t(r) * V];
    int arg = 0;
    for (int i = 1; i < V; i++)
      if (l[i] > l[arg]) arg = i;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += std::exp(double(l[i]) - l[arg]);
    loss_ref[r] = float(std::log(sum) - (double(l[tg[r]]) - l[arg]));
    hit_ref[r] = arg == tg[r];
    for (int i = 0; i < V; i++)
      d_ref[size_t(r) * V + i] = float((std::exp(double(l[i]) - l[arg]) / sum - (i == tg[r])) * grad_scale);
  }
  DeviceBuffer<float> d_logits(size_t(R) * V), d_loss(R);
  DeviceBuffer<T> d_dl(size_t(R) * V);
  DeviceBuffer<int32_t> d_hit(R), d_tg(R);
  d_logits.set(logits);
  d_tg.set(tg);
  ul::cuda::softmax_cross_entropy<T>(grad ? d_dl.p : nullptr, d_loss.p, d_hit.p, d_logits.p, d_tg.p, R, V, grad_scale,
                                     nullptr);
  expect_close("loss", d_loss.get(), loss_ref, 1e-5, 1e-5);
  CHECK(d_hit.get() == hit_ref);
  if (grad) expect_close("dlogits", to_f32(d_dl.get()), d_ref, is_bf16<T>() ? 1.0 / 256 : 1e-5, 1e-7);
  else CHECK(std::isnan(to_f32(d_dl.get())[0]));  // no gradient asked: dlogits untouched
}

// dw's scale, element by element: the sum over valid rows of |dlogits[n][v] x[n][c]|, dlogits =
// grad_scale (softmax - one-hot), in double from the inputs as the device reads them. dw's increment
// is held to a fraction of this, not of |dw0 + dw|: added to dw0 ~ N(0, 1), a bound relative to the
// sum would let a dw missing the softmax term for most of the vocabulary through.
inline std::vector<double> dw_scale(const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<int32_t>& tg, int N, int C, int V, float grad_scale) {
  std::vector<double> scale(size_t(V) * C, 0.0), p(V);
  for (int n = 0; n < N; n++) {
    if (tg[n] < 0) continue;
    double top = -1e300, sum = 0;
    for (int v = 0; v < V; v++) {
      double l = 0;
      for (int c = 0; c < C; c++) l += double(x[size_t(n) * C + c]) * w[size_t(v) * C + c];
      p[v] = l, top = std::max(top, l);
    }
    for (int v = 0; v < V; v++) sum += p[v] = std::exp(p[v] - top);
    for (int v = 0; v < V; v++) {
      const double d = grad_scale * std::fabs(p[v] / sum - (v == tg[n]));
      for (int c = 0; c < C; c++) scale[size_t(v) * C + c] += d * std::fabs(x[size_t(n) * C + c]);
    }
  }
  return scale;
}

// got - base against want - base, each within rel * scale plus the float rounding of adding onto
// base (base empty: zero); and at least half the elements with a scale must have an increment of
// ten tolerances or more, so that the check tells the gradient from none.
inline void expect_increment(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                             const std::vector<float>& base, const std::vector<double>& scale, double rel) {
  INFO(what);
  size_t bad = 0, worst_i = 0, scaled = 0, telling = 0;
  double worst = 0;
  for (size_t i = 0; i < scale.size(); i++) {
    const double b = base.empty() ? 0.0 : base[i], inc = double(got[i]) - b, want_inc = double(want[i]) - b;
    const double tol = rel * scale[i] + 2 * 0x1p-24 * (std::fabs(b) + std::fabs(double(want[i])) + std::fabs(double(got[i])));
    const double err = std::fabs(inc - want_inc);
    if (!(err <= tol)) bad++;
    const double score = tol > 0 ? err / tol : (err > 0 ? 1e300 : 0.0);
    if (!(score <= worst)) worst = score, worst_i = i;
    if (scale[i] > 0) scaled++, telling += std::fabs(want_inc) >= 10 * tol;
  }
  INFO("worst: element " << worst_i << ", " << worst << " of its tolerance; " << telling << " of " << scaled
                         << " elements with a scale tell the gradient from none");
  CHECK(bad == 0);
  CHECK(2 * telling >= scaled);
}

// softmax_cross_entropy's row staging set for a scope (0 where the row fits, 1 never, 2 always).
struct RowStaging {
  int old;
  explicit RowStaging(int mode) : old(ul::cuda::set_softmax_row_staging(mode)) {}
  ~RowStaging() { ul::cuda::set_softmax_row_staging(old); }
};

// The softmax kernel on R rows of V logits ld apart, starting `offset` floats into a buffer (an
// offset of 1 makes the rows 4-byte, not 16-byte, aligned), with the row staged in shared memory
// (2) and read twice from global memory (1): the same bits of loss, hit and dlogits, and the
// elements past V of each dlogits row left as they were. in_place (T = float): dlogits is the
// logits buffer. Every row has a target but the last of two or more, which is ignored.
template <class T>
void check_staging_same_bits(int R, int V, int ld, int offset, bool in_place) {
  INFO(type_name<T>() << " R=" << R << " V=" << V << " ld=" << ld << " offset=" << offset
                      << (in_place ? " in place" : ""));
  const size_t n = size_t(R) * ld + offset;
  std::vector<float> logits = ul_test::randn_f(n, 300 + V, 4.f);
  std::vector<int32_t> tg = make_targets(R, V, 400 + R, 0.0);
  if (R > 1) tg[R - 1] = -1;  // an ignored row among them
  struct Out {
    std::vector<float> loss, dl;
    std::vector<int32_t> hit;
  };
  auto run = [&](int mode) {
    RowStaging staging(mode);
    DeviceBuffer<float> d_logits(n), d_loss(R);
    DeviceBuffer<T> d_dl(n);
    DeviceBuffer<int32_t> d_hit(R), d_tg(R);
    d_logits.set(logits);
    d_tg.set(tg);
    T* dl = in_place ? reinterpret_cast<T*>(d_logits.p) : d_dl.p;
    ul::cuda::softmax_cross_entropy<T>(dl + offset, d_loss.p, d_hit.p, d_logits.p + offset, d_tg.p, R, V, 0.61f,
                                       nullptr, ld);
    Out o{d_loss.get(), in_place ? d_logits.get() : to_f32(d_dl.get()), d_hit.get()};
    for (int r = 0; r < R; r++)  // past V: the logits (in place) or the poison, untouched
      for (int i = V; i < ld; i++) {
        const size_t k = offset + size_t(r) * ld + i;
        if (in_place ? !same_bits(std::vector<float>{o.dl[k]}, std::vector<float>{logits[k]}) : !std::isnan(o.dl[k]))
          FAIL("mode " << mode << ": row " << r << " element " << i << " past V was written");
      }
    return o;
  };
  const Out twice = run(1), staged = run(2);
  CHECK(same_bits(staged.loss, twice.loss));
  CHECK(staged.hit == twice.hit);
  CHECK(same_bits(staged.dl, twice.dl));
}

struct Case {
  int N, C, V, Vp, chunk_rows;
};
const Case kCases[] = {{1, 1, 1, 1, 1}, {5, 3, 7, 8, 2}, {23, 17, 33, 40, 6}, {40, 24, 100, 100, 7},
                       {12, 8, 1500, 1536, 5}};

template <class T>
void check_chunks(const Case& k) {
  const int N = k.N, C = k.C, V = k.V, Vp = k.Vp;
  const bool bf = is_bf16<T>();
  INFO(type_name<T>() << " N=" << N << " C=" << C << " V=" << V << " Vp=" << Vp << " chunk_rows=" << k.chunk_rows);
  const std::vector<float> x = inputs<T>(size_t(N) * C, 1 + N), dx0 = inputs<T>(size_t(N) * C, 3),
                           dw0 = ul_test::randn_f(size_t(Vp) * C, 4);
  std::vector<float> w = inputs<T>(size_t(Vp) * C, 2 + V);
  // A chunk's worth of ignored rows in the middle (when there is room), and scattered ones.
  const std::vector<int32_t> tg = make_targets(N, V, 5 + N, 0.2, N / 3, N / 3 + k.chunk_rows + 1);
  const float grad_scale = 1.f / 3;

  std::vector<float> dx_ref = dx0, dw_ref = dw0;
  const ul::CrossEntropyStats ref = ul::cpu::classifier_forward_backward<float>(
      dx_ref.data(), dw_ref.data(), x.data(), w.data(), tg.data(), N, C, V, grad_scale, k.chunk_rows);
  for (size_t i = size_t(V) * C; i < w.size(); i++) w[i] = NAN;  // padding rows: never read

  DeviceBuffer<T> d_x(size_t(N) * C), d_w(size_t(Vp) * C), d_dx(size_t(N) * C);
  DeviceBuffer<float> d_dw(size_t(Vp) * C);
  DeviceBuffer<int32_t> d_tg(N);
  DeviceBuffer<char> scratch(
      ul::cuda::classifier_scratch_bytes(N, V, k.chunk_rows, bf ? ul::DType::bf16 : ul::DType::f32));
  d_x.set(to_elem<T>(x));
  d_w.set(to_elem<T>(w));
  d_tg.set(tg);
  auto run = [&](bool grad) {
    d_dx.set(to_elem<T>(dx0));
    d_dw.set(dw0);
    scratch.poison();
    return ul::cuda::classifier_forward_backward<T>(grad ? d_dx.p : nullptr, grad ? d_dw.p : nullptr, d_x.p, d_w.p,
                                                    d_tg.p, tg.data(), N, C, V, grad_scale, k.chunk_rows, scratch.p,
                                                    nullptr);
  };
  const ul::CrossEntropyStats got = run(true);
  CHECK(got.n_valid == ref.n_valid);
  CHECK(got.n_correct == ref.n_correct);
  CHECK(std::fabs(got.loss_sum - ref.loss_sum) <= 1e-5 * std::max(1.0, std::fabs(ref.loss_sum)));
  const std::vector<float> dw1 = d_dw.get();
  // dx sums V terms of |dlogits w| (dlogits summing to at most 2 grad_scale per row), dw sums N of |dlogits x|.
  const double rel = bf ? 1e-2 : 1e-5;
  const double w_max = max_abs(std::vector<float>(w.begin(), w.begin() + size_t(V) * C));
  expect_close("dx", to_f32(d_dx.get()), dx_ref, rel, rel * grad_scale * std::max(1.0, w_max));
  const std::vector<double> scale = dw_scale(x, w, tg, N, C, V, grad_scale);
  expect_increment("dw", std::vector<float>(dw1.begin(), dw1.begin() + size_t(V) * C),
                   std::vector<float>(dw_ref.begin(), dw_ref.begin() + size_t(V) * C),
                   std::vector<float>(dw0.begin(), dw0.begin() + size_t(V) * C), scale, rel);
  for (size_t i = size_t(V) * C; i < dw1.size(); i++)
    if (dw1[i] != dw0[i]) FAIL("dw padding row element " << i << " changed");

  // Deterministic: the same loss and dw bits again.
  const ul::CrossEntropyStats again = run(true);
  CHECK(again.loss_sum == got.loss_sum);
  CHECK(same_bits(d_dw.get(), dw1));
  // Without gradients: the same stats, dx and dw untouched.
  const ul::CrossEntropyStats nograd = run(false);
  CHECK(nograd.loss_sum == got.loss_sum);
  CHECK(nograd.n_correct == got.n_correct);
  CHECK(same_bits(to_f32(d_dx.get()), to_f32(to_elem<T>(dx0))));
  CHECK(same_bits(d_dw.get(), dw0));
}

struct OpResult {
  ul::CrossEntropyStats st;
  std::vector<float> dx, dw, rows;  // rows: each token's loss
};

// The op on one device and dtype, gradients read back as float (w tracked with an f32 gradient).
inline OpResult run_op(ul::Device dev, ul::DType dt, int B, int T, int C, int V, int Vp, const std::vector<float>& x,
                       const std::vector<float>& w, const std::vector<int32_t>& tg, float grad_scale) {
  ul::Context c(dev);
  ul::ContextGuard guard(c);
  ul::Recording rec(true);
  const bool bf = dt == ul::DType::bf16;
  // Activations get a gradient slot of their own dtype; weights an f32 one, as every parameter has.
  auto make = [&](ul::Shape s, const std::vector<float>& v, bool param) {
    return make_tracked(c, s, dt, v, param ? ul::DType::f32 : dt);
  };
  ul::Tensor tx = make({B, T, C}, x, false), tw = make({Vp, C}, w, true);
  ul::Tensor tt = make_i32(c, {B, T}, tg);
  OpResult r;
  r.rows.assign(size_t(B) * T, NAN);  // every row written: 0 where ignored
  r.st = ul::classifier_cross_entropy(tx, tw, tt, V, grad_scale, r.rows.data());
  const size_t nx = size_t(B) * T * C, nw = size_t(Vp) * C;
  r.dx.resize(nx);
  r.dw.resize(nw);
  if (bf) {
    std::vector<__nv_bfloat16> h(nx);
    ul::device_copy(h.data(), ul::Device::cpu, c.tape.grad(tx), dev, nx * 2);
    r.dx = to_f32(h);
  } else {
    ul::device_copy(r.dx.data(), ul::Device::cpu, c.tape.grad(tx), dev, nx * 4);
  }
  ul::device_copy(r.dw.data(), ul::Device::cpu, c.tape.grad(tw), dev, nw * 4);
  return r;
}

}  // namespace classifier_cases

TEST_CASE("classifier softmax kernel matches float64: loss, first argmax, dlogits, ignored rows",
          UL_CUDA_TEST_TAG "[classifier]") {
  // The row read twice from global memory, and staged in shared memory (16-byte copies where V is
  // a multiple of 4, 4-byte ones where the packed rows are not 16-byte aligned).
  for (int staging : {1, 2}) {
    INFO("row staging " << staging);
    classifier_cases::RowStaging set(staging);
    for (int V : {1, 5, 32, 77, 1000, 4099})
      for (bool grad : {true, false}) {
        classifier_cases::check_softmax<float>(9, V, grad);
        classifier_cases::check_softmax<__nv_bfloat16>(9, V, grad);
      }
  }
}

TEST_CASE("classifier softmax stages the row in shared memory where it fits, with the bits of reading it twice",
          UL_CUDA_TEST_TAG "[classifier]") {
  using classifier_cases::check_staging_same_bits;
  ul::init_cuda_backend();
  REQUIRE(ul::cuda::set_softmax_row_staging(0) == 0);  // the default, as every other test runs
  // First (an opt-in lasts for the process, so before any longer row): a row of 48 KiB, which with
  // the kernel's static shared memory is past the 48 KiB a block may take without opting in.
  check_staging_same_bits<__nv_bfloat16>(2, 12288, 12288, 0, false);
  // GPT-2's vocabulary in its padded rows (16-byte copies, the last one partial) where a block
  // holds it (an H100 or H200, and the emulated GPU; not an A100 or a desktop GPU), 4-byte copies
  // (a stride that is not a multiple of 4; rows starting 4 bytes past an aligned address), in
  // place (T = float: dlogits is the logits buffer), and bf16 dlogits.
  if (ul::cuda::softmax_row_staged(50257)) {
    check_staging_same_bits<float>(3, 50257, 50304, 0, false);
    check_staging_same_bits<__nv_bfloat16>(3, 50257, 50304, 0, false);
    check_staging_same_bits<float>(2, 50257, 50304, 0, true);
  } else {
    WARN("this GPU's blocks cannot hold a row of GPT-2's 50257 logits: those cases are skipped");
  }
  check_staging_same_bits<float>(5, 4099, 4099, 0, true);
  check_staging_same_bits<__nv_bfloat16>(6, 77, 80, 1, false);
  check_staging_same_bits<float>(6, 77, 81, 1, true);

  // The longest row a block can hold (static shared memory counted: a launch of it must run), one
  // longer is read twice by default and refused under 2.
  int longest = int(ul::cuda_smem_optin() / 4);
  while (longest > 0 && !ul::cuda::softmax_row_staged(longest)) longest--;
  INFO("longest staged row: " << longest);
  REQUIRE(longest > 12288);  // every GPU the kernels run on (sm_80 and newer) opts in to 99 KiB or more
  check_staging_same_bits<__nv_bfloat16>(1, longest, longest, 0, false);
  const int too_long = longest + 1;
  CHECK_FALSE(ul::cuda::softmax_row_staged(too_long));
  {
    classifier_cases::RowStaging never(1);
    CHECK_FALSE(ul::cuda::softmax_row_staged(4099));
  }
  classifier_cases::RowStaging always(2);
  CHECK_THROWS_WITH(ul::cuda::softmax_row_staged(too_long),
                    Catch::Contains("softmax_cross_entropy") && Catch::Contains("shared memory"));
  CHECK_THROWS_WITH(ul::cuda::set_softmax_row_staging(3), Catch::Contains("0 (where a block can hold the row)"));
}

TEST_CASE("classifier argmax on CUDA is the first maximum", UL_CUDA_TEST_TAG "[classifier]") {
  using namespace cuda_cases;
  const int V = 300;
  std::vector<float> logits(size_t(2) * V, 0.f);
  logits[250] = logits[40] = logits[290] = 2.f;  // row 0: ties, the first is 40 (not the first thread's)
  logits[V + 299] = logits[V + 33] = 1.f;        // row 1: ties at 33 and 299
  DeviceBuffer<float> d_logits(logits.size()), d_loss(2);
  DeviceBuffer<int32_t> d_hit(2), d_tg(2);
  d_logits.set(logits);
  d_tg.set({40, 299});
  ul::cuda::softmax_cross_entropy<float>(nullptr, d_loss.p, d_hit.p, d_logits.p, d_tg.p, 2, V, 1.f, nullptr);
  CHECK(d_hit.get() == std::vector<int32_t>{1, 0});
}

TEST_CASE("classifier softmax: a NaN logit anywhere makes the row's loss NaN, as on the CPU",
          UL_CUDA_TEST_TAG "[classifier]") {
  // A thread whose every logit was NaN kept a -inf max and a NaN sum, which the combine dropped as
  // an empty set's: below V = 64 (32 threads a row) a NaN in a thread's only logit left the loss
  // finite (an eval of a model gone bad read finite on CUDA, NaN on the CPU).
  using namespace cuda_cases;
  for (int V : {27, 40, 63, 64, 300, 1000}) {
    for (int at : {1, V / 2, V - 1}) {
      for (bool grad : {false, true}) {
        INFO("V " << V << ", NaN at " << at << (grad ? ", grad" : ""));
        std::vector<float> logits = ul_test::randn_f(size_t(V), 7 + V);
        logits[size_t(at)] = NAN;
        DeviceBuffer<float> d_logits(logits.size()), d_loss(1), d_dl(logits.size());
        DeviceBuffer<int32_t> d_hit(1), d_tg(1);
        d_logits.set(logits);
        d_tg.set({0});
        ul::cuda::softmax_cross_entropy<float>(grad ? d_dl.p : nullptr, d_loss.p, d_hit.p, d_logits.p, d_tg.p, 1, V,
                                               1.f, nullptr);
        CHECK(std::isnan(d_loss.get()[0]));
      }
    }
  }
}

TEST_CASE("classifier CUDA chunks match the CPU backend (f32)", UL_CUDA_TEST_TAG "[classifier]") {
  for (const auto& k : classifier_cases::kCases) classifier_cases::check_chunks<float>(k);
}

TEST_CASE("classifier CUDA chunks match the CPU backend (bf16, fp32 dw)", UL_CUDA_TEST_TAG "[classifier]") {
  for (const auto& k : classifier_cases::kCases) classifier_cases::check_chunks<__nv_bfloat16>(k);
}

TEST_CASE("classifier op on Device::cuda matches the op on the CPU", UL_CUDA_TEST_TAG "[classifier]") {
  using namespace cuda_cases;
  ul::init_cuda_backend();
  const int B = 3, T = 11, C = 16, V = 50, Vp = 64;
  const std::vector<int32_t> tg = classifier_cases::make_targets(B * T, V, 77, 0.3);
  const float grad_scale = 0.05f;
  for (ul::DType dt : {ul::DType::f32, ul::DType::bf16}) {
    const bool bf = dt == ul::DType::bf16;
    INFO(ul::dtype_name(dt));
    auto in = [&](size_t n, uint64_t seed) {
      std::vector<float> v = ul_test::randn_f(n, seed);
      return bf ? rounded(v) : v;
    };
    const std::vector<float> x = in(size_t(B) * T * C, 21), w = in(size_t(Vp) * C, 22);
    const auto ref = classifier_cases::run_op(ul::Device::cpu, ul::DType::f32, B, T, C, V, Vp, x, w, tg, grad_scale);
    const auto got = classifier_cases::run_op(ul::Device::cuda, dt, B, T, C, V, Vp, x, w, tg, grad_scale);
    CHECK(got.st.n_valid == ref.st.n_valid);
    CHECK(got.st.n_correct == ref.st.n_correct);
    CHECK(std::fabs(got.st.loss_sum - ref.st.loss_sum) <= 1e-5 * std::fabs(ref.st.loss_sum));
    const double rel = bf ? 1e-2 : 1e-5;
    expect_close("dx", got.dx, ref.dx, rel, rel * grad_scale * max_abs(w));
    const std::vector<double> scale = classifier_cases::dw_scale(x, w, tg, B * T, C, V, grad_scale);
    classifier_cases::expect_increment("dw", std::vector<float>(got.dw.begin(), got.dw.begin() + size_t(V) * C),
                                       std::vector<float>(ref.dw.begin(), ref.dw.begin() + size_t(V) * C), {}, scale, rel);
    // The padded vocabulary rows get no gradient.
    CHECK(std::all_of(got.dw.begin() + size_t(V) * C, got.dw.end(), [](float v) { return v == 0.f; }));
    expect_close("per-token loss", got.rows, ref.rows, 1e-5, 1e-6);
  }
}

TEST_CASE("classifier op on Device::cuda rejects bad targets and shapes", UL_CUDA_TEST_TAG "[classifier]") {
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  ul::Tensor x = c.zeros({4, 8}), w = c.zeros({10, 8}), tg = c.zeros({4}, ul::DType::i32);
  const std::vector<int32_t> bad{0, 3, 10, -1};
  ul::copy_from_host(tg, bad.data());
  CHECK_THROWS_WITH(ul::classifier_cross_entropy(x, w, tg, 10, 1.f), Catch::Contains("target 10 at index 2"));
  CHECK_THROWS_WITH(ul::classifier_cross_entropy(x, w, tg, 11, 1.f), Catch::Contains("weight must be"));
  CHECK_THROWS_WITH(ul::classifier_cross_entropy(x, w, c.zeros({3}, ul::DType::i32), 10, 1.f),
                    Catch::Contains("3 targets for 4 rows"));
  ul::Tensor tg0 = c.zeros({4}, ul::DType::i32), w16 = c.zeros({10, 8}, ul::DType::bf16);
  CHECK_THROWS_WITH(ul::classifier_cross_entropy(x, w16, tg0, 10, 1.f),
                    Catch::Contains("classifier_cross_entropy") && Catch::Contains("bf16"));
}

namespace classifier_cases {
// Chunks whose first or last valid target is class 0 (beside ignored rows and whole ignored
// chunks): trimming a chunk to its valid targets must keep those rows, as the CPU scores them.
template <class T>
void check_target_zero_at_chunk_edges() {
  const int N = 8, C = 8, V = 5, chunk_rows = 3;
  INFO(type_name<T>());
  const std::vector<int32_t> tg{0, 2, 0, 0, -1, 0, -1, 0};  // chunks {0, 2, 0}, {0, -1, 0}, {-1, 0}
  const std::vector<float> x = inputs<T>(size_t(N) * C, 61), w = inputs<T>(size_t(V) * C, 62),
                           dx0 = inputs<T>(size_t(N) * C, 63), dw0 = ul_test::randn_f(size_t(V) * C, 64);
  const float grad_scale = 0.25f;
  std::vector<float> dx_ref = dx0, dw_ref = dw0;
  const ul::CrossEntropyStats ref = ul::cpu::classifier_forward_backward<float>(
      dx_ref.data(), dw_ref.data(), x.data(), w.data(), tg.data(), N, C, V, grad_scale, chunk_rows);
  DeviceBuffer<T> d_x(size_t(N) * C), d_w(size_t(V) * C), d_dx(size_t(N) * C);
  DeviceBuffer<float> d_dw(size_t(V) * C);
  DeviceBuffer<int32_t> d_tg(N);
  DeviceBuffer<char> scratch(
      ul::cuda::classifier_scratch_bytes(N, V, chunk_rows, is_bf16<T>() ? ul::DType::bf16 : ul::DType::f32));
  d_x.set(to_elem<T>(x));
  d_w.set(to_elem<T>(w));
  d_dx.set(to_elem<T>(dx0));
  d_dw.set(dw0);
  d_tg.set(tg);
  std::vector<float> rows(N, NAN);
  const ul::CrossEntropyStats got = ul::cuda::classifier_forward_backward<T>(
      d_dx.p, d_dw.p, d_x.p, d_w.p, d_tg.p, tg.data(), N, C, V, grad_scale, chunk_rows, scratch.p, nullptr,
      rows.data());
  CHECK(got.n_valid == ref.n_valid);
  CHECK(got.n_correct == ref.n_correct);
  CHECK(std::fabs(got.loss_sum - ref.loss_sum) <= 1e-5 * std::max(1.0, std::fabs(ref.loss_sum)));
  for (int n = 0; n < N; n++) {
    INFO("row " << n << " target " << tg[n]);
    CHECK((tg[n] < 0 ? rows[n] == 0.f : rows[n] > 0.f));  // a valid target's loss is -log p > 0
  }
  const double rel = is_bf16<T>() ? 1e-2 : 1e-5;
  expect_close("dx", to_f32(d_dx.get()), dx_ref, rel, rel * grad_scale * std::max(1.0, max_abs(w)));
  expect_close("dw", d_dw.get(), dw_ref, rel, rel * grad_scale * std::max(1.0, max_abs(x)));
}
}  // namespace classifier_cases

TEST_CASE("classifier CUDA chunks score target 0 where it starts or ends a chunk", UL_CUDA_TEST_TAG "[classifier]") {
  classifier_cases::check_target_zero_at_chunk_edges<float>();
  classifier_cases::check_target_zero_at_chunk_edges<__nv_bfloat16>();
}
