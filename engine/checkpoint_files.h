// The files of one checkpoint directory (engine/checkpoint.h says when they are written):
//
// model.bin — every parameter, fp32, little-endian:
//   char magic[8] "ULYSMODL" | u32 version (1-4) | u32 crc32 | char arch[16] | i32 layers, dim,
//   heads, kv_heads, vocab, padded_vocab, max_seq, ffn | f32 rope_theta | i32 rope scaling kind
//   (RopeScaling::Kind, 0 in version 1) | u64 numel  (80 bytes).
//   Version 2 (a scaled RoPE or tied llama embeddings) adds, after the header: f32 rope factor,
//   low_freq_factor, high_freq_factor | i32 original_max_pos | u32 flags (1: tied embeddings;
//   2: q/k/v bias, from version 3 on); version 3 (YaRN, a q/k/v bias, an RMSNorm eps other than 1e-5) adds to that
//   f32 beta_fast, beta_slow, attention_factor | u32 truncate | f32 norm_eps; version 4 (a
//   sliding window) adds to that i32 sliding_window, full_every, full_first (the layers without
//   it, ModelConfig::full_layer; 0, 0: none). Each file is written at
//   the lowest version that holds its model. Then numel fp32 in the Params buffer order.
// optim.bin / optim_rank_R.bin — AdamW state of one shard of the parameter buffer:
//   char magic[8] "ULYSOPTM" | u32 version 1 | u32 crc32 | i64 t | u64 numel (whole buffer) |
//   u64 offset | u64 count | i32 shard | i32 shards  (56 bytes), then m[count], v[count] fp32.
//   Without --zero one shard holds everything (optim.bin, written by rank 0); under --zero 1 each
//   rank writes its shard's optim_rank_R.bin, and the loader gathers them by the (offset, count) in
//   each header.
// rank_R.json — one flat JSON object per rank: step, rank, dp/sp ranks, data_sequence (the first
//   sequence the next step trains on: Trainer::next_sequence(); files from before it have
//   data_position, the step, for step x G), the run's
//   layout (batch, grad_accum, dp, sp, zero, mlp_chunks), save_id (rank 0's: a random number each
//   save draws; the other ranks' files carry it as save_of),
//   every option that must be equal on resume
//   (run_fields), the crc32 of each binary file that rank wrote ("crc model.bin": ...), and last
//   "crc32": the CRC-32 of the text before that field (files from before it lack it: unchecked).
//
// The crc32 covers the header (with the crc field zero) and the payload. Every reader checks
// magic, version, exact size and checksum and throws std::runtime_error naming the file.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/options.h"
#include "layers/transformer.h"

namespace ul {

struct Grid;

// A checkpoint that is sound but made for other flags than this run's (another --seq, model, G):
// the message names the flag. Not a damaged file: an older checkpoint would be refused the same way.
struct RunMismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Returns the file's crc32 (rank_R.json records it: the checkpoint's files are tied to each other).
uint32_t write_model_file(const std::string& path, const ModelConfig& cfg, const float* params, uint64_t numel);
// Test hook (engine/checkpoint.h): writes half of path.tmp, then abort()s.
void write_model_file_and_crash(const std::string& path, const ModelConfig& cfg, const float* params, uint64_t numel);
// crc, when given, gets the file's (verified) crc32. With numel_only only the header is read (its
// magic, version, tail and the file's size checked; the weights and their checksum not: a 32 GB
// file was read through for --plan's shape): their count goes there and params stays empty.
ModelConfig read_model_file(const std::string& path, std::vector<float>& params, uint32_t* crc = nullptr,
                            uint64_t* numel_only = nullptr);
// Whether the file at path begins with model.bin's magic (false when it cannot be read).
bool is_model_file(const std::string& path);
// Throws "PATH: FIELD is X in the checkpoint but Y in this run (--FLAG)" at the first difference.
void check_model_config(const std::string& path, const ModelConfig& in_file, const ModelConfig& in_run);
// A llama's RoPE in words: "theta 10000" (and ", scaling llama3:factor=8,..." when scaled).
std::string rope_text(const ModelConfig& c);

