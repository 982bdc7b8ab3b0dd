// GoogleTest main for multi-rank suites: every rank runs every test; the job fails if any rank
// failed. Only rank 0 prints gtest's report; other ranks print failures only, tagged with
// their rank.
#include <gtest/gtest.h>

#include "parallel/mpi_communicator.h"

namespace {
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name(), r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  hydra::MpiRuntime mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(mpi.rank()));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (mpi.rank() == 0) std::printf("[ mpi ] %d ranks, %s\n", mpi.size(), any ? "FAILED on some rank" : "passed on every rank");
  return any;
}
