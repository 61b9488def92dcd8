// What the CUDA case files of the per-token ops (pointwise, embedding, rope) add to
// cuda_cases_util.h: device buffers placed off 16-byte alignment, and running an op through the
// autograd tape on either device to compare the CUDA op with the CPU one. Written only against the
// CUDA runtime API and the engine, so it serves tests/emu and tests/gpu alike.
#pragma once
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "emu/cuda_cases_util.h"
#include "engine/context.h"
#include "engine/device.h"

namespace op_cases {

using namespace cuda_cases;
using ul_test::randn_f;

// n elements of device memory, NaN-poisoned, starting `offset` elements into the allocation: with
// offset 1, a pointer off 16-byte alignment (the kernels' scalar path).
template <class T>
struct OffsetBuffer {
  DeviceBuffer<T> mem;
  T* p;
  size_t n;
  OffsetBuffer(size_t count, size_t offset) : mem(count + offset), p(mem.p + offset), n(count) {}
  void set(const std::vector<T>& h) { upload(p, h, n); }
  std::vector<T> get() const { return download(p, n); }
};

// ---- running an op through the autograd tape on either device ----------------------------------
// (make_tracked and make_i32 are in cuda_cases_util.h)

struct OpResult {
  std::vector<float> y;
  std::vector<std::vector<float>> grads;  // of the float inputs, in order
};

// A float input of an op: shape, values, and whether it is a weight (f32 gradient slot) or an
// activation (gradient in its own dtype).
struct Input {
  ul::Shape shape;
  std::vector<float> v;
  bool weight;
};

// y = op(c, inputs) on one device and dtype, then backward from dy; everything read back as float.
// op gets the context too, to make any integer inputs it needs on the device.
template <class Op>
OpResult run_op(ul::Device dev, ul::DType dt, const std::vector<Input>& ins, const std::vector<float>& dy, Op op) {
  ul::Context c(dev);
  ul::ContextGuard guard(c);
  ul::Recording rec(true);
  std::vector<ul::Tensor> ts;
  for (const Input& in : ins) ts.push_back(make_tracked(c, in.shape, dt, in.v, in.weight ? ul::DType::f32 : dt));
  const ul::Tensor y = op(c, ts);
  REQUIRE(y.device == dev);
  REQUIRE(y.dtype == dt);
  REQUIRE(y.requires_grad());
  REQUIRE(size_t(y.numel()) == dy.size());
  void* gy = c.tape.grad(y);
  if (dt == ul::DType::bf16) ul::device_copy(gy, dev, to_elem<__nv_bfloat16>(dy).data(), ul::Device::cpu, y.nbytes());
  else ul::device_copy(gy, dev, dy.data(), ul::Device::cpu, y.nbytes());
  // Gradient buffers are taken (zeroed) before backward; the tape forgets activation slots after it.
  std::vector<void*> gs;
  for (const ul::Tensor& t : ts) gs.push_back(c.tape.grad(t));
  c.tape.backward();
  OpResult r{read_floats(y.ptr, size_t(y.numel()), dt == ul::DType::bf16, dev), {}};
  for (size_t i = 0; i < ts.size(); i++)
    r.grads.push_back(read_floats(gs[i], size_t(ts[i].numel()), !ins[i].weight && dt == ul::DType::bf16, dev));
  return r;
}

// The op on Device::cuda (f32 and bf16) against the op on the CPU in f32, on the same (for bf16:
// bf16-representable) random inputs and output gradient. bf16 also rounds y and the stored
// gradients to bf16 along the way: 2^-7 relative. y_abs: the absolute part of y's tolerance.
template <class Op>
void compare_op(const std::string& name, const std::vector<ul::Shape>& shapes, const std::vector<bool>& weights,
                ul::Shape y_shape, Op op) {
  ul::init_cuda_backend();
  for (ul::DType dt : {ul::DType::f32, ul::DType::bf16}) {
    const bool bf = dt == ul::DType::bf16;
    INFO(name << " " << ul::dtype_name(dt));
    auto in = [&](size_t n, uint64_t seed) {
      std::vector<float> v = randn_f(n, seed);
      return bf ? rounded(v) : v;
    };
    std::vector<Input> ins;
    for (size_t i = 0; i < shapes.size(); i++)
      ins.push_back({shapes[i], in(size_t(shapes[i].numel()), 61 + i), weights[i]});
    const std::vector<float> dy = in(size_t(y_shape.numel()), 69);
    const OpResult ref = run_op(ul::Device::cpu, ul::DType::f32, ins, dy, op);
    const OpResult got = run_op(ul::Device::cuda, dt, ins, dy, op);
    const double rel = bf ? 1.0 / 128 : 1e-5;
    expect_close("y", got.y, ref.y, rel, bf ? 1e-3 : 1e-6);
    for (size_t i = 0; i < ins.size(); i++)
      expect_close("gradient of input " + std::to_string(i), got.grads[i], ref.grads[i], rel,
                   1e-5 * std::max(1.0, max_abs(ref.grads[i])));
  }
}

}  // namespace op_cases
