// The ranks' agreement check (parallel/agreement.h) on P = 1..4 MPI ranks: equal fingerprints pass;
// a field that differs on one rank, a field only one rank has, or a different token list is a
// UserError on every rank naming rank 0, the first rank that differs and the field with both values
// (the message is identical everywhere, because every rank builds it from the same gathered data);
// and the gate refuses collectives until it is opened.
#include "parallel/agreement.h"

#include "parallel/mpi_communicator.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

MpiCommunicator& comm_world() {
  static MpiCommunicator comm;
  return comm;
}

RunFingerprint common() {
  RunFingerprint f;
  f.add("command", "forward");
  f.add("option --seq-len", "240");
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  f.add_tokens("input tokens", ids);
  return f;
}

TEST(Agreement, EqualFingerprintsPass) { EXPECT_NO_THROW(agree_across_ranks(comm_world(), common(), "the test")); }

TEST(Agreement, AFieldThatDiffersOnTheLastRankNamesBothRanksAndValues) {
  MpiCommunicator& comm = comm_world();
  const int last = comm.size() - 1;
  RunFingerprint f = common();
  f.add("model fa_heads", comm.rank() == last && last > 0 ? "[[0],[2,3]]" : "[[1],[2,3]]");
  const std::string error = error_of([&] { agree_across_ranks(comm, f, "what to run"); });
  if (comm.size() == 1) {
    EXPECT_EQ(error, "(no error)");
    return;
  }
  EXPECT_EQ(error,
            fmt::format("ranks 0 and {} disagree on what to run: 'model fa_heads' differs (rank 0: [[1],[2,3]]; "
                        "rank {}: [[0],[2,3]]); every rank must run the same command on the same inputs (a stale "
                        "or different file on one node?)",
                        last, last));
}

TEST(Agreement, TokensThatDifferInOneIdAreCaughtByTheirHash) {
  MpiCommunicator& comm = comm_world();
  std::vector<int32_t> ids(1000, 7);
  if (comm.rank() == 1) ids[999] = 8;
  RunFingerprint f;
  f.add_tokens("sample tokens", ids);
  const std::string error = error_of([&] { agree_across_ranks(comm, f, "sample 3 of cell 1"); });
  if (comm.size() == 1) {
    EXPECT_EQ(error, "(no error)");
  } else {
    EXPECT_NE(error.find("ranks 0 and 1 disagree on sample 3 of cell 1: 'sample tokens hash' differs"),
              std::string::npos)
        << error;
  }
}

TEST(Agreement, AFieldOnlyOneRankHasIsShownAsAbsent) {
  MpiCommunicator& comm = comm_world();
  RunFingerprint f = common();
  if (comm.rank() == 1) f.add("option --output", "x.h5");
  const std::string error = error_of([&] { agree_across_ranks(comm, f, "what to run"); });
  if (comm.size() == 1) {
    EXPECT_EQ(error, "(no error)");
  } else {
    EXPECT_NE(error.find("rank 0 has '(nothing)' = (absent) where rank 1 has 'option --output' = x.h5"),
              std::string::npos)
        << error;
  }
}

TEST(Agreement, LongValuesAreCutInTheMessage) {
  MpiCommunicator& comm = comm_world();
  RunFingerprint f;
  f.add("model fa_heads", std::string(400, comm.rank() == 1 ? 'b' : 'a'));
  const std::string error = error_of([&] { agree_across_ranks(comm, f, "what to run"); });
  if (comm.size() > 1) {
    EXPECT_NE(error.find("(rank 0: " + std::string(160, 'a') + "...; rank 1: " + std::string(160, 'b') + "...)"),
              std::string::npos)
        << error;
  }
}

TEST(Agreement, TheGateRefusesCollectivesUntilOpened) {
  AgreementGate gate(comm_world());
  Tensor x = Tensor::zeros({1}, DType::f32);
  // An internal error (a command that forgot the check), raised before anything is sent: no rank waits.
  EXPECT_THROW(gate.all_reduce_sum(x), Error);
  EXPECT_THROW(gate.barrier(), Error);
  agree_across_ranks(gate.inner(), common(), "the test");
  gate.open();
  x.data_as<float>()[0] = 1.0f;
  gate.all_reduce_sum(x);
  EXPECT_EQ(x.data_as<float>()[0], static_cast<float>(comm_world().size()));
}

}  // namespace
}  // namespace hydra::test
