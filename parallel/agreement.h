// Do the ranks run the same thing? Checked before the first collective of every command.
//
// Under mpirun every rank reads its own copy of the model and the inputs; if one node has a stale
// file (another model's FA head sets, a token file of another length, the teacher instead of the
// student), the ranks would enter collectives whose sizes or order differ: buffers written past
// their end, heap corruption, or a hang. So each command first describes what it is about to run as
// named fields (the command, its options, the model config field by field, the dtype and device,
// the token count and a hash of the tokens) and agree_across_ranks() compares them: one all-gather
// of two integers per rank when everything matches; on a mismatch, two more small all-gathers find
// the first field that differs and bring both values to every rank, which raise the same one-line
// UserError naming the two ranks and the field. eval-niah checks every sample the same way.
//
// AgreementGate wraps the world communicator of the `hydra` executable and refuses (internal
// error) every collective until open() is called, which the shared command setup does after the
// check (launch/cli.h agree_on_run): a command that forgets the check fails its tests on one rank.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace hydra {

struct FingerprintField {
  std::string name;   // "option --seq-len", "model num_hidden_layers", "token count"
  std::string value;  // compared verbatim; shown (cut at 160 bytes) in the message
};

class RunFingerprint {
 public:
  void add(std::string name, std::string value);
  // "NAME count" (the number of ids) and "NAME hash" (64-bit FNV-1a of the ids, hex).
  void add_tokens(const std::string& name, std::span<const int32_t> ids);
  const std::vector<FingerprintField>& fields() const { return fields_; }

 private:
  std::vector<FingerprintField> fields_;
};

uint64_t hash_tokens(std::span<const int32_t> ids);

// Collective over `comm` (host or device buffers, staged as needed). Returns when every rank holds
// the same fields; otherwise throws, on every rank, a UserError like
//   "ranks 0 and 2 disagree on <what>: 'model fa_heads' differs (rank 0: [[1],[2,3]]; rank 2: [[0],[2,3]]); ..."
void agree_across_ranks(Communicator& comm, const RunFingerprint& fingerprint, const std::string& what);

class AgreementGate final : public Communicator {
 public:
  explicit AgreementGate(Communicator& inner) : inner_(inner) {}
  // The communicator the agreement itself runs on (no gate).
  Communicator& inner() { return inner_; }
  void open() { open_ = true; }
  bool is_open() const { return open_; }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }
  std::unique_ptr<Transfer> start_send_recv(const TensorView& send, int dst, const TensorView& recv, int src) override {
    check();
    return inner_.start_send_recv(send, dst, recv, src);
  }
  void all_gather(const TensorView& send, const TensorView& recv) override {
    check();
    inner_.all_gather(send, recv);
  }
  void all_reduce_sum(const TensorView& buffer) override {
    check();
    inner_.all_reduce_sum(buffer);
  }
  void reduce_scatter_sum(const TensorView& send, const TensorView& recv) override {
    check();
    inner_.reduce_scatter_sum(send, recv);
  }
  void broadcast(const TensorView& buffer, int root) override {
    check();
    inner_.broadcast(buffer, root);
  }
  void barrier() override {
    check();
    inner_.barrier();
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    check();
    return inner_.split(color, key);
  }
  std::vector<std::string> gather_text(const std::string& text, double timeout_s, const std::string& what) override {
    check();
    return inner_.gather_text(text, timeout_s, what);
  }
  std::string broadcast_text(const std::string& text, double timeout_s, const std::string& what) override {
    check();
    return inner_.broadcast_text(text, timeout_s, what);
  }
  [[noreturn]] void abort(int exit_code) override {
    inner_.abort(exit_code);
    std::_Exit(exit_code);  // not reached: the inner abort does not return
  }
  void send(const TensorView& buffer, int dst) override {
    check();
    inner_.send(buffer, dst);
  }
  void recv(const TensorView& buffer, int src) override {
    check();
    inner_.recv(buffer, src);
  }

 private:
  void check() const {
    HYDRA_ASSERT(open_, "a collective before the ranks agreed on what they run (call agree_on_run first)");
  }
  Communicator& inner_;
  bool open_ = false;
};

}  // namespace hydra
