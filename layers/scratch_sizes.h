// The device scratch each CUDA backward kernel (and the attention forward) takes from the arena,
// in plain C++: the .cu files size their scratch with these, and the planner (engine/planner.cpp)
// counts the same bytes in any build, which is how its plan of a GPU run's arena can be exact.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ul {
namespace scratch {

// Outside the arena: cuBLASLt's workspace, one per device and host thread (engine/gemm.cu).
constexpr size_t kCublasLtWorkspace = size_t(32) << 20;

// Deterministic column sums (bias and norm-weight gradients) cut the rows into chunks: a chunk is
// at least kMinChunkRows rows and there are at most kMaxChunks (which bounds the scratch); each
// chunk's partial sums go to scratch, then one pass adds the chunks in order.
constexpr int kMinChunkRows = 64;
constexpr int kMaxChunks = 512;
inline int column_chunks(int64_t N) {
  return N < int64_t(kMinChunkRows) * kMaxChunks ? int((N + kMinChunkRows - 1) / kMinChunkRows) : kMaxChunks;
}

inline size_t linear_backward(int64_t N, int64_t OC) { return size_t(column_chunks(N)) * OC * sizeof(float); }
inline size_t layernorm_backward(int64_t N, int64_t C) { return 2 * size_t(column_chunks(N)) * C * sizeof(float); }
inline size_t rmsnorm_backward(int64_t N, int64_t C) { return size_t(column_chunks(N)) * C * sizeof(float); }
// With documents, the attention kernels take a flag a sequence (do its ids fall anywhere?): the
// forward's scratch, and the backward's after rowsum(dout * out) (B, Hq, T).
inline size_t attention_forward(int64_t B, bool doc) { return doc ? size_t(B) * sizeof(int32_t) : 0; }
inline size_t attention_backward(int64_t B, int64_t Tn, int64_t Hq, bool doc) {
  return size_t(B * Tn * Hq) * sizeof(float) + attention_forward(B, doc);
}

// The embedding backward sorts (row, n) keys with a bitonic network: a power of two, at least 2.
inline int64_t embedding_sort_size(int64_t N) {
  int64_t p = 2;
  while (p < N) p <<= 1;
  return p;
}
inline size_t embedding_backward(int64_t N) { return size_t(embedding_sort_size(N)) * sizeof(uint64_t); }

// The classifier's chunk: f32 logits, the dlogits in the activation dtype when that is not f32,
// and two per-row arrays; each piece's offset rounded to 256 bytes.
inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }
// A row of logits (and of dlogits) is V values in a stride of round_up(V, 64) (256 bytes in f32,
// 128 in bf16): every row then keeps the scratch's own alignment (the arena's 64 bytes, more
// than the 16 cuBLASLt's fast kernels want), which GPT-2's V = 50257 packed would break for every
// row but the first.
inline int64_t classifier_row_stride(int64_t V) { return (V + 63) / 64 * 64; }
inline size_t classifier(int64_t N, int64_t V, int64_t chunk_rows, size_t act_bytes) {
  const int64_t lo = N > 1 ? N : 1;
  const size_t R = size_t(chunk_rows < 1 ? 1 : chunk_rows > lo ? lo : chunk_rows), L = size_t(classifier_row_stride(V));
  const size_t dlogits = act_bytes == 4 ? 0 : align256(R * L * act_bytes);
  return align256(R * L * sizeof(float)) + dlogits + 2 * align256(size_t(N) * 4);
}

}  // namespace scratch
}  // namespace ul
