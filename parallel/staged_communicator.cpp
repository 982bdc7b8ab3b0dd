#include "parallel/staged_communicator.h"

#include <chrono>
#include <climits>
#include <thread>

#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

constexpr int kPairTag = 31;     // start_send_recv
constexpr int kBlockingTag = 32;  // send / recv
constexpr int64_t kChunkBytes = int64_t{64} << 20;

// The element type a sum is taken in on the host: bf16 sums in fp32 (rounded once at the end).
DType sum_dtype(DType t) { return t == DType::bf16 ? DType::f32 : t; }

// A contiguous host copy of `v` as `dtype` (waits for the caller's current stream on the GPU).
Tensor stage_out(const TensorView& v, DType dtype) {
  Tensor h = Tensor::empty(v.shape(), dtype, Device::host);
  copy_into(h, v);
  return h;
}

int mpi_count(int64_t n) {
  HYDRA_ASSERT(n <= INT_MAX, "a staged message of {} elements exceeds INT_MAX", n);
  return static_cast<int>(n);
}

// out[i] = rows[0][i] + rows[1][i] + … + rows[P−1][i], added in that order.
template <class T>
void sum_rows_in_rank_order(const Tensor& rows, const Tensor& out) {
  const int64_t p = rows.size(0), n = rows.size(1);
  const T* in = rows.data_as<T>();
  T* o = out.data_as<T>();
  for (int64_t i = 0; i < n; ++i) {
    T acc = in[i];
    for (int64_t r = 1; r < p; ++r) acc += in[r * n + i];
    o[i] = acc;
  }
}

Tensor sum_in_rank_order(const Tensor& rows) {
  Tensor out = Tensor::empty({rows.size(1)}, rows.dtype(), Device::host);
  switch (rows.dtype()) {
    case DType::f32: sum_rows_in_rank_order<float>(rows, out); break;
    case DType::f64: sum_rows_in_rank_order<double>(rows, out); break;
    case DType::i32: sum_rows_in_rank_order<int32_t>(rows, out); break;
    case DType::i64: sum_rows_in_rank_order<int64_t>(rows, out); break;
    case DType::bf16: HYDRA_ASSERT(false, "bf16 is summed as float32"); break;
  }
  return out;
}

TensorView flat(const TensorView& v) {
  HYDRA_ASSERT(v.is_contiguous(), "staged buffers must be contiguous, got {}", v.shape_string());
  return v.reshape({-1});
}

}  // namespace

class StagedTransfer final : public Transfer {
 public:
  StagedTransfer(StagedCommunicator& comm, Tensor send, Tensor staged_recv, TensorView recv)
      : comm_(comm), send_(std::move(send)), staged_recv_(std::move(staged_recv)), recv_(recv) {}
  ~StagedTransfer() override {
    // Dropped without wait() (an exception unwinding): complete the messages so MPI never writes
    // into freed memory; errors are ignored on this path.
    if (requests_[0] != MPI_REQUEST_NULL || requests_[1] != MPI_REQUEST_NULL) MPI_Waitall(2, requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    comm_.complete(requests_, "send/recv", {send_, staged_recv_});
    copy_into(recv_, staged_recv_);
  }
  std::vector<MPI_Request> requests_ = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};

 private:
  StagedCommunicator& comm_;
  Tensor send_, staged_recv_;
  TensorView recv_;
};

StagedCommunicator::StagedCommunicator(std::unique_ptr<MpiCommunicator> host, Device device, double timeout_s)
    : host_(std::move(host)), device_(device), timeout_s_(timeout_s) {
  HYDRA_ASSERT(timeout_s_ > 0, "staged communicator: time limit {} s", timeout_s_);
}

StagedCommunicator::~StagedCommunicator() = default;

std::unique_ptr<StagedCommunicator> StagedCommunicator::over(Communicator& bootstrap, Device device, double timeout_s) {
  std::unique_ptr<Communicator> dup = bootstrap.split(0, bootstrap.rank());
  HYDRA_ASSERT(dynamic_cast<MpiCommunicator*>(dup.get()) != nullptr,
               "ranks sharing a GPU need an MPI bootstrap communicator (got {})", dup->name());
  std::unique_ptr<MpiCommunicator> host(static_cast<MpiCommunicator*>(dup.release()));
  return std::make_unique<StagedCommunicator>(std::move(host), device, timeout_s);
}

