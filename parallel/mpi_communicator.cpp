#include "parallel/mpi_communicator.h"

#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <thread>

namespace hydra {

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16: return MPI_UINT16_T;  // moved, never reduced
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::f64: return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

namespace {

int count_of(const TensorView& v) {
  HYDRA_ASSERT(v.is_contiguous(), "MPI buffers must be contiguous, got {}", v.shape_string());
  HYDRA_ASSERT(v.on_host(), "MPI buffers must be host memory");
  HYDRA_ASSERT(v.numel() <= INT_MAX, "MPI message of {} elements exceeds INT_MAX", v.numel());
  return static_cast<int>(v.numel());
}

class MpiTransfer final : public Transfer {
 public:
  MpiTransfer() = default;
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  void wait() override { HYDRA_MPI_CHECK(MPI_Waitall(2, requests, MPI_STATUSES_IGNORE)); }
  ~MpiTransfer() override {
    // A transfer dropped without wait() (an exception unwinding) must not leave MPI writing into
    // freed memory: complete it here; errors are ignored on this path.
    if (requests[0] != MPI_REQUEST_NULL || requests[1] != MPI_REQUEST_NULL) {
      MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
    }
  }
};

constexpr int kRingTag = 17;
constexpr int kTextTag = 29;  // gather_text / broadcast_text: apart from the ring's messages

// Polls until `ready()` or `timeout_s` has passed (false then); a short sleep between polls keeps
// a waiting rank off the cores its peers write with.
bool poll_until(const std::function<bool()>& ready, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Receives the text message from `src` if one has arrived (MPI_Iprobe, then its size).
bool try_receive_text(MPI_Comm comm, int src, std::string& out) {
  int flag = 0;
  MPI_Status status;
  HYDRA_MPI_CHECK(MPI_Iprobe(src, kTextTag, comm, &flag, &status));
  if (!flag) return false;
  int count = 0;
  HYDRA_MPI_CHECK(MPI_Get_count(&status, MPI_CHAR, &count));
  out.assign(static_cast<size_t>(count), '\0');
  HYDRA_MPI_CHECK(MPI_Recv(out.data(), count, MPI_CHAR, src, kTextTag, comm, MPI_STATUS_IGNORE));
  return true;
}

// Posts `text` to `dst` and waits (polling) for the send to complete.
void send_text(MPI_Comm comm, const std::string& text, int dst, double timeout_s, const std::string& what) {
  HYDRA_ASSERT(text.size() <= INT_MAX, "a text message of {} bytes", text.size());
  MPI_Request request = MPI_REQUEST_NULL;
  HYDRA_MPI_CHECK(MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, dst, kTextTag, comm, &request));
  const bool sent = poll_until([&] {
    int done = 0;
    HYDRA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }, timeout_s);
  HYDRA_USER_CHECK(sent, "{}: rank {} took no message within {:.0f} s", what, dst, timeout_s);
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    initialized_here_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  ErrorContext context = error_context();
  context.rank = rank_;
  context.world_size = size_;
  context.host = std::string(host, static_cast<size_t>(len));
  set_error_context(context);
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized_here_ && !finalized) MPI_Finalize();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  HYDRA_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  HYDRA_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

std::unique_ptr<Transfer> MpiCommunicator::start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                                           int src) {
  HYDRA_ASSERT(send.dtype() == recv.dtype(), "send/recv dtypes differ");
  auto t = std::make_unique<MpiTransfer>();
  HYDRA_MPI_CHECK(MPI_Irecv(recv.data(), count_of(recv), mpi_datatype(recv.dtype()), src, kRingTag, comm_, &t->requests[0]));
  HYDRA_MPI_CHECK(MPI_Isend(send.data(), count_of(send), mpi_datatype(send.dtype()), dst, kRingTag, comm_, &t->requests[1]));
  return t;
}

void MpiCommunicator::all_gather(const TensorView& send, const TensorView& recv) {
  HYDRA_ASSERT(recv.numel() == send.numel() * size_ && send.dtype() == recv.dtype(),
               "all_gather: send {} / recv {} on {} ranks", send.shape_string(), recv.shape_string(), size_);
  const int n = count_of(send);
  count_of(recv);
  HYDRA_MPI_CHECK(MPI_Allgather(send.data(), n, mpi_datatype(send.dtype()), recv.data(), n, mpi_datatype(recv.dtype()), comm_));
}

void MpiCommunicator::all_reduce_sum(const TensorView& buffer) {
  HYDRA_ASSERT(buffer.dtype() != DType::bf16, "all_reduce_sum of bf16 on MPI is not supported");
  HYDRA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buffer.data(), count_of(buffer), mpi_datatype(buffer.dtype()), MPI_SUM, comm_));
}