struct OptimShard {
  int64_t t = 0;           // AdamW updates taken (bias correction)
  uint64_t numel = 0;      // the whole parameter buffer
  uint64_t offset = 0, count = 0;  // the shard: elements [offset, offset + count) of the buffer
  int shard = 0, shards = 1;
  std::vector<float> m, v;  // written: count each; read: elements [kept, kept + kept_count) of the buffer
  uint64_t kept = 0, kept_count = 0;
  uint32_t crc = 0;         // read: the file's verified crc32 (its header's, where payload_checked is false)
  bool payload_checked = true;  // read: false where only the header was (see read_optim_file's disjoint)
};
std::string optim_file_name(int shard, int shards);  // "optim.bin" when shards == 1
uint32_t write_optim_file(const std::string& path, const OptimShard& s);  // returns the file's crc32
// The same from m and v elsewhere (s.m, s.v unused): a CPU run's AdamW state, written in place.
uint32_t write_optim_file(const std::string& path, const OptimShard& s, const float* m, const float* v);
// Checks the whole file (header, size, checksum) but keeps only the shard's elements inside [lo, hi)
// (all of them by default), reading it in pieces: a resuming rank holds its own range of each file,
// not the file. Kept in the result's m and v, or, given m_out and v_out (each covering [lo, hi)),
// element e at m_out[e - lo]: a resume then holds its range once, not twice. They may be written
// before the checksum fails. skip_disjoint: a file whose elements all lie outside [lo, hi) has only
// its header and size checked, its payload not read (a ZeRO resume on N ranks reads each shard
// once in all, not N times; the ranks whose range it meets check its checksum).
OptimShard read_optim_file(const std::string& path, uint64_t lo = 0, uint64_t hi = UINT64_MAX, float* m_out = nullptr,
                           float* v_out = nullptr, bool skip_disjoint = false);

// What must match between a checkpoint and the run resuming it.
// A RunField whose absence from an older checkpoint leaves it unchecked.
inline constexpr const char* kUnchecked = "*";
struct RunField {
  std::string key, json, flag;  // json: the value as JSON text; flag: what the user would change
  std::string absent = "";      // the value a checkpoint written before this field existed implies
                                // ("": none, the field must be there; kUnchecked: not checked)
  std::string also = "";        // another value a checkpoint may hold that means the same ("": none)
};
// Every option that must be equal on resume (the layout's four are not among them: RunLayout).
// `data`: the training split's Dataset::identity() (its files as they are now); data_eot: its own
// end-of-text id (Dataset::eot(), -1: none), which --doc-mask uses unless --eot names another.
std::vector<RunField> run_fields(const Options& o, const ModelConfig& cfg, const std::string& data, int data_eot);

// How a step's sequences are spread: --batch per rank and micro-batch, --grad-accum micro-batches,
// dp replicas, each sequence cut into sp slices. Step s trains on sequences [s G, (s + 1) G) with
// G = batch x grad_accum x dp whatever the four are (Trainer::step; counted from the data's place
// after a rollback's skip or a change of G), and the loss is normalised
// over all of them, so a resume may change the layout when G stays: the same sequences and the
// same sums, added in another order (within float rounding of the run never stopped, not bit-exact).
// --zero and --mlp-chunks change no sequence either, but may change the order of some sums (the
// MLP's weight gradients over chunks; ZeRO's reduce-scatter against the all-reduce, which add
// the ranks in one order on the local communicator and on 2 processes, not always on 3+ MPI or
// NCCL ones): a resume may change them too. -1: a checkpoint written before they were recorded
// (taken as unchanged).
struct RunLayout {
  int batch = 0, grad_accum = 0, dp = 0, sp = 0;
  int zero = -1, mlp_chunks = -1;
  int seq = 0;  // --seq: not part of the spread; a resume changes it only with --change-seq
  // --device: another backend's kernels sum in another order ("": a checkpoint from before it)
  std::string device;
  // --steps of the run that saved: the schedule's length, which a resume may change (-1: a
  // checkpoint from before it). Not part of the spread.
  int steps = -1;
  // --comm: on 3+ ranks another backend's collectives add the ranks in another order (local: rank
  // order; MPI and NCCL: their algorithm's) ("": a checkpoint from before it)
  std::string comm;
  int64_t sequences_per_step() const { return int64_t(batch) * grad_accum * dp; }
  // The same spread of sequences over ranks (each rank's file then describes its place).
  bool operator==(const RunLayout& o) const {
    return batch == o.batch && grad_accum == o.grad_accum && dp == o.dp && sp == o.sp;
  }
  // The same spread and the same sums: a resume continues bit-exactly. On at most 2 ranks every
  // backend adds them alike (a + b = b + a); on more, --comm local adds them in rank order whether
  // it all-reduces or reduce-scatters (--zero changes no sum: trainer.cpp's norm), MPI and NCCL in
  // their algorithm's order, which may differ between the two.
  bool same_sums(const RunLayout& o) const {
    auto same = [](int a, int b) { return a < 0 || b < 0 || a == b; };
    auto same_text = [](const std::string& a, const std::string& b) { return a.empty() || b.empty() || a == b; };
    const bool few = int64_t(dp) * sp <= 2;
    auto rank_order = [&](const std::string& c) { return few || c == "local"; };
    const bool zero_sums_alike = rank_order(comm.empty() ? o.comm : comm) && rank_order(o.comm.empty() ? comm : o.comm);
    return *this == o && (zero_sums_alike || same(zero, o.zero)) && same(mlp_chunks, o.mlp_chunks) &&
           same_text(device, o.device) && (few || same_text(comm, o.comm));
  }
  // "dp 2 x sp 1, batch 8, grad-accum 1" (+ ", --zero 1", ", --mlp-chunks 4", ", --device cuda",
  // ", --comm mpi")
  std::string str() const;
};
RunLayout run_layout(const Options& o, const Grid& g);

