// Choices among equivalent kernels and measurement switches, as one value that launch/ reads once
// (from the environment, launch/kernel_options.cpp, README "Kernel options"), validates, and passes
// down: the model copies them into each op's parameters (AttentionParams, DeltaRuleParams) and into
// run_concurrently. Nothing below launch/ reads the environment for them. Defaults are the
// production choices; the others exist to compare kernels and to time stages.
#pragma once

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/gemv/gemv.h"
#include "kernels/l2_prefetch/l2_prefetch.h"
#include "runtime/concurrency.h"

namespace hydra::ops {

struct KernelOptions {
  AttentionKernel attention = AttentionKernel::automatic;                    // HYDRA_ATTENTION_KERNEL
  AttentionBackwardKernel attention_backward = AttentionBackwardKernel::automatic;  // HYDRA_ATTENTION_BWD_KERNEL
  int gdn_segments = 0;                    // HYDRA_GDN_SEGMENTS: the in-GPU split of the delta rule (0: chosen)
  GdnProfile gdn_profile = GdnProfile::off;  // HYDRA_GDN_PROFILE
  Branches branches = Branches::concurrent;  // HYDRA_SERIAL_BRANCHES
  // HYDRA_DECODE_PDL: the decode engine launches its step's kernels with programmatic dependent
  // launch (runtime/programmatic_launch.h); off until measured.
  bool decode_pdl = false;
  // The decode attention kernel's split CTAs per SM (0: as many as fit). Not read from the
  // environment: `hydra bench --op decode --decode-ctas-per-sm` sets it to compare chunkings
  // (AttentionParams, attention.h).
  int decode_ctas_per_sm = 0;
  // The GDN branch's decode kernels (ops::gdn_decode_step): separate (three launches) or fused (one
  // launch). Fused is equal to the CPU on an H100 and its branch alone is 1.5x faster (9 against
  // 14 us a layer), but the step with it is no faster (2.61 against 2.71 ms at 32K, batch 1, graph +
  // PDL: cluster/results/h100-2026-12-07-session3), so separate stays the default. Not read from
  // the environment: `hydra bench --op decode --gdn-step` sets it to compare.
  GdnDecodeKernel gdn_decode = GdnDecodeKernel::separate;
  // HYDRA_DECODE_GEMV: the decode step's projections (in_proj, o_proj, the MLP's two) through
  // cuBLAS (ops::linear) or the GEMV of kernels/gemv/ (at most kGemvMaxRows rows, the views it
  // takes; ops::linear otherwise). On an H100 the GEMV is equal to the CPU and deterministic but its
  // kernels take as long as cuBLAS's (52 us a layer at batch 1); the step gains 1-3.5% at batch 1 from
  // one launch fewer and nothing at batch 8 (cluster/results/h100-2026-12-07-session3), so cuBLAS
  // stays the default. hydra-norm: the GEMV, with the input norm and the MLP's norm computed inside
  // in_proj's and gate/up's GEMV (ops::gemv_rms_norm: two launches a layer fewer, the same bits as
  // hydra; on an H100 equal to hydra at batch 1, 13% slower at batch 8: cluster/results/h100-2026-12-07-session5). `hydra bench --op decode --decode-gemv` times all three.
  DecodeGemvKernel decode_gemv = DecodeGemvKernel::cublas;
  // HYDRA_GEMV_TUNING ("warps=8,ahead=8,prefetch=tile", any subset): the GEMV's launch shape in the
  // decode step (ops::GemvTuning; the defaults are the kernel as first measured). Written to compare
  // shapes on a GPU (`hydra bench --op gemv` times them per projection) until one is chosen.
  GemvTuning gemv_tuning{};
  // HYDRA_DECODE_PREFETCH: off (0, the default: on an H100 it costs 1-5% at batch 1, 32K; session5 results) or a cap in bytes. In a
  // decode step on the GPU, once a layer's input projection is done, a side stream asks for up to
  // this many bytes of the layer's o_proj, then MLP gate/up, then MLP down weights in L2
  // (ops::l2_prefetch) while the attention part (FA decode, GDN step, fusion: latency-bound, DRAM
  // mostly idle) runs, and the FA decode marks its cache loads evict-first in L2 so the cache stream
  // does not push the prefetched weights out (AttentionParams::decode_kv_evict_first). The tokens
  // are the same bits with and without it. `hydra bench --op decode --decode-prefetch` times caps.
  int64_t decode_prefetch_bytes = 0;
  // HYDRA_SMALL_ROWS: the CUDA RMSNorm (n ≤ 1024 forward, ≤ 512 backward) and cross-entropy
  // (V ≤ 2048) take their small-row kernels (kernels/small_rows.h): a group of ≤ 32 threads or a warp
  // a row instead of wider groups or a block a row; written for the small-model step and off until a
  // GPU has timed it (cluster/bench/small_model.jobs). Reaches the ops through the per-thread scope
  // that launch/main.cpp opens for the command (SmallRowKernelsScope), not through op parameters.
  bool small_rows = false;
};

}  // namespace hydra::ops
