#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <thread>

#include "runtime/cuda_memory.h"

namespace hydra {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::f64: return ncclFloat64;
  }
  return ncclFloat32;
}

void expect_device_buffer(const TensorView& v) {
  HYDRA_ASSERT(v.device() == Device::cuda && v.is_contiguous(), "NCCL buffers must be contiguous CUDA tensors");
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  CudaStream stream;
  double timeout_s = 300;
};

namespace {
class NcclTransfer final : public Transfer {
 public:
  explicit NcclTransfer(cudaStream_t nccl_stream) {
    done_ = std::make_unique<CudaEvent>();
    done_->record(nccl_stream);
  }
  // Device-side: the caller's stream waits for the transfer; the host does not block.
  void wait() override { done_->wait_on(current_stream()); }

 private:
  std::unique_ptr<CudaEvent> done_;
};

// The NCCL stream waits for everything queued so far on the caller's stream.
void order_after_current(cudaStream_t nccl_stream) {
  CudaEvent ready;
  ready.record(current_stream());
  ready.wait_on(nccl_stream);
}

void current_after(cudaStream_t nccl_stream) {
  CudaEvent done;
  done.record(nccl_stream);
  done.wait_on(current_stream());
}
}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, double timeout_seconds)
    : impl_(std::make_unique<Impl>()), bootstrap_(bootstrap), rank_(bootstrap.rank()), size_(bootstrap.size()) {
  impl_->timeout_s = timeout_seconds;
  ncclUniqueId id{};
  if (rank_ == 0) HYDRA_NCCL_CHECK(ncclGetUniqueId(&id));
  // The id travels over the bootstrap (MPI) communicator as 16-bit words (moved, never reduced).
  static_assert(sizeof(ncclUniqueId) % 2 == 0, "unique id size");
  Tensor raw = Tensor::empty({static_cast<int64_t>(sizeof(id) / 2)}, DType::bf16);
  std::memcpy(raw.data(), &id, sizeof(id));
  bootstrap_.broadcast(raw, 0);
  std::memcpy(&id, raw.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  HYDRA_NCCL_CHECK(ncclCommInitRankConfig(&impl_->comm, size_, id, rank_, &config));
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_ && impl_->comm) ncclCommDestroy(impl_->comm);
}

cudaStream_t NcclCommunicator::stream() const { return impl_->stream.get(); }

std::unique_ptr<Transfer> NcclCommunicator::start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                                            int src) {
  expect_device_buffer(send);
  expect_device_buffer(recv);
  HYDRA_ASSERT(send.dtype() == recv.dtype() && send.numel() == recv.numel(), "send/recv buffers differ");
  order_after_current(stream());
  HYDRA_NCCL_CHECK(ncclGroupStart());
  HYDRA_NCCL_CHECK(ncclSend(send.data(), static_cast<size_t>(send.numel()), nccl_type(send.dtype()), dst, impl_->comm, stream()));
  HYDRA_NCCL_CHECK(ncclRecv(recv.data(), static_cast<size_t>(recv.numel()), nccl_type(recv.dtype()), src, impl_->comm, stream()));
  HYDRA_NCCL_CHECK(ncclGroupEnd());
  return std::make_unique<NcclTransfer>(stream());
}

void NcclCommunicator::all_gather(const TensorView& send, const TensorView& recv) {
  expect_device_buffer(send);
  expect_device_buffer(recv);
  HYDRA_ASSERT(recv.numel() == send.numel() * size_ && send.dtype() == recv.dtype(), "all_gather sizes");
  order_after_current(stream());
  HYDRA_NCCL_CHECK(ncclAllGather(send.data(), recv.data(), static_cast<size_t>(send.numel()), nccl_type(send.dtype()),
                                 impl_->comm, stream()));
  current_after(stream());
}

void NcclCommunicator::all_reduce_sum(const TensorView& buffer) {
  expect_device_buffer(buffer);
  order_after_current(stream());
  HYDRA_NCCL_CHECK(ncclAllReduce(buffer.data(), buffer.data(), static_cast<size_t>(buffer.numel()),
                                 nccl_type(buffer.dtype()), ncclSum, impl_->comm, stream()));
  current_after(stream());
}

void NcclCommunicator::reduce_scatter_sum(const TensorView& send, const TensorView& recv) {
  expect_device_buffer(send);
  expect_device_buffer(recv);
  HYDRA_ASSERT(send.numel() == recv.numel() * size_ && send.dtype() == recv.dtype(), "reduce_scatter_sum sizes");
  order_after_current(stream());
  HYDRA_NCCL_CHECK(ncclReduceScatter(send.data(), recv.data(), static_cast<size_t>(recv.numel()),
                                     nccl_type(recv.dtype()), ncclSum, impl_->comm, stream()));
  current_after(stream());
}

void NcclCommunicator::broadcast(const TensorView& buffer, int root) {
  expect_device_buffer(buffer);
  order_after_current(stream());
  HYDRA_NCCL_CHECK(ncclBroadcast(buffer.data(), buffer.data(), static_cast<size_t>(buffer.numel()),
                                 nccl_type(buffer.dtype()), root, impl_->comm, stream()));
  current_after(stream());
}

void NcclCommunicator::send(const TensorView& buffer, int dst) {
  expect_device_buffer(buffer);
  order_after_current(stream());
  HYDRA_NCCL_CHECK(ncclSend(buffer.data(), static_cast<size_t>(buffer.numel()), nccl_type(buffer.dtype()), dst,
                            impl_->comm, stream()));
  current_after(stream());
}

void NcclCommunicator::recv(const TensorView& buffer, int src) {
  expect_device_buffer(buffer);
  order_after_current(stream());
  HYDRA_NCCL_CHECK(ncclRecv(buffer.data(), static_cast<size_t>(buffer.numel()), nccl_type(buffer.dtype()), src,
                            impl_->comm, stream()));
  current_after(stream());
}

void NcclCommunicator::check_progress() {
  CudaEvent compute_done, comm_done;
  compute_done.record(current_stream());
  comm_done.record(stream());
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t a = cudaEventQuery(compute_done.get()), b = cudaEventQuery(comm_done.get());
    if (a == cudaSuccess && b == cudaSuccess) return;
    if (a != cudaErrorNotReady && a != cudaSuccess) HYDRA_CUDA_CHECK(a);
    if (b != cudaErrorNotReady && b != cudaSuccess) HYDRA_CUDA_CHECK(b);
    ncclResult_t async = ncclSuccess;
    HYDRA_NCCL_CHECK(ncclCommGetAsyncError(impl_->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      throw Error(fmt::format("NCCL failed asynchronously: {} [{}]", ncclGetErrorString(async), describe_location()));
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > impl_->timeout_s) {
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      throw Error(fmt::format("NCCL/GPU work did not finish within {:.0f} s (a peer rank died or hangs?) [{}]",
                              impl_->timeout_s, describe_location()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void NcclCommunicator::barrier() {
  Tensor one = Tensor::zeros({1}, DType::f32, Device::cuda);
  all_reduce_sum(one);
  check_progress();
}

void NcclCommunicator::abort(int exit_code) {
  if (impl_ && impl_->comm) {
    ncclCommAbort(impl_->comm);
    impl_->comm = nullptr;
  }
  bootstrap_.abort(exit_code);
  std::abort();  // not reached: the bootstrap's MPI_Abort ends the process (it is not declared noreturn)
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> sub = bootstrap_.split(color, key);
  auto out = std::make_unique<NcclCommunicator>(*sub, impl_->timeout_s);
  out->owned_bootstrap_ = std::move(sub);
  return out;
}

}  // namespace hydra