std::string rank_file_name(int rank);  // "rank_R.json"
// crcs: the crc32 of each file this rank wrote into the checkpoint (model.bin, its optimizer file),
// by name, so that a load can tell a file of another checkpoint or run put in its place.
// A random 16-hex-digit number, to tell one save from another of the same step and bytes.
std::string new_save_id();
// save_id: the save's identity, drawn by rank 0 (new_save_id) and shared by every rank: rank 0's
// file carries it as save_id, the others as save_of, which ties them to that rank_0.json.
void write_rank_file(const std::string& path, int step, int64_t next_sequence, int rank, const Grid& g,
                     const RunLayout& layout,
                     const std::vector<RunField>& fields,
                     const std::vector<std::pair<std::string, uint32_t>>& crcs = {},
                     const std::string& save_id = new_save_id());

// The crc32 the rank file at `path` recorded for the checkpoint file `name`, or -1 when it has none
// (a checkpoint written before rank files recorded them).
int64_t recorded_crc(const std::string& path, const std::string& name);
// A rank file whose writer's optimizer file a load reads (ZeRO-1 at another layout: its run fields
// were not checked against this run's) against the checkpoint's rank_0.json: every field but the
// writer's own (its rank and grid place, the crc32s of its files, save_id) must be the same, or it
// is a file of another run or save put there (the run fields a resume may change included).
void check_rank_file_matches_rank0(const std::string& path);
// The crc32 a model or optimizer file's header carries (unverified: a full read checks it), or -1
// when the file does not open or is no such file.
int64_t stored_crc(const std::string& path);
// For --checkpoint DIR/step_N/model.bin: "--doc-mask --eot E" when the rank_0.json beside it says
// its run packed documents, "" when not, or when there is none or it does not read (a note only).
std::string checkpoint_doc_mask(const std::string& model_path);
// The --data of the run that wrote a checkpoint's model.bin, from the rank_0.json beside it ("" when
// there is none: an llm.c file, a model.bin copied out alone).
std::string checkpoint_data(const std::string& model_path);
// ... the --seq its run trained at (the last stage's, after --change-seq), -1 when it says none.
int checkpoint_seq(const std::string& model_path);
// What a resume may change that would otherwise be another run.
struct ResumeChanges {
  bool global_batch = false;  // --change-global-batch (or a pending rollback's G)
  bool seq = false;           // --change-seq (and a llama's max_seq, the trained length, growing with it)
  bool rope = false;          // --change-rope: rope_theta and rope_scaling, each where its flag is given
  bool rollback = false;      // --resume-step (no --change-seq: its refusals say so)
  // --rope-theta, --rope-scaling written out: --change-rope changes only those (a refusal of one
  // not given names the checkpoint's value, not the flag: that would take the preset's).
  bool theta_asked = false, scaling_asked = false;
};
// Checks the step, every field and that the layout's sequences per step equal `run`'s (but what
// `changes` allows); with `place` (a rank resuming at the layout it was saved at, reading its own
// file) also the rank's place in the grid. Throws naming the file and field; returns the layout
// (and --seq) the file was saved at, and the first sequence of the next step in `next_sequence`
// when given (in sequences of the saved --seq).
RunLayout check_rank_file(const std::string& path, int step, const std::vector<RunField>& fields, const RunLayout& run,
                          const Grid* place, int64_t* next_sequence = nullptr, ResumeChanges changes = {});

}  // namespace ul