void StagedCommunicator::complete(std::vector<MPI_Request>& requests, const char* what, std::initializer_list<Tensor> keep) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    HYDRA_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) {
      // MPI may still write into these buffers: they live as long as the process.
      abandoned_.insert(abandoned_.end(), keep.begin(), keep.end());
      for (MPI_Request& r : requests) r = MPI_REQUEST_NULL;
      throw Error(fmt::format("{} over {} ranks sharing a GPU (host-staged MPI) did not finish within {:g} s "
                              "(a peer rank died or hangs?) [{}]", what, size(), timeout_s_, describe_location()));
    }
    // Spin briefly (short messages), then poll gently so ranks sharing a core keep it for work.
    if (polls < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

int64_t StagedCommunicator::chunk_for(const TensorView& v) const {
  if (chunk_elements_ > 0) return chunk_elements_;
  return std::max<int64_t>(1, kChunkBytes / static_cast<int64_t>(dtype_size(sum_dtype(v.dtype()))) / size());
}

std::unique_ptr<Transfer> StagedCommunicator::start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                                              int src) {
  HYDRA_ASSERT(send.dtype() == recv.dtype() && send.numel() == recv.numel(), "send/recv buffers differ");
  Tensor out = stage_out(send, send.dtype());
  Tensor in = Tensor::empty(recv.shape(), recv.dtype(), Device::host);
  auto t = std::make_unique<StagedTransfer>(*this, out, in, recv);
  const MPI_Datatype type = mpi_datatype(send.dtype());
  HYDRA_MPI_CHECK(MPI_Irecv(in.data(), mpi_count(in.numel()), type, src, kPairTag, host_->handle(), &t->requests_[0]));
  HYDRA_MPI_CHECK(MPI_Isend(out.data(), mpi_count(out.numel()), type, dst, kPairTag, host_->handle(), &t->requests_[1]));
  return t;
}

void StagedCommunicator::all_gather(const TensorView& send, const TensorView& recv) {
  HYDRA_ASSERT(recv.numel() == send.numel() * size() && send.dtype() == recv.dtype(),
               "all_gather: send {} / recv {} on {} ranks", send.shape_string(), recv.shape_string(), size());
  const TensorView in = flat(send), all = flat(recv).reshape({size(), in.numel()});
  const int64_t n = in.numel(), chunk = chunk_for(send);
  const MPI_Datatype type = mpi_datatype(send.dtype());
  for (int64_t a = 0; a < n; a += chunk) {
    const int64_t c = std::min(chunk, n - a);
    Tensor piece = stage_out(in.narrow(0, a, c), send.dtype());
    Tensor gathered = Tensor::empty({size(), c}, send.dtype(), Device::host);
    std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
    HYDRA_MPI_CHECK(MPI_Iallgather(piece.data(), mpi_count(c), type, gathered.data(), mpi_count(c), type, host_->handle(),
                                   &req[0]));
    complete(req, "all_gather", {piece, gathered});
    copy_into(all.narrow(1, a, c), gathered);
  }
}

Tensor StagedCommunicator::sum_exchanged(const TensorView& piece, int64_t c, DType sum_type, const char* what,
                                         const Exchange& exchange) {
  Tensor staged = stage_out(piece, sum_type);
  Tensor arrived = Tensor::empty({size(), c}, sum_type, Device::host);
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  exchange(staged, arrived, &req[0]);
  complete(req, what, {staged, arrived});
  return sum_in_rank_order(arrived);
}

void StagedCommunicator::all_reduce_sum(const TensorView& buffer) {
  const TensorView v = flat(buffer);
  const DType st = sum_dtype(buffer.dtype());
  const int64_t n = v.numel(), chunk = chunk_for(buffer);
  for (int64_t a = 0; a < n; a += chunk) {
    const int64_t c = std::min(chunk, n - a);
    // Every rank's piece to every rank, each then summed in rank order.
    copy_into(v.narrow(0, a, c), sum_exchanged(v.narrow(0, a, c), c, st, "all_reduce_sum",
                                               [&](const Tensor& staged, const Tensor& arrived, MPI_Request* request) {
                                                 HYDRA_MPI_CHECK(MPI_Iallgather(staged.data(), mpi_count(c), mpi_datatype(st),
                                                                                arrived.data(), mpi_count(c), mpi_datatype(st),
                                                                                host_->handle(), request));
                                               }));
  }
}

