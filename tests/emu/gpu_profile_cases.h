// The per-op GPU profile (engine/gpu_profile.h): what it records and what it leaves alone.
// Emulated (tests/emu/test_gpu_profile.cpp) and on a GPU (tests/gpu/test_gpu_profile_gpu.cpp).
#pragma once
#include "emu/cuda_cases_util.h"
#include "engine/context.h"
#include "engine/device.h"
#include "engine/gemm.h"
#include "engine/gpu_profile.h"
#include "layers/gelu.h"
#include "layers/residual.h"

#include <future>
#include <thread>

#ifndef UL_CUDA_TEST_TAG
#error "define UL_CUDA_TEST_TAG (\"[emu]\" or \"[gpu]\") before including gpu_profile_cases.h"
#endif

namespace gpu_profile_cases {

inline const ul::gpu_profile::Row* find(const std::vector<ul::gpu_profile::Row>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

// Two residual adds, a GELU, two GEMMs of one shape and one of another, a memset.
inline void some_ops(ul::Context& c) {
  ul::Tensor x = c.zeros({4, 96}), y = c.zeros({4, 96});
  ul::Tensor s = ul::add(ul::add(x, y), y);
  ul::Tensor g = ul::gelu(s);
  cuda_cases::DeviceBuffer<float> a(6 * 5), b(5 * 7), d(6 * 7);
  a.set(std::vector<float>(a.n, 1.f));
  b.set(std::vector<float>(b.n, 1.f));
  for (int i = 0; i < 2; i++) ul::cuda::gemm<float, float>(d.p, a.p, b.p, nullptr, 6, 7, 5, false, false, false, "t", nullptr);
  ul::cuda::gemm<float, float>(d.p, a.p, b.p, nullptr, 6, 7, 1, false, false, false, "t", nullptr);
  // No product, a bias: the GEMM launches its bias kernel inside its own span.
  cuda_cases::DeviceBuffer<float> bias(7);
  bias.set(std::vector<float>(bias.n, 2.f));
  ul::cuda::gemm<float, float>(d.p, a.p, b.p, bias.p, 6, 7, 0, false, false, false, "t", nullptr);
  ul::device_zero(c.device, g.ptr, g.nbytes());
}

}  // namespace gpu_profile_cases

TEST_CASE("gpu profile: a row per kernel name and GEMM shape, with calls and FLOPs", UL_CUDA_TEST_TAG "[profile]") {
  using namespace gpu_profile_cases;
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  some_ops(c);  // unrecorded: the profile is off
  CHECK_FALSE(ul::gpu_profile::enabled());
  CHECK(ul::gpu_profile::report().empty());

  ul::gpu_profile::start();
  CHECK(ul::gpu_profile::enabled());
  some_ops(c);
  ul::gpu_profile::stop();
  some_ops(c);  // after stop(): not recorded either
  const std::vector<ul::gpu_profile::Row> rows = ul::gpu_profile::report();
  // The whole report in the failure message (an INFO inside a loop would end with the loop's body).
  INFO(ul::gpu_profile::table(rows, 0));

  const auto* add = find(rows, "residual_forward");
  REQUIRE(add != nullptr);
  CHECK(add->calls == 2);
  CHECK(add->flops == 0);
  const auto* gelu = find(rows, "gelu_forward");
  REQUIRE(gelu != nullptr);
  CHECK(gelu->calls == 1);
  const auto* g5 = find(rows, ul::cuda::gemm_profile_name("t", 6, 7, 5));
  REQUIRE(g5 != nullptr);
  CHECK(g5->calls == 2);
  CHECK(g5->flops == 2 * 2.0 * 6 * 7 * 5);
  const auto* g1 = find(rows, "t M=6 N=7 K=1");
  REQUIRE(g1 != nullptr);
  CHECK(g1->calls == 1);
  // The bias kernel's time is the GEMM's row, not a row of its own as well.
  const auto* g0 = find(rows, "t M=6 N=7 K=0");
  REQUIRE(g0 != nullptr);
  CHECK(g0->calls == 1);
  CHECK(find(rows, "gemm_bias_rows") == nullptr);
  const auto* memset = find(rows, "cudaMemset");
  REQUIRE(memset != nullptr);
  CHECK(memset->calls >= 1);
  for (size_t i = 0; i < rows.size(); i++) {
    CHECK(rows[i].ms >= 0);
    if (i) CHECK(rows[i - 1].ms >= rows[i].ms);  // the longest first
  }
  // report() dropped what it returned.
  CHECK(ul::gpu_profile::report().empty());
}

TEST_CASE("gpu profile: a span inside another records nothing of its own", UL_CUDA_TEST_TAG "[profile]") {
  using namespace gpu_profile_cases;
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  ul::Tensor x = c.zeros({3, 5});
  ul::gpu_profile::start();
  {
    ul::gpu_profile::Span outer;
    outer.begin("outer op", nullptr);
    ul::add(x, x);  // its kernel's span opens inside the outer one
  }
  ul::add(x, x);  // and alone, a row of its own
  ul::gpu_profile::stop();
  const auto rows = ul::gpu_profile::report();
  const auto* outer = find(rows, "outer op");
  REQUIRE(outer != nullptr);
  CHECK(outer->calls == 1);
  const auto* add = find(rows, "residual_forward");
  REQUIRE(add != nullptr);
  CHECK(add->calls == 1);
}

TEST_CASE("gpu profile: start() drops an earlier run's records", UL_CUDA_TEST_TAG "[profile]") {
  using namespace gpu_profile_cases;
  ul::init_cuda_backend();
  ul::Context c(ul::Device::cuda);
  ul::ContextGuard guard(c);
  ul::gpu_profile::start();
  some_ops(c);
  ul::gpu_profile::start();
  ul::Tensor x = c.zeros({3, 5});
  ul::add(x, x);
  ul::gpu_profile::stop();
  const auto rows = ul::gpu_profile::report();
  const auto* add = find(rows, "residual_forward");
  REQUIRE(add != nullptr);
  CHECK(add->calls == 1);
  CHECK(find(rows, "gelu_forward") == nullptr);
}

TEST_CASE("gpu profile: each host thread records its own ops (local ranks are threads)", UL_CUDA_TEST_TAG "[profile]") {
  using namespace gpu_profile_cases;
  ul::init_cuda_backend();
  // Thread A starts profiling; then thread B runs three adds; then A runs one add and reports.
  std::promise<void> a_started, b_done;
  std::vector<ul::gpu_profile::Row> rows_a;
  bool b_saw_profile = true;
  std::thread a([&] {
    ul::Context c(ul::Device::cuda);
    ul::ContextGuard guard(c);
    ul::Tensor x = c.zeros({2, 8});
    ul::gpu_profile::start();
    a_started.set_value();
    b_done.get_future().wait();
    ul::add(x, x);
    ul::gpu_profile::stop();
    rows_a = ul::gpu_profile::report();
  });
  std::thread b([&] {
    ul::Context c(ul::Device::cuda);
    ul::ContextGuard guard(c);
    ul::Tensor x = c.zeros({2, 8});
    a_started.get_future().wait();
    b_saw_profile = ul::gpu_profile::enabled();
    for (int i = 0; i < 3; i++) ul::add(x, x);
    b_done.set_value();
  });
  a.join();
  b.join();
  CHECK_FALSE(b_saw_profile);
  const auto* add = find(rows_a, "residual_forward");
  REQUIRE(add != nullptr);
  CHECK(add->calls == 1);
}
