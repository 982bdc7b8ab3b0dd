// Sequence parallelism across GPUs, op by op: ring attention (the Hopper kernels, causal, and the
// mma.sync kernels with packed documents), the GDN segment maps and the conv halo, forward and
// backward, at P ranks held to one GPU (a SelfCommunicator on the same device) and to P CPU ranks
// (the same functions on host fp32 copies of the bf16-rounded inputs, over MPI). The P-rank GPU run
// and the one-GPU run execute the same kernels on different blockings; they differ in fp32 merge and
// fold order and in the bf16 roundings of partial results, so each is held to the bound its kernel
// has against the fp32 CPU reference (the per-kernel suites in test_cuda state them), and the
// P-rank CPU comparison to that same bound: it checks the ring, the map fold and the halo exchange
// over the device communicator (NCCL, or host-staged MPI when ranks share a GPU) against their CPU
// form. A lost hop, a wrong fold or a missing halo row is O(1). Rank 0 prints every measured ratio.
// Whole models, ZeRO and generation: gpu_model_parallel_test.cpp. Without a GPU: SKIPPED.
#include "kernels/conv/conv.h"
#include "kernels/l2norm/l2norm.h"
#include "parallel/agreement.h"
#include "parallel/gdn_scan.h"
#include "parallel/ring_attention.h"
#include "parallel/self_communicator.h"
#include "tests/parallel/gpu_parallel_util.h"

