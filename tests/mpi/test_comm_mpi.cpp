// The MPI communicator under real processes (mpirun -np 4; any size works, the grid case needs an
// even one): every collective against hand-computed values, split and Grid, the byte accounting,
// device buffers staged through the host, and collectives split into pieces above a call's count.
// Checks use CHECK, not REQUIRE: a test case that stopped early on one rank would leave the other
// ranks waiting in its remaining collectives.
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "dtype_codec.h"

#include "engine/device.h"
#include "parallel/comm_mpi.h"
#include "parallel/comm_util.h"
#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "parallel/hosts.h"

using namespace ul;

namespace {

Comm& world() {
  static std::unique_ptr<Comm> w = mpi_world();
  return *w;
}

using ul_test::decode;
using ul_test::encode;

double value(int r, size_t i) { return double((r * 5 + int(i) * 3) % 11) - 4; }

// A stand-in "device" whose memory is host memory but is only reached through these copies, so
// the staging path of the MPI communicator runs on a CPU-only machine.
int g_device_copies = 0;
void fake_copy(void* d, const void* s, size_t n) {
  g_device_copies++;
  if (n) std::memcpy(d, s, n);
}
void* fake_alloc(size_t n) { return n ? ::operator new(n) : nullptr; }
void fake_free(void* p) { ::operator delete(p); }
void fake_set(void* p, int byte, size_t n) { if (n) std::memset(p, byte, n); }
void fake_sync() {}

}  // namespace

// Restores MPI's own limit on a call's count when a test that lowered it ends (or throws).
struct MaxCount {
  explicit MaxCount(size_t n) { set_mpi_max_count(n); }
  ~MaxCount() { set_mpi_max_count(INT_MAX); }
};

void all_reduce_cases(Comm& c) {
  const int P = c.size();
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::bf16})
    for (size_t n : {size_t(0), size_t(1), size_t(7)})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        std::vector<double> v(n);
        for (size_t i = 0; i < n; i++) v[i] = value(c.rank(), i);
        auto buf = encode(v, t);
        c.all_reduce(buf.data(), n, t, op);
        auto got = decode(buf, t);
        for (size_t i = 0; i < n; i++) {
          double want = op == ReduceOp::sum ? 0 : -1e9;
          for (int r = 0; r < P; r++) want = op == ReduceOp::sum ? want + value(r, i) : std::max(want, value(r, i));
          INFO(dtype_name(t) << " n " << n << " op " << int(op) << " i " << i);
          CHECK(got[i] == want);
        }
      }
}

TEST_CASE("mpi all_reduce: sum and max, every dtype, counts 0, 1, 7", "[comm][mpi]") { all_reduce_cases(world()); }

void collective_cases(Comm& c) {
  const int P = c.size(), r = c.rank();
  for (size_t n : {size_t(0), size_t(1), size_t(5)}) {
    INFO("count " << n);
    std::vector<float> send(P * n), recv(P * n);
    for (int j = 0; j < P; j++)
      for (size_t k = 0; k < n; k++) send[j * n + k] = 100.f * r + 10.f * j + k;
    c.all_to_all(send.data(), recv.data(), n, DType::f32);
    for (int j = 0; j < P; j++)
      for (size_t k = 0; k < n; k++) CHECK(recv[j * n + k] == 100.0 * j + 10.0 * r + k);

    std::vector<float> mine(n);
    for (size_t k = 0; k < n; k++) mine[k] = 10.f * r + k;
    c.all_gather(mine.data(), recv.data(), n, DType::f32);
    for (int j = 0; j < P; j++)
      for (size_t k = 0; k < n; k++) CHECK(recv[j * n + k] == 10.0 * j + k);

    for (DType t : {DType::f32, DType::bf16}) {
      std::vector<double> s(P * n);
      for (int j = 0; j < P; j++)
        for (size_t k = 0; k < n; k++) s[j * n + k] = r + 10.0 * j + 3.0 * k;
      auto sb = encode(s, t);
      std::vector<char> out(n * dtype_size(t));
      c.reduce_scatter(sb.data(), out.data(), n, t, ReduceOp::sum);
      auto got = decode(out, t);
      for (size_t k = 0; k < n; k++) CHECK(got[k] == P * (P - 1) / 2 + P * (10.0 * r + 3.0 * k));
    }

    for (int root = 0; root < P; root++) {
      std::vector<int32_t> b(n, -99);
      if (r == root)
        for (size_t k = 0; k < n; k++) b[k] = 7 * root + int(k);
      c.broadcast(b.data(), n, DType::i32, root);
      for (size_t k = 0; k < n; k++) CHECK(b[k] == 7 * root + int(k));
    }
    c.barrier();
  }
}

TEST_CASE("mpi all_to_all, all_gather, reduce_scatter, broadcast, barrier", "[comm][mpi]") { collective_cases(world()); }

