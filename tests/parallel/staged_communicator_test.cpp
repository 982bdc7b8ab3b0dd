// The host-staged communicator (parallel/staged_communicator.h: what ranks sharing a GPU talk over)
// on CPU ranks, where its buffers are host tensors: the same code as on a GPU but the staging copies,
// so CI runs it without one. Under mpirun with P = 1..4 and 8:
//  - every collective on known values, exact (integers, and floats small enough to be exact), over
//    pieces of 7 elements so that every operation runs in several chunks, for every element type;
//  - sums in rank order: the same bits on every rank, and an all-reduce equal to the reduce-scatter
//    of the same buffer element by element (what makes ZeRO-1's sharded step equal the replicated one);
//  - send/recv posted before compute and completed after, around the ring;
//  - a collective that a peer never joins ends in an error naming it after the time limit (the
//    watchdog), decided by the order of messages, not by timing.
#include <cmath>
#include <cstring>
#include <functional>

#include "parallel/staged_communicator.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

std::unique_ptr<StagedCommunicator> staged(double timeout_s = 120.0) {
  auto comm = StagedCommunicator::over(world(), Device::host, timeout_s);
  comm->set_chunk_elements(7);
  return comm;
}

// A host tensor of `dtype` with value(i) at i (integer types hold the integer values exactly).
Tensor filled(int64_t n, DType dtype, const std::function<double(int64_t)>& value) {
  if (dtype == DType::i32 || dtype == DType::i64) {
    Tensor t = Tensor::empty({n}, dtype);
    for (int64_t i = 0; i < n; ++i) {
      if (dtype == DType::i32) {
        t.data_as<int32_t>()[i] = static_cast<int32_t>(value(i));
      } else {
        t.data_as<int64_t>()[i] = static_cast<int64_t>(value(i));
      }
    }
    return t;
  }
  Tensor f = Tensor::empty({n}, DType::f64);
  for (int64_t i = 0; i < n; ++i) f.data_as<double>()[i] = value(i);
  return to(f, Device::host, dtype);
}

double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::i32: return t.data_as<int32_t>()[i];
    case DType::i64: return static_cast<double>(t.data_as<int64_t>()[i]);
    case DType::f64: return t.data_as<double>()[i];
    case DType::f32: return t.data_as<float>()[i];
    case DType::bf16: return bf16_to_float(t.data_as<bf16>()[i]);
  }
  return 0;
}

// Entries of `got` that differ from want(i) as its element type holds it (bf16: rounded once).
int64_t mismatches(const Tensor& got, const std::function<double(int64_t)>& want) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double w = got.dtype() == DType::bf16 ? static_cast<double>(round_to_bf16(static_cast<float>(want(i)))) : want(i);
    wrong += element(got, i) != w;
  }
  return wrong;
}

TEST(StagedCommunicator, CollectivesOfKnownValuesForEveryType) {
  auto comm = staged();
  const int64_t p = comm->size(), r = comm->rank(), n = 101;
  EXPECT_EQ(comm->name(), "staged-mpi");
  EXPECT_EQ(comm->device(), Device::host);
  for (const DType dtype : {DType::f32, DType::f64, DType::i32, DType::i64, DType::bf16}) {
    const std::string what(dtype_name(dtype));
    // bf16 holds integers up to 256 exactly: keep its values small.
    const double scale = dtype == DType::bf16 ? 1.0 : 1000.0;
    const auto mod = [&](int64_t i) { return static_cast<double>(dtype == DType::bf16 ? i % 8 : i); };
    Tensor sum = filled(n, dtype, [&](int64_t i) { return (r + 1) * mod(i); });
    comm->all_reduce_sum(sum);
    EXPECT_EQ(mismatches(sum, [&](int64_t i) { return static_cast<double>(p * (p + 1) / 2) * mod(i); }), 0) << what << " all_reduce_sum";
    const Tensor rows = filled(p * n, dtype, [&](int64_t j) { return (r + 1) * (scale * ((j / n) % 4) + mod(j % n)); });
    Tensor scattered = Tensor::zeros({n}, dtype);
    comm->reduce_scatter_sum(rows.view().reshape({p, n}), scattered);
    EXPECT_EQ(mismatches(scattered, [&](int64_t i) { return static_cast<double>(p * (p + 1) / 2) * (scale * (r % 4) + mod(i)); }), 0)
        << what << " reduce_scatter_sum";
    Tensor gathered = Tensor::zeros({p, n}, dtype);
    comm->all_gather(filled(n, dtype, [&](int64_t i) { return scale * (r % 4) + mod(i); }), gathered);
    EXPECT_EQ(mismatches(gathered, [&](int64_t i) { return scale * ((i / n) % 4) + mod(i % n); }), 0) << what << " all_gather";
    const int root = static_cast<int>(p - 1);
    Tensor b = filled(n, dtype, [&](int64_t i) { return r == root ? mod(i) + 1 : 0.0; });
    comm->broadcast(b, root);
    EXPECT_EQ(mismatches(b, [&](int64_t i) { return mod(i) + 1; }), 0) << what << " broadcast";
  }
}

