// The decode step of generation, one engine for every caller (DESIGN.md §1.6): `hydra generate`
// (model/generate.cpp) and `hydra bench --op decode` (launch/bench/decode.cpp) run the same step,
// so the benchmark times the loop users run.
//
// A step: the cache writes the rows' slots, positions and dealing into its persistent step buffer
// (KvCache::begin_decode, one upload), the ids go into this engine's persistent id buffer, and the
// model's decode step, the lm_head and the arg-max run inside a StepArena (runtime/step_arena.h), so
// every tensor the layers allocate takes the same block every step: after the first step of a
// batch size, a step allocates nothing (tests/model/decode_engine_test.cpp counts), and every buffer
// keeps its address. Results land in persistent buffers: the arg-max ids [B] and, on request, the
// fp32 logits [B, V] on the host. With the kernel option decode_pdl (HYDRA_DECODE_PDL=1) the step's
// own kernels are launched with programmatic dependent launch (runtime/programmatic_launch.h): the
// same kernels on the same data, scheduled earlier.
//
// With cuda_graph (the GPU): the first step of a batch size runs eagerly (its blocks are
// allocated), the second is captured as a CUDA graph (runtime/cuda_graph.h) and launched, and later
// steps of that batch size only write their inputs and launch the graph. Over P > 1 ranks the graph
// is P-independent kernels cut at each layer's all-gather (KvCache::attend runs it through
// CudaGraph::outside): a launch replays layer segments with the all-gathers between them on the
// host. Wherever a graph can be captured (the GPU) the cache chunks its attention keys for the whole capacity
// (KvCache::set_whole_capacity), the one launch parameter that would otherwise change from step to
// step, with or without the graph: so an eager engine there runs the graph's kernels one by one and
// the two give the same bits and the same tokens (tests/model/cuda_generate_test.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "model/kv_cache.h"
#include "model/model.h"
#include "runtime/cuda_graph.h"
#include "runtime/step_arena.h"

namespace hydra {

// Whether generation replays its decode step as a CUDA graph (hydra generate, eval-niah and bench
// --cuda-graph on|off|auto): automatic is on exactly where a graph can be captured, else off.
enum class DecodeGraph { off, on, automatic };
std::string_view decode_graph_name(DecodeGraph mode);  // "off", "on", "auto"
DecodeGraph parse_decode_graph(std::string_view name);  // the --cuda-graph value; UserError otherwise
// A graph of the step can be captured: on the GPU, at any number of ranks (over several ranks the
// graph is cut at each layer's all-gather, which runs on the host between its segments:
// runtime/cuda_graph.h).
bool decode_graph_possible(Device device);
// Whether `mode` replays the step on `device` with `ranks` ranks: on, or automatic on the GPU with
// one rank (several ranks replay only with on: each rank's segments equal its eager step bit for
// bit, but their speed on GPUs of their own is not measured yet). The caller has refused `on` where
// it is not possible.
bool decode_graph_wanted(DecodeGraph mode, Device device, int ranks);

struct DecodeEngineOptions {
  bool host_logits = false;  // keep a host buffer for StepResult::logits (sampling, kept logits)
  bool cuda_graph = false;   // capture and replay the step (the GPU only)
};

// The engine's persistent buffers for a cache of `slots` slots (the constructor allocates from this;
// the generation plan, model/generate.h estimate_generation_memory, prices it).
struct DecodeEngineBuffers {
  BufferSpec ids;          // [S] i32, on the device and on the host
  BufferSpec logits;       // [S, V] f32 on the device
  BufferSpec best;         // [S] i32, on the device and on the host
  BufferSpec host_logits;  // [S, V] f32 on the host (host_logits only)
  double bytes(Device device) const;  // all of them (each once on the CPU path: device = host)
};
DecodeEngineBuffers decode_engine_buffers(const ModelConfig& config, int64_t slots, bool host_logits);

// What a step leaves besides the extended caches.
enum class StepResult {
  none,    // nothing: the rows only feed the cache (prompt tokens before the last)
  argmax,  // the arg-max of each row's fp32 logits (−1: non-finite), argmax()
  logits,  // the fp32 logits on the host, logits() (needs host_logits)
};

class DecodeEngine {
 public:
  // Steps of at most cache.slots() rows over `comm` (the communicator the cache's ranks share).
  DecodeEngine(Communicator& comm, const Model& model, KvCache& cache, DecodeEngineOptions options = {});

  // One decode step: row b feeds token ids[b] to slot slots[b] (distinct) at position
  // cache.tokens(slots[b]). Collective over comm.
  void step(std::span<const int64_t> slots, std::span<const int32_t> ids, StepResult result);
  std::span<const int32_t> argmax() const;  // [B] of the last StepResult::argmax step
  std::span<const float> logits() const;    // [B·V] of the last StepResult::logits step

  // Tensor blocks the last step allocated: 0 once a batch size has run a step.
  size_t fresh_blocks() const { return arena_.fresh_blocks(); }
  double arena_bytes() const { return arena_.bytes(); }
  bool graph_launched() const { return graph_launched_; }  // the last step replayed a CUDA graph
  int graph_segments() const { return graph_.segments(); }  // of the captured graph (0: none yet)
  size_t graph_kernel_nodes() const { return graph_.kernel_nodes(); }  // the captured step's kernels (0: none)

 private:
  // The device work of a step of `batch` rows, from the id buffer to the result buffers.
  void run(int64_t batch, StepResult result) const;

  Communicator& comm_;
  const Model& model_;
  KvCache& cache_;
  DecodeEngineOptions options_;
  int64_t batch_ = 0;
  Tensor ids_, ids_host_;        // [S] i32 on the device / host: the step's token ids
  Tensor logits_;                // [S, V] f32 on the device
  Tensor best_, best_host_;      // [S] i32 on the device / host: the rows' arg-max
  Tensor logits_host_;           // [S, V] f32 (host_logits)
  StepArena arena_;
  CudaGraph graph_;
  int64_t graph_batch_ = 0;      // the batch size graph_ was captured for (0: none)
  int64_t warm_batch_ = 0;       // the batch size the arena last ran eagerly
  bool graph_launched_ = false;
};

}  // namespace hydra
