// hydra bench: one kernel, timed on the GPU, next to the bf16 GEMM ceiling measured in the same
// process (cuBLAS 8192³ unless --ceiling-size says otherwise).
//
// This file is the command: its options, and the report (a log line and a JSON line). The benchmarks
// are in launch/bench/, each checking correctness against the CPU reference on a slice first (the run
// is refused if the slice disagrees), then warming up and reporting the median of --repeat CUDA-event
// timings:
// gemm, attention, gdn: the forward kernels (bench/forward.h states their FLOP counts).
// attention-bwd, gdn-bwd: forward + backward (bench/backward.cpp states their checks and FLOP counts).
// gdn-input: the GDN conv/RoPE/L2 pass, its q/k backward and the conv backward, in GB/s beside a
// device copy measured in the same run instead of the GEMM ceiling (bench/gdn_input.cpp).
// embedding-bwd: the token embedding's backward at [--seq-len, --dim] into --vocab rows, skewed and
// uniform ids, in GB/s beside a device copy (bench/embedding.cpp).
// decode: a whole model's greedy decode steps at long context (bench/decode.h): ms per step,
// tokens/s, cache bytes, peak memory and GB/s beside a device copy, per (--contexts, --batches) cell
// and per kernel variant (--decode-ctas-per-sm, --decode-gemv, --gdn-step, --decode-prefetch, --gemv-tunings).
// gemv: the decode step's four projections and its arg-max timed alone, per GEMV launch shape
// (--gemv-tunings) beside cuBLAS, in GB/s beside a device copy (bench/gemv.h).
// The kernel measured is the one a model run would use (HYDRA_ATTENTION_KERNEL, HYDRA_GDN_KERNEL,
// HYDRA_GDN_SEGMENTS select others); its name is part of the printed label and the JSON line.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "launch/bench/backward.h"
#include "launch/bench/decode.h"
#include "launch/bench/embedding.h"
#include "launch/bench/forward.h"
#include "launch/bench/gdn_input.h"
#include "launch/bench/gemv.h"
#include "launch/cli.h"
#include "launch/kernel_options.h"
#include "model/decode_engine.h"
#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra {
namespace {

struct BenchOptions {
  std::string op;
  std::string seq_len = "32K";
  int64_t heads = 16;
  int64_t kv_heads = 0;
  int64_t head_dim = 128;
  int64_t doc_len = 0;
  int64_t vocab = 512;
  int64_t dim = 256;
  int64_t m = 8192, n = 8192, k = 8192;
  int64_t ceiling_size = 8192;
  int repeat = 10;
  int warmup = 3;
  std::string json_out;
  std::string preset;
  std::string contexts = "32K,128K,512K,1M";
  std::string batches = "1,8,32";
  std::string cuda_graph = "auto";
  std::string decode_ctas_per_sm = "0";
  std::string gdn_step = "separate";
  std::string decode_gemv;
  std::string decode_prefetch;
  std::string gemv_tunings;