// Values whose float sum depends on the order: 1e8 on rank 0, small values elsewhere. Every rank
// must hold the same bits, and the rank-order sum (((x0 + x1) + x2) + …) exactly.
TEST(StagedCommunicator, SumsAreInRankOrderOnEveryRank) {
  auto comm = staged();
  const int64_t p = comm->size(), r = comm->rank(), n = 53;
  const auto value = [&](int64_t rank, int64_t i) { return rank == 0 ? 1e8f + static_cast<float>(i) : 0.75f + 0.125f * static_cast<float>((rank + i) % 5); };
  Tensor mine = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) mine.data_as<float>()[i] = value(r, i);
  Tensor reduced = Tensor::empty({n}, DType::f32);
  std::memcpy(reduced.data(), mine.data(), reduced.nbytes());
  comm->all_reduce_sum(reduced);
  for (int64_t i = 0; i < n; ++i) {
    float acc = value(0, i);
    for (int64_t q = 1; q < p; ++q) acc += value(q, i);
    EXPECT_EQ(reduced.data_as<float>()[i], acc) << "element " << i;
  }
  // Every rank the same bits.
  Tensor all = Tensor::empty({p, n}, DType::f32);
  comm->all_gather(reduced, all);
  for (int64_t q = 0; q < p; ++q) EXPECT_EQ(std::memcmp(all.data_as<float>() + q * n, reduced.data(), reduced.nbytes()), 0) << "rank " << q;
  // The reduce-scatter of [P, n] (row q = this rank's values) equals the all-reduce's elements.
  Tensor rows = Tensor::empty({p, n}, DType::f32);
  for (int64_t q = 0; q < p; ++q) std::memcpy(rows.data_as<float>() + q * n, mine.data(), mine.nbytes());
  Tensor part = Tensor::empty({n}, DType::f32);
  comm->reduce_scatter_sum(rows, part);
  EXPECT_EQ(std::memcmp(part.data(), reduced.data(), part.nbytes()), 0);
}

TEST(StagedCommunicator, SendRecvAroundTheRingAndSplit) {
  auto comm = staged();
  const int p = comm->size(), r = comm->rank(), n = 29;
  // Posted at once, completed by wait(): each rank receives its left neighbour's buffer.
  Tensor send = filled(n, DType::i64, [&](int64_t i) { return 100.0 * r + static_cast<double>(i); });
  Tensor recv = Tensor::zeros({n}, DType::i64);
  auto transfer = comm->start_send_recv(send, (r + 1) % p, recv, (r + p - 1) % p);
  transfer->wait();
  const int from = (r + p - 1) % p;
  EXPECT_EQ(mismatches(recv, [&](int64_t i) { return 100.0 * from + static_cast<double>(i); }), 0);
  // Blocking send/recv between neighbour pairs (even sends first).
  if (p > 1) {
    Tensor x = filled(n, DType::f32, [&](int64_t i) { return static_cast<double>(r * n + i); });
    if (r % 2 == 0 && r + 1 < p) comm->send(x, r + 1);
    if (r % 2 == 1) {
      comm->recv(x, r - 1);
      EXPECT_EQ(mismatches(x, [&](int64_t i) { return static_cast<double>((r - 1) * n + i); }), 0);
    }
  }
  comm->barrier();
  // A split is staged too, over its own ranks: the even and the odd ranks sum apart.
  std::unique_ptr<Communicator> half = comm->split(r % 2, r);
  EXPECT_EQ(half->name(), "staged-mpi");
  Tensor one = filled(1, DType::i32, [](int64_t) { return 1.0; });
  half->all_reduce_sum(one);
  EXPECT_EQ(one.data_as<int32_t>()[0], (p + 1 - r % 2) / 2);
}

// The watchdog: rank 0 enters an all-reduce the others join only after rank 0 has reported its
// error (a world barrier between), so rank 0 always times out; then the others complete the
// abandoned operation (rank 0 kept its buffers alive and progresses it inside the next barrier).
TEST(StagedCommunicator, ACollectiveAPeerNeverJoinsEndsInAnErrorNamingIt) {
  if (world().size() < 2) GTEST_SKIP() << "needs a peer";
  auto comm = staged(0.5);
  Tensor x = Tensor::zeros({3}, DType::f32);
  if (world().rank() == 0) {
    std::string message;
    try {
      comm->all_reduce_sum(x);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("all_reduce_sum over " + std::to_string(world().size()) + " ranks sharing a GPU"), std::string::npos) << message;
    EXPECT_NE(message.find("did not finish within 0.5 s"), std::string::npos) << message;
    world().barrier();
  } else {
    world().barrier();
    comm->all_reduce_sum(x);
  }
  world().barrier();
}

}  // namespace
}  // namespace hydra::test