namespace hydra::test {
namespace {

// The agreement check over the device communicator (what eval-niah runs per sample on GPUs): buffers
// staged through the device, the same message as on CPU ranks.
TEST(GpuSequenceParallel, AgreementCheckNamesTheRanksThatDiffer) {
  REQUIRE_GPUS();
  Communicator& comm = gpu_comm();
  ASSERT_EQ(comm.device(), Device::cuda);
  RunFingerprint same;
  same.add("answer span", "255 + 1");
  EXPECT_NO_THROW(agree_across_ranks(comm, same, "sample 0"));
  RunFingerprint other = same;
  std::vector<int32_t> ids(512, 3);
  if (comm.rank() == comm.size() - 1) ids[7] = 4;
  other.add_tokens("sample tokens", ids);
  const std::string error = error_of([&] { agree_across_ranks(comm, other, "sample 0"); });
  if (comm.size() > 1) {
    EXPECT_NE(error.find(fmt::format("ranks 0 and {} disagree on sample 0: 'sample tokens hash' differs",
                                     comm.size() - 1)), std::string::npos) << error;
  }
}

// Lengths for P ranks: a short one (segments of 35 tokens: chunk boundaries at odd places; the CPU
// reference runs here) and a long one (500-token segments: many kernel tiles, GPU only).
std::vector<int64_t> op_lengths(int p) { return admissible_lengths(p, {70, 1000}); }

// Packed documents at the short length: starts inside segments, at a segment edge, a 1-token document.
std::vector<int64_t> op_starts(int64_t t) { return {0, 1, 37, t / 3, t / 2 + 5}; }

// One op test's cases on P ranks: each length of op_lengths, the short one also packed into
// documents. `check(t, one, layout, what, short_length)` gets the one-rank layout, this rank's
// layout of P and the case's name ("OP T=… [packed]"); the CPU reference runs at the short length.
template <class Check>
void for_each_case(int p, int rank, const char* op, Check&& check) {
  const std::vector<int64_t> lengths = op_lengths(p);
  for (const int64_t t : lengths) {
    for (const bool packed : {false, true}) {
      const bool short_length = t == lengths.front();
      if (packed && !short_length) continue;
      const std::vector<int64_t> starts = packed ? op_starts(t) : std::vector<int64_t>{};
      check(t, SequenceLayout::zigzag(t, 1, 0, starts), SequenceLayout::zigzag(t, p, rank, starts),
            fmt::format("{} T={}{}", op, t, packed ? " packed" : ""), short_length);
    }
  }
}

struct AttentionResult {
  Tensor out, dq, dk, dv;  // host f32, this rank's rows
};

// Ring attention forward and backward on `comm` (its device) over `layout`: q/k/v/d_out given whole
// (host f32, bf16-rounded), this rank's rows taken; bf16 operands on the GPU, fp32 on the host.
AttentionResult ring_forward_backward(Communicator& comm, const SequenceLayout& layout, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& d_out, const ops::AttentionParams& params) {
  const Device dev = comm.device();
  const DType io = dev == Device::cuda ? DType::bf16 : DType::f32;
  const int64_t tl = layout.local_length(), hq = q.size(1), hk = k.size(1), d = q.size(2);
  const Tensor ql = to(layout.local_rows(q), dev, io), kl = to(layout.local_rows(k), dev, io);
  const Tensor vl = to(layout.local_rows(v), dev, io), dol = to(layout.local_rows(d_out), dev, io);
  Tensor out = Tensor::empty({tl, hq, d}, DType::f32, dev), lse = Tensor::empty({hq, tl}, DType::f32, dev);
  ring_attention(comm, layout, out, lse, ql, kl, vl, params);
  const Tensor out_io = to(out, dev, io);  // what the model keeps (fa_out, storage type)
  Tensor dq = Tensor::empty({tl, hq, d}, DType::f32, dev), dk = Tensor::empty({tl, hk, d}, DType::f32, dev);
  Tensor dv = Tensor::empty({tl, hk, d}, DType::f32, dev);
  ring_attention_backward(comm, layout, dq, dk, dv, dol, ql, kl, vl, out_io, lse, params);
  return {host(out), host(dq), host(dk), host(dv)};
}

// Tolerances: out within the forward kernel's bound against fp32 (RMS 1e-2, max 2e-2: bf16 P·V
// operands); dq/dk/dv within the backward kernel's (RMS 1e-2, max 4e-2: P and dS rounded to bf16 for
// the tensor-core products). The ring adds only fp32 merges and fp32 accumulator hops.
void expect_attention_close(const AttentionResult& a, const AttentionResult& b, const std::string& what) {
  expect_within(a.out, b.out, 1e-2, 2e-2, what + " out");
  expect_within(a.dq, b.dq, 1e-2, 4e-2, what + " dq");
  expect_within(a.dk, b.dk, 1e-2, 4e-2, what + " dk (home after P hops)");
  expect_within(a.dv, b.dv, 1e-2, 4e-2, what + " dv (home after P hops)");
}

TEST(GpuRingAttention, ForwardAndBackwardEqualOneGpuAndCpuRanks) {
  REQUIRE_GPUS();
  Communicator& comm = gpu_comm();
  const int p = comm.size();
  SelfCommunicator self(Device::cuda);
  // 3 query heads on 2 KV heads (GQA with an uneven map), d = 128, τ on.
  const std::vector<int> map = {0, 1, 1};
  const ops::AttentionParams params{.tau_log_base = 362.0, .kv_head_of_query = map};
  for_each_case(p, comm.rank(), "ring", [&](int64_t t, const SequenceLayout& one, const SequenceLayout& layout,
                                            const std::string& what, bool short_length) {
    const Tensor q = rounded_to_bf16(random_tensor({t, 3, 128}, 1)), k = rounded_to_bf16(random_tensor({t, 2, 128}, 2));
    const Tensor v = rounded_to_bf16(random_tensor({t, 2, 128}, 3)), d_out = rounded_to_bf16(random_tensor({t, 3, 128}, 4));
    const AttentionResult many = ring_forward_backward(comm, layout, q, k, v, d_out, params);
    const AttentionResult single = ring_forward_backward(self, one, q, k, v, d_out, params);
    const AttentionResult single_local{local_host_rows(layout, single.out), local_host_rows(layout, single.dq),
                                       local_host_rows(layout, single.dk), local_host_rows(layout, single.dv)};
    expect_attention_close(many, single_local, what + " GPU P vs 1 GPU");
    if (short_length) {
      const AttentionResult cpu = ring_forward_backward(world(), layout, q, k, v, d_out, params);
      expect_attention_close(many, cpu, what + " GPU P vs CPU P");
    }
  });
}

struct GdnResult {
  Tensor out, dq, dk, dv, dg, dbeta;  // host f32, this rank's rows
};

// The sequence-parallel GDN forward (segment maps, one all-gather, the prefix fold) and backward
// (state gradients gathered, the reverse fold) on `comm` over `layout`, with the model's types: q/k/v
// and the outputs' gradients in the storage type, g/β and their gradients in fp32.
GdnResult gdn_forward_backward(Communicator& comm, const SequenceLayout& layout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& g, const Tensor& beta, const Tensor& d_out) {
  const Device dev = comm.device();
  const DType io = dev == Device::cuda ? DType::bf16 : DType::f32;
  const int64_t tl = layout.local_length(), h = q.size(1), dk = q.size(2), dv = v.size(2);
  const Tensor ql = to(layout.local_rows(q), dev, io), kl = to(layout.local_rows(k), dev, io);
  const Tensor vl = to(layout.local_rows(v), dev, io), dol = to(layout.local_rows(d_out), dev, io);
  const Tensor gl = to(layout.local_rows(g), dev, DType::f32), bl = to(layout.local_rows(beta), dev, DType::f32);
  Tensor out = Tensor::empty({tl, h, dv}, io, dev);
  GdnSaved saved;
  gdn_sequence_parallel(comm, layout, out, ql, kl, vl, gl, bl, {}, nullptr, &saved);
  Tensor pdq = Tensor::empty({tl, h, dk}, io, dev), pdk = Tensor::empty({tl, h, dk}, io, dev);
  Tensor pdv = Tensor::empty({tl, h, dv}, io, dev), pdg = Tensor::empty({tl, h}, DType::f32, dev);
  Tensor pdb = Tensor::empty({tl, h}, DType::f32, dev);
  gdn_sequence_parallel_backward(comm, layout, saved, pdq, pdk, pdv, pdg, pdb, dol, ql, kl, vl, gl, bl, {});
  return {host(out), host(pdq), host(pdk), host(pdv), host(pdg), host(pdb)};
}

GdnResult local_of(const SequenceLayout& layout, const GdnResult& r) {
  return {local_host_rows(layout, r.out), local_host_rows(layout, r.dq), local_host_rows(layout, r.dk),
          local_host_rows(layout, r.dv),  local_host_rows(layout, r.dg), local_host_rows(layout, r.dbeta)};
}

// Tolerances (RMS; max in brackets): the chunked kernels' bounds against fp32 (cuda_delta_rule_backward_test):
// out 1e-2 [2e-2]; dq, dk, dv 2e-2 [8e-2]; dg, dβ 4e-2 [1.6e-1] (sums over the chunk of terms of
// both signs). The maps and their fold are fp32 on every path.
void expect_gdn_close(const GdnResult& a, const GdnResult& b, const std::string& what) {
  expect_within(a.out, b.out, 1e-2, 2e-2, what + " out");
  expect_within(a.dq, b.dq, 2e-2, 8e-2, what + " dq");
  expect_within(a.dk, b.dk, 2e-2, 8e-2, what + " dk");
  expect_within(a.dv, b.dv, 2e-2, 8e-2, what + " dv");
  expect_within(a.dg, b.dg, 4e-2, 1.6e-1, what + " dg");
  expect_within(a.dbeta, b.dbeta, 4e-2, 1.6e-1, what + " dbeta");
}

TEST(GpuGdnScan, SegmentMapsForwardAndBackwardEqualOneGpuAndCpuRanks) {
  REQUIRE_GPUS();
  Communicator& comm = gpu_comm();
  const int p = comm.size();
  SelfCommunicator self(Device::cuda);
  for_each_case(p, comm.rank(), "GDN", [&](int64_t t, const SequenceLayout& one, const SequenceLayout& layout,
                                            const std::string& what, bool short_length) {
    Tensor q = random_tensor({t, 2, 128}, 5), k = random_tensor({t, 2, 128}, 6);
    ops::l2_norm(q, 1e-6f);
    ops::l2_norm(k, 1e-6f);
    q = rounded_to_bf16(q);
    k = rounded_to_bf16(k);
    const Tensor v = rounded_to_bf16(random_tensor({t, 2, 128}, 7)), d_out = rounded_to_bf16(random_tensor({t, 2, 128}, 8));
    const Tensor g = uniform_tensor({t, 2}, 9, -0.2f, 0.0f), beta = uniform_tensor({t, 2}, 10, 0.0f, 1.0f);
    const GdnResult many = gdn_forward_backward(comm, layout, q, k, v, g, beta, d_out);
    const GdnResult single = local_of(layout, gdn_forward_backward(self, one, q, k, v, g, beta, d_out));
    expect_gdn_close(many, single, what + " GPU P vs 1 GPU");
    if (short_length) expect_gdn_close(many, gdn_forward_backward(world(), layout, q, k, v, g, beta, d_out), what + " GPU P vs CPU P");
  });
}

struct ConvResult {
  Tensor out, dx, dw;  // host f32: this rank's rows; dw summed over the ranks
};

ConvResult conv_forward_backward(Communicator& comm, const SequenceLayout& layout, const Tensor& x, const Tensor& w,
                                 const Tensor& d_out) {
  const Device dev = comm.device();
  const DType io = dev == Device::cuda ? DType::bf16 : DType::f32;
  const int64_t tl = layout.local_length(), c = x.size(1);
  const Tensor xl = to(layout.local_rows(x), dev, io), dol = to(layout.local_rows(d_out), dev, io);
  const Tensor wd = to(w, dev, DType::f32);
  Tensor out = Tensor::empty({tl, c}, io, dev);
  causal_conv_sequence_parallel(comm, layout, out, xl, wd);
  Tensor dx = Tensor::empty({tl, c}, io, dev), dw = Tensor::zeros({c, w.size(1)}, DType::f32, dev);
  causal_conv_sequence_parallel_backward(comm, layout, dx, dw, dol, xl, wd);
  comm.all_reduce_sum(dw);  // each rank holds its tokens' share
  return {host(out), host(dx), host(dw)};
}

// Tolerances: out and dx are bf16 (one rounding of an fp32 4-tap sum: 2^-8 relative, RMS 4e-3,
// max 1e-2); dw is an fp32 sum over every token of bf16 products (RMS 1e-2, max 2e-2).
void expect_conv_close(const ConvResult& a, const ConvResult& b, const std::string& what) {
  expect_within(a.out, b.out, 4e-3, 1e-2, what + " out");
  expect_within(a.dx, b.dx, 4e-3, 1e-2, what + " dx (halo rows returned)");
  expect_within(a.dw, b.dw, 1e-2, 2e-2, what + " dw (summed over ranks)");
}

TEST(GpuConvHalo, ForwardAndBackwardEqualOneGpuAndCpuRanks) {
  REQUIRE_GPUS();
  Communicator& comm = gpu_comm();
  const int p = comm.size();
  SelfCommunicator self(Device::cuda);
  for_each_case(p, comm.rank(), "conv", [&](int64_t t, const SequenceLayout& one, const SequenceLayout& layout,
                                            const std::string& what, bool short_length) {
    const Tensor x = rounded_to_bf16(random_tensor({t, 64}, 11)), d_out = rounded_to_bf16(random_tensor({t, 64}, 12));
    const Tensor w = random_tensor({64, 4}, 13);
    const ConvResult many = conv_forward_backward(comm, layout, x, w, d_out);
    ConvResult single = conv_forward_backward(self, one, x, w, d_out);
    single.out = local_host_rows(layout, single.out);
    single.dx = local_host_rows(layout, single.dx);
    expect_conv_close(many, single, what + " GPU P vs 1 GPU");
    if (short_length) expect_conv_close(many, conv_forward_backward(world(), layout, x, w, d_out), what + " GPU P vs CPU P");
  });
}

}  // namespace
}  // namespace hydra::test