  void bind(po::options_description& o) {
    o.add_options()
        ("op", po::value(&op)->required(), "gemm, attention, gdn, attention-bwd, gdn-bwd, gdn-input, embedding-bwd, decode or gemv")
        ("seq-len", po::value(&seq_len)->default_value("32K"), "tokens (all but gemm)")
        ("heads", po::value(&heads)->default_value(16), "query heads (attention) or GDN heads")
        ("kv-heads", po::value(&kv_heads)->default_value(0), "attention KV heads (0: as many as query heads)")
        ("head-dim", po::value(&head_dim)->default_value(128), "64 or 128")
        ("doc-len", po::value(&doc_len)->default_value(0),
         "attention-bwd: pack the tokens as causal documents of this many tokens (0: one sequence)")
        ("vocab", po::value(&vocab)->default_value(512), "embedding-bwd: rows of the embedding table")
        ("dim", po::value(&dim)->default_value(256), "embedding-bwd: columns of the embedding table (the hidden size)")
        ("m", po::value(&m)->default_value(8192), "gemm M")
        ("n", po::value(&n)->default_value(8192), "gemm N")
        ("k", po::value(&k)->default_value(8192), "gemm K")
        ("ceiling-size", po::value(&ceiling_size)->default_value(8192), "square bf16 GEMM measured as the ceiling")
        ("repeat", po::value(&repeat)->default_value(10), "timed launches (median reported)")
        ("warmup", po::value(&warmup)->default_value(3), "untimed launches first")
        ("json-out", po::value(&json_out), "append the JSON line to this file")
        ("preset", po::value(&preset), "decode, gemv: the model (random weights), e.g. hydrahead-1.7b or qwen3-1.7b")
        ("contexts", po::value(&contexts)->default_value("32K,128K,512K,1M"), "decode: cached tokens per sequence, a list")
        ("batches", po::value(&batches)->default_value("1,8,32"), "decode: sequences per step, a list; gemv: rows, a list of values from 1 to 8 (then give it: the default has 32)")
        ("cuda-graph", po::value(&cuda_graph)->default_value("auto")->implicit_value("on"), "decode: on, off or auto (= on: one GPU): replay each step as a CUDA graph, as generate does by default; off: the same kernels launched one by one")
        ("decode-ctas-per-sm", po::value(&decode_ctas_per_sm)->default_value("0"), "decode: the decode attention's split CTAs per SM, a list run in order on the same cache (each value a variant; 0: as many as fit at once)")
        ("gdn-step", po::value(&gdn_step)->default_value("separate"), "decode: the GDN branch's decode kernels to time, a list run in order on the same cache (each CTA count once per entry): separate (conv step, gates and delta-rule step as three launches: the production kernels) and/or fused (one launch)")
        ("decode-gemv", po::value(&decode_gemv), "decode: the projections' kernels to time, a list run in order on the same cache (each with every CTA count): cublas, hydra (the GEMV of kernels/gemv/, batches of at most 8 rows; larger ones stay on cuBLAS) and/or hydra-norm (the GEMV with the input and MLP norms fused into in_proj's and gate/up's); default: HYDRA_DECODE_GEMV's choice (cublas)")
        ("decode-prefetch", po::value(&decode_prefetch), "decode: the L2 weight prefetch's caps to time, a list run in order on the same cache (each with every other variant): off and/or MiB from 1 to 1024 (a layer's o_proj, then MLP gate/up, then MLP down weights, up to the cap, while its attention part runs; kernels/l2_prefetch/); default: HYDRA_DECODE_PREFETCH's choice (off)")
        ("gemv-tunings", po::value(&gemv_tunings), "gemv, decode: the GEMV's launch shapes to time, a comma-separated list, each `default` or settings joined by + (warps=0|4|8|16, ahead=4|8, prefetch=first-slices|tile; as HYDRA_GEMV_TUNING with + for its commas); gemv times each beside cuBLAS, decode runs each cell once per shape with every other variant; default: HYDRA_GEMV_TUNING's choice");
  }
  // The --decode-ctas-per-sm x --decode-gemv x --gdn-step x --decode-prefetch variants; without
  // --decode-gemv / --decode-prefetch, the choice of `kernels` (HYDRA_DECODE_GEMV, HYDRA_DECODE_PREFETCH).
  std::vector<DecodeKernelVariant> kernel_variants(const ops::KernelOptions& kernels) const {
    std::vector<int> ctas;
    std::stringstream counts(decode_ctas_per_sm);
    for (std::string item; std::getline(counts, item, ',');) {
      char* end = nullptr;
      const long n = std::strtol(item.c_str(), &end, 10);
      HYDRA_USER_CHECK(!item.empty() && end && *end == '\0' && n >= 0 && n <= 64,
                       "--decode-ctas-per-sm takes integers from 0 to 64 (got '{}')", item);
      ctas.push_back(static_cast<int>(n));
    }
    HYDRA_USER_CHECK(!ctas.empty(), "--decode-ctas-per-sm needs at least one value");
    const std::vector<ops::DecodeGemvKernel> gemvs =
        decode_gemv.empty() ? std::vector<ops::DecodeGemvKernel>{kernels.decode_gemv}
                            : choice_list<ops::DecodeGemvKernel>(decode_gemv, "--decode-gemv",
                                                                 {{"cublas", ops::DecodeGemvKernel::cublas},
                                                                  {"hydra", ops::DecodeGemvKernel::hydra},
                                                                  {"hydra-norm", ops::DecodeGemvKernel::hydra_norm}}, "kernel");
    const std::vector<ops::GdnDecodeKernel> gdns = choice_list<ops::GdnDecodeKernel>(
        gdn_step, "--gdn-step", {{"separate", ops::GdnDecodeKernel::separate}, {"fused", ops::GdnDecodeKernel::fused}},
        "kernel choice");
    std::vector<int64_t> prefetches;
    std::stringstream caps(decode_prefetch);
    for (std::string item; std::getline(caps, item, ',');) prefetches.push_back(parse_decode_prefetch(item, "--decode-prefetch"));
    if (decode_prefetch.empty()) prefetches.push_back(kernels.decode_prefetch_bytes);
    HYDRA_USER_CHECK(!prefetches.empty(), "--decode-prefetch needs at least one value");
    const std::vector<ops::GemvTuning> shapes = tunings(kernels);
    std::vector<DecodeKernelVariant> out;
    for (const int n : ctas) {
      for (const auto g : gemvs) {
        for (const auto gdn : gdns) {
          for (const int64_t bytes : prefetches) {
            // The tunings matter only where the GEMV runs: cuBLAS once.
            for (const ops::GemvTuning& t : g == ops::DecodeGemvKernel::cublas ? std::vector<ops::GemvTuning>{shapes[0]} : shapes) {
              out.push_back({.ctas_per_sm = n, .gemv = g, .gdn = gdn, .prefetch_bytes = bytes, .gemv_tuning = t});
            }
          }
        }
      }
    }
    return out;
  }
  // --gemv-tunings: comma-separated, settings within one joined by +; without it, `kernels`' choice.
  std::vector<ops::GemvTuning> tunings(const ops::KernelOptions& kernels) const {
    if (gemv_tunings.empty()) return {kernels.gemv_tuning};
    std::vector<ops::GemvTuning> out;
    std::stringstream in(gemv_tunings);
    for (std::string item; std::getline(in, item, ',');) {
      HYDRA_USER_CHECK(!item.empty(), "--gemv-tunings has an empty entry ('{}')", gemv_tunings);
      std::replace(item.begin(), item.end(), '+', ',');
      out.push_back(ops::parse_gemv_tuning(item));
    }
    HYDRA_USER_CHECK(!out.empty(), "--gemv-tunings needs at least one entry");
    return out;
  }
  // The values of a comma-separated list of names given to `flag`, each one of `choices`, in order.
  template <typename E>
  static std::vector<E> choice_list(const std::string& text, const char* flag,
                                    const std::vector<std::pair<std::string, E>>& choices, const char* what) {
    std::string names;  // "a, b and/or c"
    for (size_t i = 0; i < choices.size(); ++i) {
      names += (i == 0 ? "" : i + 1 == choices.size() ? " and/or " : ", ") + choices[i].first;
    }
    std::vector<E> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
      const auto it = std::find_if(choices.begin(), choices.end(), [&](const auto& c) { return c.first == item; });
      HYDRA_USER_CHECK(it != choices.end(), "{} takes {} (got '{}')", flag, names, item);
      out.push_back(it->second);
    }
    HYDRA_USER_CHECK(!out.empty(), "{} needs at least one {}", flag, what);
    return out;
  }
  // A comma-separated list of sizes (accepts 32K, 1M).
  static std::vector<int64_t> size_list(const std::string& text, const char* flag) {
    std::vector<int64_t> out;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) out.push_back(parse_size(item, flag));
    HYDRA_USER_CHECK(!out.empty(), "{} needs at least one value", flag);
    for (const int64_t v : out) HYDRA_USER_CHECK(v >= 1, "{} values must be >= 1 (got {})", flag, v);
    return out;
  }
  void validate() const {
    HYDRA_USER_CHECK(op == "gemm" || op == "attention" || op == "gdn" || op == "gdn-input" || op == "decode" ||
                         op == "gemv" || op == "embedding-bwd" || is_backward_bench_op(op),
                     "--op must be gemm, attention, gdn, attention-bwd, gdn-bwd, gdn-input, embedding-bwd, decode or gemv (got '{}')", op);
    if (op == "gemv") {
      HYDRA_USER_CHECK(!preset.empty(), "--op gemv needs --preset (e.g. hydrahead-1.7b)");
      preset_config(preset);
      for (const int64_t b : size_list(batches, "--batches")) {
        HYDRA_USER_CHECK(b <= ops::kGemvMaxRows, "--op gemv takes --batches up to {} rows (got {})", ops::kGemvMaxRows, b);
      }
      tunings(ops::KernelOptions{});
    }
    HYDRA_USER_CHECK(vocab >= 1 && vocab < (int64_t{1} << 31) && dim >= 1, "--vocab must be in [1, 2^31) and --dim >= 1");
    if (op == "decode") {
      HYDRA_USER_CHECK(!preset.empty(), "--op decode needs --preset (e.g. hydrahead-1.7b)");
      preset_config(preset);  // a UserError listing the presets
      size_list(contexts, "--contexts");
      size_list(batches, "--batches");
      parse_decode_graph(cuda_graph);
      kernel_variants(ops::KernelOptions{});
    }
    parse_size(seq_len, "--seq-len");
    HYDRA_USER_CHECK(head_dim == 64 || head_dim == 128, "--head-dim must be 64 or 128");
    HYDRA_USER_CHECK(heads >= 1 && kv_heads >= 0 && (kv_heads == 0 || heads % kv_heads == 0),
                     "--heads must be a positive multiple of --kv-heads");
    HYDRA_USER_CHECK(repeat >= 1 && warmup >= 0, "--repeat >= 1, --warmup >= 0");
    HYDRA_USER_CHECK(doc_len >= 0 && (doc_len == 0 || op == "attention-bwd"),
                     "--doc-len must be >= 0 and is taken by --op attention-bwd only (got {} with --op {})", doc_len, op);
    if (!json_out.empty()) require_writable_destination(json_out, "JSON output");
  }
};

}  // namespace

