// MPI implementation of the communicator (CPU ranks; also the bootstrap for NCCL).
//
// MpiRuntime owns MPI_Init/MPI_Finalize for the process: a job started without mpirun is an MPI
// singleton of world size 1, so there is one code path for one and many ranks. Errors return
// (MPI_ERRORS_RETURN) and become exceptions with the MPI error text; abort() is MPI_Abort on
// MPI_COMM_WORLD, which mpirun turns into the end of every rank.
#pragma once

#include <mpi.h>

#include "parallel/communicator.h"

namespace hydra {

class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes on this host (for choosing a GPU); from MPI_Comm_split_type.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool initialized_here_ = false;
};

// The MPI type that moves (or, for numbers, sums) elements of `t`; bf16 travels as 16-bit words.
MPI_Datatype mpi_datatype(DType t);

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::host; }
  std::string name() const override { return "mpi"; }
  std::unique_ptr<Transfer> start_send_recv(const TensorView& send, int dst, const TensorView& recv,
                                            int src) override;
  void all_gather(const TensorView& send, const TensorView& recv) override;
  void all_reduce_sum(const TensorView& buffer) override;
  void reduce_scatter_sum(const TensorView& send, const TensorView& recv) override;
  void broadcast(const TensorView& buffer, int root) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::vector<std::string> gather_text(const std::string& text, double timeout_s, const std::string& what) override;
  std::string broadcast_text(const std::string& text, double timeout_s, const std::string& what) override;
  [[noreturn]] void abort(int exit_code) override;
  void send(const TensorView& buffer, int dst) override;
  void recv(const TensorView& buffer, int src) override;
  // The MPI communicator (for the non-blocking operations of parallel/staged_communicator.h).
  MPI_Comm handle() const { return comm_; }

 private:
  MPI_Comm comm_;
  bool owned_ = false;  // a communicator made by split(), freed with this object
  int rank_ = 0, size_ = 1;
};

}  // namespace hydra
