// A communicator for ranks that share a GPU (HYDRA_SHARE_GPUS=1, a testing mode): NCCL refuses two
// ranks on one device, so every buffer is staged through host memory and moved by MPI between the
// processes. Behind the same interface as NcclCommunicator, so every multi-rank GPU path (ring
// attention, GDN maps and halo, ZeRO-1, the decode collective, checkpoint shards) runs on a machine
// with one GPU. It is for correctness runs: the staging costs two PCIe copies and a host round trip
// per operation, so speed figures from this mode mean nothing (launch/ logs so).
//
// Ordering: an operation first waits (host) for everything queued on the caller's current CUDA
// stream — copy_into's device-to-host copy does that — so buffers written by earlier kernels are
// complete; the result is copied back on the current stream before the call returns. A send/recv
// posts the MPI messages at once and wait() completes them and uploads the received buffer; compute
// queued between start and wait runs while the messages travel (the host does not block there).
//
// Sums are taken in rank order r = 0, 1, …, P−1 on every rank (each rank gathers the parts and adds
// them itself), so every rank holds the same bits and an all-reduce equals the reduce-scatter of the
// same buffer element by element (ZeRO-1's sharded step equals the replicated one bit for bit, as
// over NCCL). bf16 is summed in fp32 and rounded once. This order differs from NCCL's ring order and
// from MPI_Allreduce's: results agree with those paths within rounding, not bit for bit.
//
// Hangs: every MPI operation is non-blocking and polled; one that has not completed within
// `timeout_s` (a peer died or hangs) is an error naming the operation, which ends the job like
// NCCL's watchdog does. check_progress() waits for the current stream under the same limit.
// The buffers may also live on the host (Device::host): the same code then runs on CPU ranks, which
// is how CI exercises it without a GPU.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "parallel/mpi_communicator.h"

namespace hydra {

class StagedCommunicator final : public Communicator {
 public:
  // Takes over `host` (its own MPI communicator, so its messages never mix with another's); buffers
  // live on `device`.
  StagedCommunicator(std::unique_ptr<MpiCommunicator> host, Device device, double timeout_s);
  // Collective over `bootstrap` (an MPI communicator or a gate over one): a communicator of the same
  // ranks, on a duplicate of its MPI communicator.
  static std::unique_ptr<StagedCommunicator> over(Communicator& bootstrap, Device device, double timeout_s);
  ~StagedCommunicator() override;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  Device device() const override { return device_; }
  std::string name() const override { return "staged-mpi"; }
  std::unique_ptr<Transfer> start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                            int src) override;
  void all_gather(const TensorView& send, const TensorView& recv) override;
  void all_reduce_sum(const TensorView& buffer) override;
  void reduce_scatter_sum(const TensorView& send, const TensorView& recv) override;
  void broadcast(const TensorView& buffer, int root) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::vector<std::string> gather_text(const std::string& text, double timeout_s, const std::string& what) override {
    return host_->gather_text(text, timeout_s, what);
  }
  std::string broadcast_text(const std::string& text, double timeout_s, const std::string& what) override {
    return host_->broadcast_text(text, timeout_s, what);
  }
  [[noreturn]] void abort(int exit_code) override { host_->abort(exit_code); }
  void send(const TensorView& buffer, int dst) override;
  void recv(const TensorView& buffer, int src) override;
  void check_progress() override;

  // Elements of one staged piece per rank (host staging stays bounded: a [P, chunk] buffer at most).
  // Tests set it small so that every operation runs over several pieces.
  void set_chunk_elements(int64_t n) { chunk_elements_ = n; }

  // Polls `requests` until all complete; after timeout_s an Error naming `what`, the requests
  // abandoned with the host buffers in `keep` kept alive (never freed under MPI's feet).
  void complete(std::vector<MPI_Request>& requests, const char* what, std::initializer_list<Tensor> keep);

 private:
  int64_t chunk_for(const TensorView& v) const;
  // The rank-order sum of [P, c] rows that `exchange(staged, arrived, request)` (one non-blocking MPI
  // collective) delivers into `arrived` from `piece` staged out as `sum_type`; `what` names it.
  using Exchange = std::function<void(const Tensor& staged, const Tensor& arrived, MPI_Request* request)>;
  Tensor sum_exchanged(const TensorView& piece, int64_t c, DType sum_type, const char* what, const Exchange& exchange);

  std::unique_ptr<MpiCommunicator> host_;
  Device device_;
  double timeout_s_;
  int64_t chunk_elements_ = 0;  // 0: 64 MiB per piece
  std::vector<Tensor> abandoned_;
};

}  // namespace hydra
