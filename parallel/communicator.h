// The communicator interface: what sequence parallelism needs from MPI (CPU ranks) or NCCL (GPUs).
//
// Buffers are tensor views; element counts and types come from the views, never from byte
// arithmetic. An MPI communicator takes host views, an NCCL one device views (device() says which).
// Collectives are called by every rank in the same order. Non-blocking exchanges return a
// Transfer; wait() completes it (MPI: the host blocks; NCCL: the calling thread's current CUDA
// stream is made to wait, the host does not block).
//
// abort() ends every rank of the job with the message and never returns: a failure on one rank
// must not leave the others waiting in a collective.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace hydra {

class Transfer {
 public:
  virtual ~Transfer() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where buffers handed to this communicator must live.
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // Sends `send` to rank `dst` and receives `recv` from rank `src`, both posted now.
  virtual std::unique_ptr<Transfer> start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                                    int src) = 0;
  // recv [P, ...] receives every rank's `send` [...] in rank order.
  virtual void all_gather(const TensorView& send, const TensorView& recv) = 0;
  // buffer ← Σ over ranks (f32 or integer types).
  virtual void all_reduce_sum(const TensorView& buffer) = 0;
  // recv [n] ← Σ over ranks of row `rank()` of every rank's `send` [P, n] (f32/f64): the reduction
  // of a buffer cut into P equal parts, each rank receiving its own part (ZeRO's gradient step).
  virtual void reduce_scatter_sum(const TensorView& send, const TensorView& recv) = 0;
  virtual void broadcast(const TensorView& buffer, int root) = 0;
  virtual void barrier() = 0;
  // The ranks that pass the same `color` form a new communicator on the same device, ranked by
  // `key` (MPI_Comm_split; a new NCCL communicator over the split bootstrap). Collective.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  [[noreturn]] virtual void abort(int exit_code) = 0;

  // Host text messages with their own time limit, apart from the collectives (and from NCCL's
  // watchdog): a checkpoint's shards report to rank 0, which answers every rank. gather_text
  // returns every rank's `text` in rank order on rank 0 (empty elsewhere); broadcast_text returns
  // rank 0's `text` on every rank. A rank silent for `timeout_s` seconds is a UserError naming it
  // and `what` (its rank then ends the job); the host polls, so a slow disk costs no collective.
  virtual std::vector<std::string> gather_text(const std::string& text, double timeout_s, const std::string& what) = 0;
  virtual std::string broadcast_text(const std::string& text, double timeout_s, const std::string& what) = 0;

  // Blocking point-to-point helpers built on start_send_recv where convenient.
  virtual void send(const TensorView& buffer, int dst) = 0;
  virtual void recv(const TensorView& buffer, int src) = 0;

  // A host synchronisation point: blocks until the device work queued so far (and the
  // communicator's own transfers) has finished, and turns a failed or hung peer into an exception
  // after the communicator's time limit (NCCL's watchdog). Nothing is queued on CPU ranks: no-op.
  virtual void check_progress() {}
};

// Sums a small host buffer over the ranks, staging it through the communicator's device (NCCL
// works on device memory only); the result lands back in `buffer` on every rank.
void all_reduce_sum_host(Communicator& comm, const Tensor& buffer);

}  // namespace hydra
