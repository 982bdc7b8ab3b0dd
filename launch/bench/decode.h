// hydra bench --op decode: generation speed of a whole model on one GPU at long context, without a
// prefill: every slot's cache is filled with random K/V and GDN states (speed does not depend on the
// values), then greedy decode steps are timed: the step `hydra generate` runs (model/decode_engine.h),
// wall clock per step, the host's work included (the step writes its rows into the persistent step
// buffers, runs every layer through Model::decode_step, forms the logits and their arg-max on the GPU
// and brings the ids back; replayed as a CUDA graph after two steps, one launch a step, unless
// --cuda-graph off). Per (context, batch) cell it reports ms per
// step (= ms per generated token at batch 1), tokens/s, cache bytes per token and in all, peak
// memory; the bytes a step must read at least (every weight once, every row's cache, the GDN states
// read and written) over the step time, as GB/s and as fractions of a device copy measured in the
// same run and of the card's datasheet bandwidth (the GPU named in the line); and, for the anchors of cluster/bench/decode_anchor.py, one layer's decode attention
// (ops::attention_decode over the FA KV heads' cache) and one layer's GDN step
// (ops::delta_rule_step over the GDN heads) timed alone with CUDA events.
//
// Correctness first: before timing, one layer's decode attention and GDN step at the first cell are
// compared with their CPU references on bf16-rounded inputs (the run ends if they disagree).
// A cell whose cache does not fit the GPU's free memory is skipped with a line saying so.
//
// --decode-ctas-per-sm / --decode-gemv / --gdn-step / --decode-prefetch run each cell once per
// kernel variant (the decode attention's split CTAs per SM, the projections through cuBLAS or the
// GEMV of kernels/gemv/, the GDN branch's decode kernels of ops::gdn_decode_step: separate or fused,
// the L2 weight prefetch off or at a cap: KernelOptions::decode_prefetch_bytes; the cache filled once
// per cell, every variant timed from the same cached length, checked at the first cell: the GEMV on
// one layer's four projections at the cell's batch and the GDN branch against the CPU reference),
// so one GPU job sweeps the attention's split CTAs per SM, times the GEMV beside cuBLAS and the
// fused GDN branch beside the separate kernels and the prefetch's caps beside none; every line
// names its variant, and with --gdn-step
// adds that branch of one layer timed alone (conv step, gates and delta-rule step: three launches
// or one).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/kernel_options.h"

namespace hydra {

// One kernel choice the bench times: the decode attention's split CTAs per SM (0: as many as fit;
// AttentionParams::decode_ctas_per_sm), the projections' kernel (KernelOptions::decode_gemv), the
// GDN branch's decode kernels (KernelOptions::gdn_decode) and the L2 weight prefetch's cap in bytes
// (0: off; KernelOptions::decode_prefetch_bytes).
struct DecodeKernelVariant {
  int ctas_per_sm = 0;
  ops::DecodeGemvKernel gemv = ops::DecodeGemvKernel::cublas;
  ops::GdnDecodeKernel gdn = ops::GdnDecodeKernel::separate;
  int64_t prefetch_bytes = 0;
  ops::GemvTuning gemv_tuning;  // the GEMV's launch shape (KernelOptions::gemv_tuning)
};

struct DecodeBenchOptions {
  std::string preset;
  std::vector<int64_t> contexts;
  std::vector<int64_t> batches;
  int warmup = 3;
  int repeat = 10;
  uint64_t seed = 1;
  bool cuda_graph = true;  // the step replayed as a CUDA graph (model/decode_engine.h); false: eager
  std::vector<DecodeKernelVariant> variants = {{}};  // each cell runs once per variant, in order
};

// The memory bandwidth on the datasheet of the GPU named `device_name` (as the driver names it), in
// GB/s: H100 SXM 3350, H100 NVL 3900, H100 PCIe 2000, H200 4800; 0 for a card not listed.
double datasheet_bandwidth_gb_per_s(const std::string& device_name);

// Runs every (context, batch) cell in order, calling `emit` with one JSON object per cell (measured
// or skipped). CUDA builds only.
void bench_decode(const DecodeBenchOptions& options, const ops::KernelOptions& kernels,
                  const std::function<void(const nlohmann::json&)>& emit);

}  // namespace hydra
