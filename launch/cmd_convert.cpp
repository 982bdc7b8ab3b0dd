// hydra convert: a Qwen3 teacher into a HydraHead student (DESIGN.md §1.3).
#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "launch/cli.h"
#include "launch/model_source.h"
#include "model/convert.h"
#include "model/fa_heads_file.h"
#include "model/nonfinite.h"
#include "model/sequence_length.h"
#include "parallel/device_world.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"
#include "runtime/token_file.h"

namespace hydra {
namespace {

struct ConvertOptions {
  std::string teacher;
  std::string fa_heads;
  std::string scores;
  std::string out;
  std::string calib;
  std::string fusion = "scale_norm";
  std::string calib_seq_len = "4K", calib_tokens = "64K";
  std::string device = "auto";
  double nccl_timeout = 600;
  uint64_t seed = 0;
  bool allow_nonfinite = false;

  void bind(po::options_description& o) {
    o.add_options()
        ("teacher", po::value(&teacher)->required(), "Qwen3 teacher checkpoint (.h5, from hydra import or init)")
        ("fa-heads", po::value(&fa_heads)->required(),
         "which heads keep full attention: uniform:K (K per layer), random:K (K per layer drawn from --seed), "
         "random-global:K[@DRAW] (K heads anywhere in the model, drawn from --seed or DRAW), top-global:K / bottom-global:K "
         "(the K highest / lowest --scores across all layers; a layer may get none), layerwise:EVERY[@OFFSET] "
         "(layer l all-FA when l % EVERY == OFFSET, default EVERY-1: layerwise:4 = 3:1 hybrid) or file:PATH "
         "(hydra select-heads output)")
        ("scores", po::value(&scores), "head-set file whose scores.composite ranks the heads: required by top-global:K "
                                       "and bottom-global:K; with uniform:K, the K best per layer instead of the lowest indices")
        ("out", po::value(&out)->required(), "HydraHead checkpoint to write (.h5), written atomically")
        ("calib", po::value(&calib), "calibration tokens (.h5 input_ids; document_offsets respected): set each head's "
                                     "gamma to the RMS of the teacher's head output over them, for --fusion scale to "
                                     "that RMS over the student head's own (else gamma = 1)")
        ("calib-seq-len", po::value(&calib_seq_len)->default_value(calib_seq_len), "tokens per calibration window: the "
         "--calib stream runs as windows of this length (documents inside a window each alone), so the cost is linear in "
         "the tokens; accepts 4K; a multiple of 2·ranks under mpirun")
        ("calib-tokens", po::value(&calib_tokens)->default_value(calib_tokens), "calibration tokens read at most (the "
         "first ones of --calib, whole windows; 0: all); accepts 64K, 1M")
        ("device", po::value(&device)->default_value(device), "where the calibration forward runs: cuda (bf16 weights), "
         "cpu (fp32) or auto (cuda when a GPU is present)")
        ("nccl-timeout", po::value(&nccl_timeout)->default_value(600), "seconds before a stuck NCCL operation ends the job")
        ("fusion", po::value(&fusion)->default_value("scale_norm"),
         "how head outputs are fused before W_o: scale_norm (gamma * RMSNorm(o; w)), norm (RMSNorm(o; w)), "
         "scale (gamma * o), concat (o, as the teacher) or gate (2 sigmoid(u . x_norm + b) * gamma * RMSNorm(o; w), "
         "u and b start at 0)")
        ("seed", po::value(&seed)->default_value(0), "seed of the new GDN parameters (w_a, w_b, A_log, dt_bias) and of --fa-heads random:K / random-global:K");
    ModelSource::bind_allow_nonfinite(o, &allow_nonfinite);
  }
  void validate() const {
    ops::fusion_from_name(fusion, "--fusion");
    require_readable_file(teacher, "teacher");
    if (!calib.empty()) require_readable_file(calib, "calibration");
    HYDRA_USER_CHECK(parse_size(calib_seq_len, "--calib-seq-len") >= 1, "--calib-seq-len must be at least 1");
    parse_size(calib_tokens, "--calib-tokens");
    require_writable_destination(out, "student checkpoint");
    require_not_an_input(out, {teacher, calib, scores}, "--out");
  }
};

}  // namespace

int run_convert(App& app, const std::vector<std::string>& args) {
  ConvertOptions opt;
  po::options_description desc("hydra convert");
  opt.bind(desc);
  if (!parse_command_line(app, "convert", "--teacher FILE.h5 --fa-heads SPEC --out FILE.h5 [--fusion NAME] [--calib TOKENS.h5 [--calib-seq-len 4K] [--calib-tokens 64K] [--device cpu|cuda]] [--seed N] [--scores FILE]",
                          desc, args)) {
    return 0;
  }
  opt.validate();
  // Cheap checks before any weight is read.
  const ModelConfig teacher_config = read_model_config(opt.teacher);
  HYDRA_USER_CHECK(teacher_config.arch == Arch::qwen3,
                   "{}: is a {} model; convert needs a Qwen3-shaped teacher (hydra import / hydra init --preset qwen3-*)",
                   opt.teacher, arch_name(teacher_config.arch));
  const ModelConfig student = student_config(teacher_config, resolve_fa_heads(opt.fa_heads, teacher_config, opt.scores, opt.seed),
                                             ops::fusion_from_name(opt.fusion, "--fusion"));
  CalibrationWindows calib;
  if (!opt.calib.empty()) {
    calib = read_calibration_windows(opt.calib, teacher_config.vocab_size, parse_size(opt.calib_seq_len, "--calib-seq-len"),
                                     parse_size(opt.calib_tokens, "--calib-tokens"), app.world.size());
    // The windows run the teacher and, with the scale fusion, the student (its GDN heads' conv halo too).
    check_sequence_length(student.fusion == ops::Fusion::scale ? student : teacher_config, calib.seq_len, app.world.size());
  }
  const Device device = calib.windows > 0 ? resolve_device(opt.device, app.mpi, app.gpu_sharing) : Device::host;
  RunFingerprint inputs;
  add_model_fields(inputs, "teacher", teacher_config);
  add_model_fields(inputs, "student", student);
  if (calib.windows > 0) {
    inputs.add_tokens("calibration tokens", calib.ids);
    inputs.add("calibration windows", fmt::format("{} of {}", calib.windows, calib.seq_len));
    add_file_datasets(inputs, "calibration", opt.calib);
    inputs.add("device", device_flag_name(device));
  }
  add_file_datasets(inputs, "teacher", opt.teacher);
  agree_on_run(app, inputs);
  const bool needs_weights = app.world.rank() == 0 || calib.windows > 0;
  if (!needs_weights) return 0;
  const LoadedCheckpoint teacher =
      read_model_checkpoint(opt.teacher, opt.allow_nonfinite ? NonFinite::allow : NonFinite::refuse);
  std::vector<std::vector<double>> gamma;
  if (calib.windows > 0) {
    // Every rank takes part in the sequence-parallel teacher forward of every window.
    DeviceWorld world = make_device_world(opt.device, app.mpi, app.world, app.gpu_sharing, opt.nccl_timeout);
    Communicator& comm = *world.comm;
    const DType dtype = storage_dtype(world.device);
    const auto t0 = std::chrono::steady_clock::now();
    double shown = -1e9;  // seconds at the last progress line: one every 10 s, and the last
    const auto progress = [&](const char* what) {
      return [&, what](int64_t done, int64_t total) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (comm.rank() != 0 || (done < total && s - shown < 10)) return;
        shown = s;
        log::info("convert: {} {}/{} ({:.1f} s{})", what, done, total, s,
                  done < total ? fmt::format(", about {:.0f} s left", s / static_cast<double>(done) * static_cast<double>(total - done)) : "");
      };
    };
    if (comm.rank() == 0) {
      log::info("convert: calibrating gamma over {} tokens of {} in {} window(s) of {} on {} rank(s) ({})", calib.tokens(),
                opt.calib, calib.windows, calib.seq_len, comm.size(), device_flag_name(world.device));
    }
    Model model(teacher.config, teacher.params, world.device, dtype);
    model.set_kernel_options(app.kernels);
    gamma = measure_head_rms(model, comm, calib, progress("teacher window"));
    // γ is the same on every rank (reduced over them), so all take this branch together.
    bool finite = true;
    for (const auto& layer : gamma) {
      for (double g : layer) finite = finite && std::isfinite(g);
    }
    if (!finite) fail_nonfinite(model, comm, calib.window(0), "convert: the teacher's head RMS (gamma) over --calib is");
    if (student.fusion == ops::Fusion::scale) {
      // γ_h = teacher RMS / the student head's own RMS, layer by layer over the same windows on every rank.
      Model unscaled(student, convert_parameters(teacher.config, teacher.params, student, opt.seed, {}), world.device, dtype);
      unscaled.set_kernel_options(app.kernels);
      gamma = calibrate_scale_gamma(unscaled, comm, calib, gamma, progress("scale fusion layer"));
      for (const auto& layer : gamma) {
        for (double g : layer) finite = finite && std::isfinite(g);
      }
      if (!finite) fail_nonfinite(unscaled, comm, calib.window(0), "convert: the scale fusion's gamma over --calib is");
    }
    check_device_progress(world);
  }
  if (app.world.rank() != 0) return 0;
  const NamedTensors params = convert_parameters(teacher.config, teacher.params, student, opt.seed, gamma);
  write_model_checkpoint(opt.out, student, params);
  int64_t fa = 0;
  for (const auto& l : student.fa_heads) fa += static_cast<int64_t>(l.size());
  log::info("converted {} -> {}: {} FA heads and {} GDN heads over {} layers ({}), fusion {}, gamma {}", opt.teacher,
            opt.out, fa, student.num_layers * student.num_heads - fa, student.num_layers, opt.fa_heads,
            ops::fusion_name(student.fusion),
            !ops::fusion_has_gamma(student.fusion) ? std::string("none (this fusion has no gamma)")
            : gamma.empty()                        ? std::string("= 1")
                                                   : fmt::format("from {} calibration tokens", calib.tokens()));
  for (int64_t l = 0; l < student.num_layers; ++l) {
    log::info("  layer {:>3}: FA heads [{}]{}", l, fmt::join(student.fa_heads_of(l), ", "),
              gamma.empty() || !ops::fusion_has_gamma(student.fusion)
                  ? std::string()
                  : fmt::format(", gamma [{:.4g}]", fmt::join(gamma[l], ", ")));
  }
  return 0;
}

}  // namespace hydra