void MpiCommunicator::reduce_scatter_sum(const TensorView& send, const TensorView& recv) {
  HYDRA_ASSERT(send.numel() == recv.numel() * size_ && send.dtype() == recv.dtype() && recv.dtype() != DType::bf16,
               "reduce_scatter_sum: send {} / recv {} ({}) on {} ranks", send.shape_string(), recv.shape_string(),
               dtype_name(recv.dtype()), size_);
  count_of(send);
  HYDRA_MPI_CHECK(MPI_Reduce_scatter_block(send.data(), recv.data(), count_of(recv), mpi_datatype(recv.dtype()), MPI_SUM,
                                           comm_));
}

void MpiCommunicator::broadcast(const TensorView& buffer, int root) {
  HYDRA_MPI_CHECK(MPI_Bcast(buffer.data(), count_of(buffer), mpi_datatype(buffer.dtype()), root, comm_));
}

void MpiCommunicator::barrier() { HYDRA_MPI_CHECK(MPI_Barrier(comm_)); }

MpiCommunicator::~MpiCommunicator() {
  if (owned_) MPI_Comm_free(&comm_);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  HYDRA_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  auto out = std::make_unique<MpiCommunicator>(sub);
  out->owned_ = true;
  return out;
}

std::vector<std::string> MpiCommunicator::gather_text(const std::string& text, double timeout_s,
                                                      const std::string& what) {
  if (rank_ != 0) {
    send_text(comm_, text, 0, timeout_s, what);
    return {};
  }
  std::vector<std::string> texts(static_cast<size_t>(size_));
  std::vector<bool> arrived(static_cast<size_t>(size_), false);
  texts[0] = text;
  arrived[0] = true;
  int missing = size_ - 1;
  const bool all = poll_until([&] {
    for (int q = 1; q < size_; ++q) {
      if (!arrived[static_cast<size_t>(q)] && try_receive_text(comm_, q, texts[static_cast<size_t>(q)])) {
        arrived[static_cast<size_t>(q)] = true;
        --missing;
      }
    }
    return missing == 0;
  }, timeout_s);
  if (!all) {
    std::string silent;
    for (int q = 1; q < size_; ++q) silent += arrived[static_cast<size_t>(q)] ? "" : (silent.empty() ? "" : ", ") + std::to_string(q);
    HYDRA_USER_FAIL("{}: rank(s) {} did not report within {:.0f} s", what, silent, timeout_s);
  }
  return texts;
}

std::string MpiCommunicator::broadcast_text(const std::string& text, double timeout_s, const std::string& what) {
  if (rank_ == 0) {
    for (int q = 1; q < size_; ++q) send_text(comm_, text, q, timeout_s, what);
    return text;
  }
  std::string out;
  HYDRA_USER_CHECK(poll_until([&] { return try_receive_text(comm_, 0, out); }, timeout_s),
                   "{}: no word from rank 0 within {:.0f} s", what, timeout_s);
  return out;
}

void MpiCommunicator::abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this satisfies [[noreturn]] if it ever did
}

void MpiCommunicator::send(const TensorView& buffer, int dst) {
  HYDRA_MPI_CHECK(MPI_Send(buffer.data(), count_of(buffer), mpi_datatype(buffer.dtype()), dst, kRingTag + 1, comm_));
}

void MpiCommunicator::recv(const TensorView& buffer, int src) {
  HYDRA_MPI_CHECK(MPI_Recv(buffer.data(), count_of(buffer), mpi_datatype(buffer.dtype()), src, kRingTag + 1, comm_,
                           MPI_STATUS_IGNORE));
}

}  // namespace hydra
