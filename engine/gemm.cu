// The GEMM through cuBLASLt (the contract is in engine/gemm.h; the emulated build's twin is
// engine/gemm.cpp, and this file is empty there: cuBLASLt cannot run on the CPU).
//
// cuBLASLt is column-major; a row-major (R, C) buffer is the column-major (C, R) matrix, its
// transpose. So the row-major D = op(A) op(B) is computed as the column-major
//   D^T (N, M) = op(B)^T (N, K) · op(A)^T (K, M):
// cuBLASLt's first operand is our B, its second our A, each transposed exactly when ours is.
// The bias is added per row of that column-major D^T, i.e. per column of our row-major D.
//
// Per host thread and device: one handle and one 32 MiB workspace (made on first use, released at
// thread exit), and a cache of the heuristic's choice per problem (shapes, types, transposes,
// epilogue, pointer alignments), so a training step asks the heuristic once per distinct GEMM.
#if !ULYSSES_CUDA_EMULATED
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/cuda_launch.h"
#include "engine/gemm.h"
#include "engine/gpu_profile.h"
#include "layers/scratch_sizes.h"

namespace ul {
namespace cuda {
namespace {

constexpr size_t kWorkspaceBytes = scratch::kCublasLtWorkspace;

template <class T> constexpr cudaDataType_t data_type();
template <> constexpr cudaDataType_t data_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t data_type<__nv_bfloat16>() { return CUDA_R_16BF; }

const char* type_name(cudaDataType_t t) { return t == CUDA_R_32F ? "f32" : t == CUDA_R_16BF ? "bf16" : "other"; }

std::string problem(const char* op, int M, int N, int K, bool ta, bool tb) {
  return std::string(op) + ": gemm " + (ta ? "A^T" : "A") + " x " + (tb ? "B^T" : "B") + ", (" + std::to_string(M) +
         ", " + std::to_string(K) + ") x (" + std::to_string(K) + ", " + std::to_string(N) + ")";
}

void check_lt(cublasStatus_t st, const std::string& call, const std::string& what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(what + ": " + call + " failed: " + cublasLtGetStatusString(st));
}

// The largest power of two that divides the address, capped at 16 bytes (a row of 16-byte
// vectors, TMA's own need; cuBLASLt assumes 256 when told nothing). The heuristic's answer, and
// with it the kernel and its order of sums, must not depend on where the arena put an operand
// past that: arena tensors are 64-byte aligned, and their address mod 256 moves with whatever was
// allocated before (--recompute, --offload, an eval without masters would ask another question,
// and could get another kernel, against their bitwise claims). Not yet measured on a GPU.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 16;
  while (al > 1 && a % al) al >>= 1;
  return al;
}

struct Algo {
  cublasLtMatmulAlgo_t algo;
  bool epilogue_bias = false;  // false for a bias: cuBLASLt had none with the BIAS epilogue
};

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  // The heuristic's choice per problem (see `key` in gemm()), and whether it takes the bias.
  std::map<std::array<int64_t, 15>, Algo> algos;
  Lt() = default;
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;
  ~Lt() {
    // At process exit the runtime may already be unloading: nothing is lost by ignoring errors.
    // The handle first (its destroy waits for the work that may still use the workspace).
    if (handle) cublasLtDestroy(handle);
    if (workspace) cudaFree(workspace);
  }
};

// The calling thread's handle and workspace for the current device.
Lt& lt_for_current_device() {
  thread_local std::map<int, Lt> per_device;
  int dev = 0;
  UL_CUDA_CHECK(cudaGetDevice(&dev));
  Lt& lt = per_device[dev];
  if (!lt.handle) {
    // The workspace first: a handle set before a failed allocation would let this thread's next
    // gemm run with a null workspace declared 32 MiB long.
    if (!lt.workspace) UL_CUDA_CHECK(cudaMalloc(&lt.workspace, kWorkspaceBytes));
    check_lt(cublasLtCreate(&lt.handle), "cublasLtCreate", "gemm");
  }
  return lt;
}

// RAII for the per-call descriptors.
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

void gemm_prepare() { lt_for_current_device(); }

template <class TA, class TD>
void gemm(TD* d, const TA* a, const TA* b, const TD* bias, int M, int N, int K, bool trans_a, bool trans_b,
          bool accumulate, const char* op, cudaStream_t s, GemmStrides ld_given) {
  static_assert(std::is_same<TD, TA>::value || std::is_same<TD, float>::value, "D is A's type or float");
  const std::string what = problem(op, M, N, K, trans_a, trans_b);
  if (M < 0 || N < 0 || K < 0 || (M > 0 && N > 0 && (!d || (K > 0 && (!a || !b)))))
    throw std::runtime_error(what + ": a negative size or a null buffer");
  if (bias && accumulate) throw std::runtime_error(what + ": gemm with a bias and accumulate (see engine/gemm.h)");
  const GemmStrides ld = gemm_strides(ld_given, M, N, K, trans_a, trans_b, bias != nullptr, what);
  if (M == 0 || N == 0) return;
  gpu_profile::Span span;
  if (gpu_profile::enabled()) span.begin(gemm_profile_name(op, M, N, K), s, 2.0 * M * N * K);
  if (K == 0 && ld.d != N) throw std::runtime_error(what + ": an empty product into a strided D");
  if (K == 0) {  // no product: D = (accumulate ? D : 0) + bias
    gemm_bias_rows<TD>(d, bias, M, N, accumulate, s);
    return;
  }
  Lt& lt = lt_for_current_device();
  const cudaDataType_t ta = data_type<TA>(), td = data_type<TD>();

  // Column-major view (see the top of the file): first operand our B, second our A, output D^T (N, M).
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  Desc desc;
  check_lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", what);
  check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
           "set TRANSA", what);
  check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
           "set TRANSB", what);
  // Stored column-major shapes: our B is (K, N) row-major = (N, K) col-major, or (K, N) col-major when trans_b.
  // A row-major row stride is the column-major leading dimension.
  check_lt(cublasLtMatrixLayoutCreate(&desc.a, ta, trans_b ? K : N, trans_b ? N : K, ld.b),
           "cublasLtMatrixLayoutCreate(B)", what);
  check_lt(cublasLtMatrixLayoutCreate(&desc.b, ta, trans_a ? M : K, trans_a ? K : M, ld.a),
           "cublasLtMatrixLayoutCreate(A)", what);
  check_lt(cublasLtMatrixLayoutCreate(&desc.d, td, N, M, ld.d), "cublasLtMatrixLayoutCreate(D)", what);

  // The bias through the epilogue, unless the heuristic has nothing for it (then gemm_bias_rows first).
  // Every row starts at the pointer plus a multiple of its stride: the rows' alignment is the
  // smaller of the two (a packed GPT-2 logits row of 50257 floats leaves the next at 4 bytes).
  auto rows_aligned = [](const void* p, int64_t stride_bytes) {
    return std::min(alignment(p), alignment(reinterpret_cast<const void*>(uintptr_t(stride_bytes))));
  };
  const uint32_t al_first = rows_aligned(b, ld.b * int64_t(sizeof(TA))), al_second = rows_aligned(a, ld.a * int64_t(sizeof(TA))),
                 al_d = rows_aligned(d, ld.d * int64_t(sizeof(TD)));
  const std::array<int64_t, 15> key{M,         N,         K,    trans_a, trans_b, accumulate, int64_t(ta), int64_t(td),
                                    al_first,  al_second, al_d, bias ? int64_t(alignment(bias)) : -1,
                                    ld.a,      ld.b,      ld.d};
  auto set_epilogue = [&](bool with_bias) {
    const cublasLtEpilogue_t epi = with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
             "set EPILOGUE", what);
    if (!with_bias) return;
    const int32_t bias_type = int32_t(td);
    check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
             "set BIAS_POINTER", what);
    check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                            sizeof(bias_type)),
             "set BIAS_DATA_TYPE", what);
  };

  // The heuristic's choice for this problem, with the bias epilogue when allowed and offered.
  auto choose = [&](bool allow_bias) {
    if (!desc.pref) {
      check_lt(cublasLtMatmulPreferenceCreate(&desc.pref), "cublasLtMatmulPreferenceCreate", what);
      const uint64_t ws = kWorkspaceBytes;
      check_lt(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                    sizeof(ws)),
               "set MAX_WORKSPACE_BYTES", what);
      // The operands' real alignments: chunked callers pass row offsets that are not 256-byte aligned.
      const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_first},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_second},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d}};
      for (const auto& [attr, value] : aligns)
        check_lt(cublasLtMatmulPreferenceSetAttribute(desc.pref, attr, &value, sizeof(value)), "set MIN_ALIGNMENT",
                 what);
    }
    cublasLtMatmulHeuristicResult_t result{};
    // Returns the heuristic's status; n_results says whether it found an algorithm.
    int n_results = 0;
    auto ask = [&](bool with_bias) {
      set_epilogue(with_bias);
      n_results = 0;
      return cublasLtMatmulAlgoGetHeuristic(lt.handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1, &result,
                                            &n_results);
    };
    Algo chosen;
    // Any refusal of the epilogue (not supported, or invalid for these types) falls back to gemm_bias_rows.
    // The epilogue reads the bias in 16-byte vectors on some GPUs whatever the heuristic says: a bias
    // at another offset of the parameter buffer (--dim 100) takes gemm_bias_rows instead.
    // (A result's fields are valid only when its state is success.)
    chosen.epilogue_bias = allow_bias && bias != nullptr && alignment(bias) >= 16 &&
                           ask(true) == CUBLAS_STATUS_SUCCESS && n_results > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (!chosen.epilogue_bias) {
      const cublasStatus_t st = ask(false);
      if (st != CUBLAS_STATUS_NOT_SUPPORTED) check_lt(st, "cublasLtMatmulAlgoGetHeuristic", what);
      if (n_results > 0) check_lt(result.state, "cublasLtMatmulAlgoGetHeuristic (its result)", what);
      if (n_results == 0)
        throw std::runtime_error(what + ": cuBLASLt offers no algorithm (" + type_name(ta) + " in, " +
                                 type_name(td) + " out; alignments " + std::to_string(al_first) + ", " +
                                 std::to_string(al_second) + ", " + std::to_string(al_d) + " bytes)");
    }
    chosen.algo = result.algo;
    return chosen;
  };

  auto found = lt.algos.find(key);
  if (found == lt.algos.end()) found = lt.algos.emplace(key, choose(true)).first;
  else set_epilogue(found->second.epilogue_bias);

  const float alpha = 1.f;
  auto matmul = [&]() {
    float beta = accumulate ? 1.f : 0.f;
    if (bias && !found->second.epilogue_bias) {
      gemm_bias_rows<TD>(d, bias, M, N, accumulate, s);
      beta = 1.f;
    }
    return cublasLtMatmul(lt.handle, desc.op, &alpha, b, desc.a, a, desc.b, &beta, d, desc.d, d, desc.d,
                          &found->second.algo, lt.workspace, kWorkspaceBytes, s);
  };
  cublasStatus_t st = matmul();
  if ((st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) && found->second.epilogue_bias) {
    // The heuristic offered the bias epilogue but the call refused it (reported on some GPU and
    // library pairs): this problem adds its bias with gemm_bias_rows from now on. D is rewritten
    // whole (a bias comes without accumulate), so whatever the refused call left in it is gone.
    const std::string refused = cublasLtGetStatusString(st);
    found->second = choose(false);
    st = matmul();
    check_lt(st, "cublasLtMatmul (without the bias epilogue, which it refused first: " + refused + ")", what);
  }
  check_lt(st, "cublasLtMatmul", what);
}

UL_GEMM_INSTANTIATE_ALL()

}  // namespace cuda
}  // namespace ul
#endif  // !ULYSSES_CUDA_EMULATED