void StagedCommunicator::reduce_scatter_sum(const TensorView& send, const TensorView& recv) {
  HYDRA_ASSERT(send.numel() == recv.numel() * size() && send.dtype() == recv.dtype(),
               "reduce_scatter_sum: send {} / recv {} on {} ranks", send.shape_string(), recv.shape_string(), size());
  const TensorView out = flat(recv), rows = flat(send).reshape({size(), out.numel()});
  const DType st = sum_dtype(send.dtype());
  const int64_t n = out.numel(), chunk = chunk_for(send);
  for (int64_t a = 0; a < n; a += chunk) {
    const int64_t c = std::min(chunk, n - a);
    // Row q of this rank's [P, c] piece goes to rank q; row r of what arrives is rank r's row for us.
    copy_into(out.narrow(0, a, c), sum_exchanged(rows.narrow(1, a, c), c, st, "reduce_scatter_sum",
                                                 [&](const Tensor& staged, const Tensor& arrived, MPI_Request* request) {
                                                   HYDRA_MPI_CHECK(MPI_Ialltoall(staged.data(), mpi_count(c), mpi_datatype(st),
                                                                                 arrived.data(), mpi_count(c), mpi_datatype(st),
                                                                                 host_->handle(), request));
                                                 }));
  }
}

void StagedCommunicator::broadcast(const TensorView& buffer, int root) {
  const TensorView v = flat(buffer);
  const int64_t n = v.numel(), chunk = chunk_for(buffer);
  for (int64_t a = 0; a < n; a += chunk) {
    const int64_t c = std::min(chunk, n - a);
    Tensor piece = rank() == root ? stage_out(v.narrow(0, a, c), buffer.dtype())
                                  : Tensor::empty({c}, buffer.dtype(), Device::host);
    std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
    HYDRA_MPI_CHECK(MPI_Ibcast(piece.data(), mpi_count(c), mpi_datatype(buffer.dtype()), root, host_->handle(), &req[0]));
    complete(req, "broadcast", {piece});
    if (rank() != root) copy_into(v.narrow(0, a, c), piece);
  }
}

void StagedCommunicator::barrier() {
  check_progress();
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  HYDRA_MPI_CHECK(MPI_Ibarrier(host_->handle(), &req[0]));
  complete(req, "barrier", {});
}

void StagedCommunicator::send(const TensorView& buffer, int dst) {
  Tensor out = stage_out(buffer, buffer.dtype());
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  HYDRA_MPI_CHECK(MPI_Isend(out.data(), mpi_count(out.numel()), mpi_datatype(out.dtype()), dst, kBlockingTag,
                            host_->handle(), &req[0]));
  complete(req, "send", {out});
}

void StagedCommunicator::recv(const TensorView& buffer, int src) {
  Tensor in = Tensor::empty(buffer.shape(), buffer.dtype(), Device::host);
  std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
  HYDRA_MPI_CHECK(MPI_Irecv(in.data(), mpi_count(in.numel()), mpi_datatype(in.dtype()), src, kBlockingTag,
                            host_->handle(), &req[0]));
  complete(req, "recv", {in});
  copy_into(buffer, in);
}

std::unique_ptr<Communicator> StagedCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> sub = host_->split(color, key);
  std::unique_ptr<MpiCommunicator> host(static_cast<MpiCommunicator*>(sub.release()));
  return std::make_unique<StagedCommunicator>(std::move(host), device_, timeout_s_);
}

void StagedCommunicator::check_progress() {
#if HYDRA_CUDA
  if (device_ != Device::cuda) return;
  CudaEvent done;
  done.record(current_stream());
  const auto start = std::chrono::steady_clock::now();
  while (!done.ready()) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) {
      throw Error(fmt::format("GPU work did not finish within {:g} s [{}]", timeout_s_, describe_location()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
#endif
}

}  // namespace hydra
