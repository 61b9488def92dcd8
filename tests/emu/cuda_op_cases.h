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
// op gets the context too, to make any integer inputs it needs on the device. The inputs'
// gradients: with `g0` (one per input) taken before the backward and filled with it, so the op's
// backward adds to what is there; without, left to the op, whose first writer stores into an
// unzeroed buffer (Tape::grad_to_overwrite), read by a node that runs after the op's backward.
template <class Op>
OpResult run_op(ul::Device dev, ul::DType dt, const std::vector<Input>& ins, const std::vector<float>& dy, Op op,
                const std::vector<std::vector<float>>* g0 = nullptr) {
  ul::Context c(dev);
  ul::ContextGuard guard(c);
  ul::Recording rec(true);
  std::vector<ul::Tensor> ts;
  for (const Input& in : ins) ts.push_back(make_tracked(c, in.shape, dt, in.v, in.weight ? ul::DType::f32 : dt));
  OpResult r;
  r.grads.resize(ts.size());
  auto bf16_grad = [&](size_t i) { return !ins[i].weight && dt == ul::DType::bf16; };
  auto read_grads = [&](const std::vector<void*>& gs) {
    for (size_t i = 0; i < ts.size(); i++) r.grads[i] = read_floats(gs[i], size_t(ts[i].numel()), bf16_grad(i), dev);
  };
  if (!g0)  // pushed before the op's nodes: the backward runs it after them
    c.tape.push("read input gradients", [&] {
      std::vector<void*> gs;
      for (const ul::Tensor& t : ts) gs.push_back(c.tape.grad_if_any(t));
      for (void* g : gs) REQUIRE(g);  // every input's gradient written
      read_grads(gs);
    });
  const ul::Tensor y = op(c, ts);
  REQUIRE(y.device == dev);
  REQUIRE(y.dtype == dt);
  REQUIRE(y.requires_grad());
  REQUIRE(size_t(y.numel()) == dy.size());
  auto upload = [&](void* to, const std::vector<float>& v, bool bf16, size_t bytes) {
    if (bf16) ul::device_copy(to, dev, to_elem<__nv_bfloat16>(v).data(), ul::Device::cpu, bytes);
    else ul::device_copy(to, dev, v.data(), ul::Device::cpu, bytes);
  };
  upload(c.tape.grad(y), dy, dt == ul::DType::bf16, y.nbytes());
  std::vector<void*> gs;
  if (g0)  // the tape forgets activation slots after the backward: read through these
    for (size_t i = 0; i < ts.size(); i++) {
      gs.push_back(c.tape.grad(ts[i]));
      upload(gs[i], (*g0)[i], bf16_grad(i), size_t(ts[i].numel()) * (bf16_grad(i) ? 2 : 4));
    }
  c.tape.backward();
  r.y = read_floats(y.ptr, size_t(y.numel()), dt == ul::DType::bf16, dev);
  if (g0) read_grads(gs);
  return r;
}

// The op on Device::cuda (f32 and bf16) against the op on the CPU in f32, on the same (for bf16:
// bf16-representable) random inputs and output gradient, each way a backward meets its inputs'
// gradients: as their first writer (stores) and over gradients already there (adds). bf16 also
// rounds y and the stored gradients to bf16 along the way: 2^-7 relative.
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
    std::vector<std::vector<float>> g0;
    for (size_t i = 0; i < shapes.size(); i++) g0.push_back(in(size_t(shapes[i].numel()), 71 + i));
    for (bool adds : {false, true}) {
      INFO((adds ? "into gradients already there" : "as the gradients' first writer"));
      const auto* start = adds ? &g0 : nullptr;
      const OpResult ref = run_op(ul::Device::cpu, ul::DType::f32, ins, dy, op, start);
      const OpResult got = run_op(ul::Device::cuda, dt, ins, dy, op, start);
      const double rel = bf ? 1.0 / 128 : 1e-5;
      expect_close("y", got.y, ref.y, rel, bf ? 1e-3 : 1e-6);
      for (size_t i = 0; i < ins.size(); i++) {
        // A bf16 gradient written twice (add(a, a) into a's) is rounded to bf16 at the first
        // write too, relative to what it held then, which the sum may cancel: that scale's 2^-7.
        const double scale = std::max(max_abs(ref.grads[i]), adds ? max_abs(g0[i]) : 0.0);
        expect_close("gradient of input " + std::to_string(i), got.grads[i], ref.grads[i], rel,
                     bf && adds ? rel * scale : 1e-5 * std::max(1.0, scale));
      }
    }
  }
}

}  // namespace op_cases