TEST_CASE("mpi split and grid", "[comm][mpi][grid]") {
  Comm& c = world();
  const int P = c.size(), r = c.rank();
  auto g = c.split(r % 2, -r);  // ordered by descending world rank
  std::vector<int32_t> all(g->size());
  int32_t me = r;
  g->all_gather(&me, all.data(), 1, DType::i32);
  for (int k = 0; k < g->size(); k++) CHECK(all[k] == all[0] - 2 * k);
  auto none = c.split(r == 0 ? -1 : 1, 0);
  CHECK((none == nullptr) == (r == 0));
  if (none) none->barrier();

  if (P % 2 != 0) return;
  Grid grid(c, 2);
  CHECK(grid.dp == P / 2);
  CHECK(grid.sp_rank == r % 2);
  CHECK(grid.dp_rank == r / 2);
  int32_t pair[2];
  grid.sp_group->all_gather(&me, pair, 1, DType::i32);
  CHECK(pair[0] == 2 * (r / 2));
  CHECK(pair[1] == 2 * (r / 2) + 1);
  std::vector<int32_t> col(grid.dp);
  grid.dp_group->all_gather(&me, col.data(), 1, DType::i32);
  for (int k = 0; k < grid.dp; k++) CHECK(col[k] == 2 * k + r % 2);
  CHECK(global_count(c, r + 1) == int64_t(P) * (P + 1) / 2);
}

TEST_CASE("mpi host map: the ranks find they share one machine, its cores and its memory", "[comm][mpi][hosts]") {
  // Processes of one mpirun here (the local communicator's shortcut is not taken): the all-gather
  // of machine ids, CPU sets, memory domains and GPUs, packed as int32 words.
  Comm& c = world();
  const int P = c.size();
  const HostMap m = host_map(c, c.rank());  // each rank its own GPU number
  CHECK(m.hosts() == 1);
  CHECK(m.ranks_here() == P);
  CHECK(m.sharing_memory() == P);
  CHECK(int(m.gpu.size()) == P);
  for (int r = 0; r < P; r++) CHECK(m.gpu[r] == r);
  CHECK(shared_gpu(m).empty());
  CHECK(sp_groups_across_hosts(m, P).empty());
  CHECK(threads_for_rank(0, m) >= 1);
  CHECK(m.sharing_gpu() == 1);
  const HostMap same = host_map(c, 0);  // every rank GPU 0
  if (P > 1) CHECK(shared_gpu(same) == "ranks 0 and 1 share GPU 0 of one machine");
  CHECK(same.sharing_gpu() == P);
  // Each process sees its own GPU as GPU 0 (srun --gpus-per-task): their UUIDs tell them apart.
  const HostMap own = host_map(c, 0, 1000 + uint32_t(c.rank()));
  CHECK(shared_gpu(own).empty());
  CHECK(own.sharing_gpu() == 1);
}

TEST_CASE("mpi stats count the bytes sent to other ranks", "[comm][mpi]") {
  auto c = world().split(0, world().rank());  // fresh stats
  const int P = c->size();
  const size_t n = 5;
  std::vector<float> a(P * n, 1.f), b(P * n);
  c->all_to_all(a.data(), b.data(), n, DType::f32);
  c->all_gather(a.data(), b.data(), n, DType::f32);
  c->reduce_scatter(a.data(), b.data(), n, DType::f32, ReduceOp::sum);
  c->all_reduce(a.data(), n, DType::f32, ReduceOp::sum);
  c->broadcast(a.data(), n, DType::f32, P - 1);
  CHECK(c->stats.all_to_all == n * (P - 1) * 4);
  CHECK(c->stats.all_gather == n * (P - 1) * 4);
  CHECK(c->stats.reduce_scatter == n * (P - 1) * 4);
  CHECK(c->stats.all_reduce == 2 * n * (P - 1) * 4 / P);
  CHECK(c->stats.broadcast == (c->rank() == P - 1 && P > 1 ? n * 4 : 0));
}

TEST_CASE("mpi stages device buffers through the host", "[comm][mpi]") {
  register_device_ops(Device::cuda, {fake_alloc, fake_free, fake_set, fake_copy, fake_copy, fake_copy, fake_sync});
  auto c = mpi_world(Device::cuda);
  CHECK(c->device() == Device::cuda);
  const int P = c->size(), r = c->rank();
  std::vector<float> x(3, float(r + 1)), send(P * 2), recv(P * 2);
  for (int j = 0; j < P; j++) send[2 * j] = float(r), send[2 * j + 1] = float(j);
  g_device_copies = 0;
  c->all_reduce(x.data(), 3, DType::f32, ReduceOp::sum);
  c->all_to_all(send.data(), recv.data(), 2, DType::f32);
  CHECK(g_device_copies == 4);  // in and out, twice
  for (float v : x) CHECK(v == P * (P + 1) / 2);
  for (int j = 0; j < P; j++) {
    CHECK(recv[2 * j] == j);
    CHECK(recv[2 * j + 1] == r);
  }
}

TEST_CASE("mpi collectives above a call's count go in pieces", "[comm][mpi]") {
  // MPI counts are ints: past INT_MAX elements per rank (a ZeRO shard of an 8B model over two
  // ranks) every collective splits. The same splitting runs here on small buffers, with the limit
  // lowered to 2 and 3 elements: counts 5 and 7 take three pieces, the last a short one.
  for (size_t limit : {size_t(2), size_t(3)}) {
    INFO("at most " << limit << " elements a call");
    MaxCount lowered(limit);
    all_reduce_cases(world());
    collective_cases(world());
  }
  CHECK_THROWS_WITH(set_mpi_max_count(0), Catch::Matchers::Contains("[1, INT_MAX]"));
  CHECK_THROWS_WITH(set_mpi_max_count(size_t(INT_MAX) + 1), Catch::Matchers::Contains("[1, INT_MAX]"));
  world().barrier();
}