int run_bench(App& app, const std::vector<std::string>& args) {
  BenchOptions opt;
  po::options_description desc("hydra bench");
  opt.bind(desc);
  if (!parse_command_line(app, "bench",
                          "--op gemm|attention|gdn|attention-bwd|gdn-bwd|gdn-input [--seq-len 32K --heads 16 --kv-heads 0 --head-dim 128] "
                          "[--doc-len 256 (attention-bwd)] | "
                          "--op embedding-bwd [--seq-len 16K --vocab 512 --dim 256] | "
                          "--op decode --preset NAME [--contexts 32K,128K,512K,1M --batches 1,8,32] [--cuda-graph on|off|auto] "
                          "[--decode-ctas-per-sm 0,2 --decode-gemv cublas,hydra] "
                          "[--gdn-step separate,fused] [--decode-prefetch off,8,32,48] [--gemv-tunings default,prefetch=tile] | "
                          "--op gemv --preset NAME --batches 1,8 [--gemv-tunings default,warps=4+ahead=8+prefetch=tile]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  agree_on_run(app, {});
#if HYDRA_CUDA
  HYDRA_USER_CHECK(cuda_device_count() > 0, "hydra bench needs a CUDA device; none is visible");
  cuda_set_device(app.mpi.local_rank() % cuda_device_count());
  if (opt.op == "decode") {  // bandwidth-bound: its own ceiling (a device copy), no GEMM
    const DecodeBenchOptions d{.preset = opt.preset, .contexts = BenchOptions::size_list(opt.contexts, "--contexts"),
                               .batches = BenchOptions::size_list(opt.batches, "--batches"), .warmup = opt.warmup,
                               .repeat = opt.repeat,
                               .cuda_graph = decode_graph_wanted(parse_decode_graph(opt.cuda_graph), Device::cuda, 1),
                               .variants = opt.kernel_variants(app.kernels)};
    bench_decode(d, app.kernels, [&](const nlohmann::json& r) {
      if (app.world.rank() != 0) return;
      std::cout << r.dump() << std::endl;
      if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << r.dump() << "\n";
    });
    return 0;
  }
  if (opt.op == "gemv") {  // bandwidth-bound: its own ceiling (a device copy), no GEMM
    const GemvBenchOptions g{.preset = opt.preset, .batches = BenchOptions::size_list(opt.batches, "--batches"),
                             .tunings = opt.tunings(app.kernels), .warmup = opt.warmup, .repeat = opt.repeat};
    bench_gemv(g, [&](const nlohmann::json& r) {
      if (app.world.rank() != 0) return;
      std::cout << r.dump() << std::endl;
      if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << r.dump() << "\n";
    });
    return 0;
  }
  if (opt.op == "gdn-input") {  // bandwidth-bound: its own ceiling (a device copy), no GEMM
    const nlohmann::json r =
        bench_gdn_input(parse_size(opt.seq_len, "--seq-len"), opt.heads, opt.head_dim, opt.warmup, opt.repeat);
    if (app.world.rank() == 0) {
      std::cout << r.dump() << std::endl;
      if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << r.dump() << "\n";
    }
    return 0;
  }
  if (opt.op == "embedding-bwd") {  // bandwidth-bound: its own ceiling (a device copy), no GEMM
    const nlohmann::json r =
        bench_embedding_backward(parse_size(opt.seq_len, "--seq-len"), opt.vocab, opt.dim, opt.warmup, opt.repeat);
    if (app.world.rank() == 0) {
      std::cout << r.dump() << std::endl;
      if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << r.dump() << "\n";
    }
    return 0;
  }
  const double ceiling = gemm_tflops(opt.ceiling_size, opt.ceiling_size, opt.ceiling_size, 3, 10);
  log::info("ceiling: cuBLAS bf16 GEMM {}^3 = {:.1f} TFLOP/s", opt.ceiling_size, ceiling);
  nlohmann::json j = {{"command", "bench"}, {"op", opt.op}, {"ceiling_tflops", ceiling}};
  double tflops = 0, ms = 0;
  std::string what;
  if (opt.op == "gemm") {
    tflops = gemm_tflops(opt.m, opt.n, opt.k, opt.warmup, opt.repeat);
    ms = 2.0 * opt.m * opt.n * opt.k / (tflops * 1e12) * 1e3;
    what = opt.m == opt.n && opt.n == opt.k ? fmt::format("gemm {}^3 bf16", opt.m)
                                            : fmt::format("gemm {}x{}x{} bf16", opt.m, opt.n, opt.k);
    j.update({{"m", opt.m}, {"n", opt.n}, {"k", opt.k}});
  } else {
    const int64_t t = parse_size(opt.seq_len, "--seq-len");
    const KernelBenchResult r =
        is_backward_bench_op(opt.op)
            ? bench_backward(opt.op, t, opt.heads, opt.kv_heads, opt.head_dim, opt.doc_len, opt.warmup, opt.repeat,
                             app.kernels)
            : bench_forward(opt.op, t, opt.heads, opt.kv_heads, opt.head_dim, opt.warmup, opt.repeat, app.kernels);
    tflops = r.tflops;
    ms = r.ms;
    what = r.what;
    j.update(r.extra);
  }
  j.update({{"what", what}, {"ms", ms}, {"tflops", tflops}, {"fraction_of_ceiling", tflops / ceiling}});
  log::info("{}: {:.3f} ms, {:.1f} TFLOP/s = {:.2f} of the {:.1f} TFLOP/s GEMM ceiling measured in this run", what, ms,
            tflops, tflops / ceiling, ceiling);
  if (app.world.rank() == 0) {
    std::cout << j.dump() << std::endl;
    if (!opt.json_out.empty()) std::ofstream(opt.json_out, std::ios::app) << j.dump() << "\n";
  }
  return 0;
#else
  (void)app;
  HYDRA_USER_FAIL("hydra bench needs the CUDA path; this build has HYDRA_CUDA=OFF");
#endif
}

}  // namespace hydra
