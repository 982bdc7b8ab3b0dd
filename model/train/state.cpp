// The training state's format and I/O (state.h). state.h5 holds every optimizer tensor (f32) with an
// XXH3 per dataset and the run's identity as attributes; --resume reads it whole and verifies it
// before any tensor is loaded.
#include "model/train/state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/content_hash.h"
#include "runtime/fault.h"
#include "runtime/hdf5_file.h"
#include "runtime/log.h"
#include "runtime/token_identity.h"

namespace hydra::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStateFormat = "hydrahead-train-state";
// Version 2 added the per-dataset checksums and the inputs' fingerprints; a version-1 state still
// resumes, unverified (with a warning).
constexpr int64_t kStateVersion = 2;
constexpr const char* kChecksums = "checksums";  // the dataset of per-dataset XXH3s in state.h5
constexpr const char* kDataState = "data_state";  // data_state() as JSON text

// The step-NNNNNN directories of a run folder, oldest first (none if the folder cannot be read).
std::vector<fs::path> step_dirs(const fs::path& out_dir) {
  std::vector<fs::path> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0) steps.push_back(e.path());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// A state.h5 read whole and checked: every dataset against its stored XXH3, finite fp32 values
// (second moments ≥ 0), attributes in range. Any damage is a UserError naming the file.
struct VerifiedState {
  int64_t version = 0, step = 0, position = 0, world = 0, sp = 0, seq_len = 0, seed = 0;
  // The global batch (absent in states written before resharding, 0 then): windows per step = batch_seqs × grad_accum × replicas.
  int64_t batch_seqs = 0, grad_accum = 0, replicas = 0;
  std::string stage, config;
  std::string data_state;  // the kDataState attribute ("" in states written before it)
  nlohmann::json inputs;  // role → XXH3 hex (version 2)
  NamedTensors tensors;
};

VerifiedState read_verified_state(const std::string& path) {
  const std::string advice = "(a damaged training state: resume from an older step-NNNNNN by pointing 'latest' at it)";
  try {
    require_readable_file(path, "training state");
    const H5File h5 = H5File::open_read(path);
    HYDRA_USER_CHECK(h5.has_attribute("format") && h5.string_attribute("format") == kStateFormat,
                     "{}: not a hydra training state", path);
    VerifiedState st;
    st.version = h5.int_attribute("format_version");
    HYDRA_USER_CHECK(st.version >= 1 && st.version <= kStateVersion, "{}: format_version {} is not one this hydra reads (1..{})",
                     path, st.version, kStateVersion);
    st.stage = h5.string_attribute("stage");
    st.config = h5.string_attribute("config");
    st.step = h5.int_attribute("step");
    st.position = h5.int_attribute("data_position");
    st.world = h5.int_attribute("world_size");
    st.sp = h5.int_attribute("sp");
    st.seq_len = h5.int_attribute("seq_len");
    st.seed = h5.int_attribute("seed");
    if (h5.has_attribute(kDataState)) st.data_state = h5.string_attribute(kDataState);
    if (h5.has_attribute("batch_seqs")) {
      st.batch_seqs = h5.int_attribute("batch_seqs");
      st.grad_accum = h5.int_attribute("grad_accum");
      st.replicas = h5.int_attribute("replicas");
      HYDRA_USER_CHECK(st.batch_seqs >= 1 && st.grad_accum >= 1 && st.replicas >= 1,
                       "{}: attributes out of range (batch_seqs {}, grad_accum {}, replicas {}) {}", path, st.batch_seqs,
                       st.grad_accum, st.replicas, advice);
    }
    HYDRA_USER_CHECK(st.step >= 1 && st.position >= 0 && st.world >= 1 && st.sp >= 1 && st.world % st.sp == 0 &&
                         st.seq_len >= 1,
                     "{}: attributes out of range (step {}, data_position {}, world_size {}, sp {}, seq_len {}) {}", path,
                     st.step, st.position, st.world, st.sp, st.seq_len, advice);
    nlohmann::json checksums;
    if (st.version >= 2) {
      const std::vector<int64_t> bytes = h5.read_integer_vector(kChecksums);
      std::string text(bytes.size(), '\0');
      for (size_t i = 0; i < bytes.size(); ++i) text[i] = static_cast<char>(bytes[i]);
      checksums = nlohmann::json::parse(text, nullptr, false);
      st.inputs = nlohmann::json::parse(h5.string_attribute("inputs"), nullptr, false);
      HYDRA_USER_CHECK(checksums.is_object() && st.inputs.is_object(), "{}: its checksums or inputs are not readable {}",
                       path, advice);
    }
    for (const std::string& name : h5.dataset_names()) {
      if (name == kChecksums) continue;
      Tensor t = h5.read(name);
      HYDRA_USER_CHECK(t.dtype() == DType::f32, "{}: dataset '{}' is {}, not f32 {}", path, name, dtype_name(t.dtype()), advice);
      if (st.version >= 2) {
        HYDRA_USER_CHECK(checksums.contains(name) && checksums[name].is_string(), "{}: dataset '{}' has no checksum {}", path,
                         name, advice);
        HYDRA_USER_CHECK(checksums[name].get<std::string>() == hash_hex(hash_tensor(t)),
                         "{}: dataset '{}' does not match its checksum {}", path, name, advice);
      }
      const float* v = t.data_as<float>();
      const bool second_moment = name.rfind("adam_v.", 0) == 0;
      for (int64_t i = 0; i < t.numel(); ++i) {
        HYDRA_USER_CHECK(std::isfinite(v[i]) && (!second_moment || v[i] >= 0), "{}: dataset '{}' holds {} at element {} {}",
                         path, name, v[i], i, advice);
      }
      st.tensors.emplace(name, std::move(t));
    }
    if (st.version >= 2) {
      for (const auto& [name, hash] : checksums.items()) {
        HYDRA_USER_CHECK(st.tensors.count(name) == 1, "{}: dataset '{}' is missing {}", path, name, advice);
      }
    }
    return st;
  } catch (const UserError& e) {
    const std::string what = e.what();
    if (what.find(path) != std::string::npos) throw;
    HYDRA_USER_FAIL("{}: {} {}", path, what, advice);
  } catch (const std::exception& e) {
    HYDRA_USER_FAIL("{}: cannot be read ({}) {}", path, e.what(), advice);
  }
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step-{:06d}", step); }

SavedState state_to_save(const AdamW& optimizer, bool lead) {
  SavedState saved;
  if (optimizer.zero() == Zero::replicated && !lead) return saved;
  saved.masters = optimizer.master_parameters(lead);
  saved.state = optimizer.state(lead);
  return saved;
}

std::string write_checkpoint_dir(const TrainConfig& config, const SequenceGroups& topology, const Model& student,
                                 const SavedState& saved, int64_t step, int64_t position,
                                 const nlohmann::json& data_position) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path out(config.out_dir), final_dir = out / step_dir_name(step);
  // The step is written under `.step-NNNNNN.tmp-PID` (the AtomicFile naming, so the same sweep finds
  // it after a kill -9) and registered for removal on SIGTERM/SIGINT until it is renamed; a save
  // that fails (a full disk) removes it before the error propagates.
  const fs::path temp = temporary_path_for(final_dir.string());
  fs::remove_all(temp);
  ScopedTemporary registration(temp.string(), ScopedTemporary::Kind::directory);
  struct RemoveUnlessRenamed {
    const fs::path& dir;
    bool renamed = false;
    ~RemoveUnlessRenamed() {
      std::error_code ec;
      if (!renamed) fs::remove_all(dir, ec);
    }
  } cleanup{temp};
  std::error_code ec;
  fs::create_directories(temp, ec);
  HYDRA_USER_CHECK(!ec, "saving step {}: cannot create {}: {}", step, temp.string(), ec.message());
  write_model_checkpoint((temp / "model.h5").string(), student.config(), saved.masters);
  maybe_inject_fault("save");
  {
    AtomicFile file((temp / "state.h5").string());
    H5File h5 = H5File::create(file.temp_path());
    // Every dataset's XXH3 and the inputs' fingerprints, verified by --resume (read_verified_state).
    // The checksums are a dataset (JSON text as bytes): an attribute is limited to 64 KiB.
    nlohmann::json checksums = nlohmann::json::object(), inputs = nlohmann::json::object();
    for (const auto& [name, t] : saved.state) {
      h5.write(name, t);
      checksums[name] = hash_hex(hash_tensor(t));
    }
    const std::string checksum_text = checksums.dump();
    h5.write_uint8(kChecksums, {reinterpret_cast<const uint8_t*>(checksum_text.data()), checksum_text.size()});
    for (const TrainConfig::Input& in : config.inputs) inputs[in.role] = in.hash;
    h5.set_attribute("inputs", inputs.dump());
    h5.set_attribute("format", std::string(kStateFormat));
    h5.set_attribute("format_version", kStateVersion);
    h5.set_attribute("stage", std::string(stage_name(config.stage)));
    h5.set_attribute("step", step);
    h5.set_attribute("data_position", position);
    h5.set_attribute(kDataState, data_position.dump());
    h5.set_attribute("seed", static_cast<int64_t>(config.seed));
    h5.set_attribute("seq_len", config.seq_len);
    h5.set_attribute("world_size", static_cast<int64_t>(const_cast<SequenceGroups&>(topology).world().size()));
    h5.set_attribute("sp", static_cast<int64_t>(topology.sp()));
    // The global batch: a resume on another world size or --sp must take the same windows per step.
    h5.set_attribute("batch_seqs", config.batch_seqs);
    h5.set_attribute("grad_accum", config.grad_accum);
    h5.set_attribute("replicas", static_cast<int64_t>(topology.replicas()));
    h5.set_attribute("config", config_to_json(student.config()).dump());
    h5.close();
    file.commit();
  }
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step (after a resume)
  fs::rename(temp, final_dir, ec);
  HYDRA_USER_CHECK(!ec, "saving step {}: cannot rename {} to {}: {}", step, temp.string(), final_dir.string(),
                   ec.message());
  cleanup.renamed = true;
  registration.release();
  write_text_atomically((out / "latest").string(), step_dir_name(step) + "\n");
  uintmax_t bytes = 0;
  for (const auto& e : fs::directory_iterator(final_dir)) bytes += e.is_regular_file() ? e.file_size() : 0;
  log::info("saved {} ({:.1f} MiB in {:.1f} s)", final_dir.string(), static_cast<double>(bytes) / (1024.0 * 1024.0),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // Keep the newest `keep` step directories.
  const std::vector<fs::path> steps = step_dirs(out);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(config.keep, 1)) < steps.size(); ++i) {
    if (steps[i] != final_dir) fs::remove_all(steps[i]);
  }
  return final_dir.string();
}

void remove_interrupted_saves(const std::string& out_dir) {
  for (const std::string& path : sweep_stale_temporaries(out_dir, "step-", true)) {
    log::info("removed {} (a checkpoint save that did not finish)", path);
  }
}

void truncate_log(const std::string& path, int64_t last_kept_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > last_kept_step) {
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  write_text_atomically(path, kept);
}

ResumePoint load_checkpoint_dir(const TrainConfig& config, SequenceGroups& topology, const Model& student,
                                AdamW& optimizer, bool lead) {
  const std::string dir = latest_checkpoint(config.out_dir);
  HYDRA_USER_CHECK(!dir.empty(), "--resume: {} holds no checkpoint (no 'latest' pointer)", config.out_dir);
  const std::string path = dir + "/state.h5";
  const VerifiedState st = read_verified_state(path);
  HYDRA_USER_CHECK(st.stage == stage_name(config.stage), "--resume: {} was saved by stage {}, this run is stage {}", path,
                   st.stage, stage_name(config.stage));
  // Another world size or --sp resumes the same run when a step takes the same windows: the step's
  // windows are data positions [position, position + windows) whatever the layout (trainer.h), and
  // the optimizer's state is whole in state.h5 (each rank takes its range: AdamW::load_state).
  const int64_t windows = config.batch_seqs * config.grad_accum * topology.replicas();
  if (st.batch_seqs == 0) {  // saved before the global batch was recorded: only the same layout
    HYDRA_USER_CHECK(st.world == topology.world().size() && st.sp == topology.sp(),
                     "--resume: {} was saved by {} ranks (sequence groups of {}) by an older hydra, which did not record "
                     "the global batch; this run has {} ranks (groups of {}): resume on the saved layout", path, st.world,
                     st.sp, topology.world().size(), topology.sp());
  } else {
    const int64_t saved_windows = st.batch_seqs * st.grad_accum * st.replicas;
    HYDRA_USER_CHECK(saved_windows == windows,
                     "--resume: {} was saved with {} windows per step (--batch-seqs {} × --grad-accum {} × {} replica(s) "
                     "of {} ranks with --sp {}); this run takes {} (--batch-seqs {} × --grad-accum {} × {} replica(s) of {} "
                     "ranks with --sp {}): choose --batch-seqs/--grad-accum so that a step takes {} windows", path,
                     saved_windows, st.batch_seqs, st.grad_accum, st.replicas, st.world, st.sp, windows, config.batch_seqs,
                     config.grad_accum, topology.replicas(), topology.world().size(), topology.sp(), saved_windows);
    if (lead && (st.world != topology.world().size() || st.sp != topology.sp())) {
      log::info("--resume: {} was saved by {} ranks (--sp {}), continued on {} ranks (--sp {}) with the same {} windows "
                "per step", dir, st.world, st.sp, topology.world().size(), topology.sp(), windows);
    }
  }
  HYDRA_USER_CHECK(st.config == config_to_json(student.config()).dump(),
                   "--resume: {} was saved for another model (its config differs from --model's: {} vs {})", path,
                   config_from_json(nlohmann::json::parse(st.config), path).summary(), student.config().summary());
  HYDRA_USER_CHECK(st.seq_len == config.seq_len && static_cast<uint64_t>(st.seed) == config.seed,
                   "--resume: {} was saved with --seq-len {} --seed {}; this run has --seq-len {} --seed {}", path,
                   st.seq_len, st.seed, config.seq_len, config.seed);
  // The inputs' contents: the same bytes as when the run started, unless the user says the change is meant.
  if (st.version < 2) {
    if (lead) log::warn("--resume: {} was written by an older hydra (no checksums, no input fingerprints): not verified", path);
  } else {
    std::vector<std::string> changed;
    for (const TrainConfig::Input& in : config.inputs) {
      const std::string saved = st.inputs.contains(in.role) && st.inputs[in.role].is_string() ? st.inputs[in.role].get<std::string>() : "";
      if (saved == in.hash) continue;
      const bool identity = in.hash.rfind("v", 0) == 0;  // data: a content identity (runtime/token_identity.h)
      if (identity && !saved.empty() && saved.rfind("v", 0) != 0) {
        if (lead) log::warn("--resume: {} stores the XXH3 of the bytes of {} {} (an older hydra), not its content "
                            "identity: not compared", path, in.role, in.path);
        continue;
      }
      if (saved.empty()) {
        changed.push_back(fmt::format("{} {} (not part of the saved run)", in.role, in.path));
      } else if (identity) {
        changed.push_back(fmt::format("{} {} (other contents: {} differ; now {}, saved {})", in.role, in.path,
                                      token_identity_difference(in.hash, saved), in.hash, saved));
      } else {
        changed.push_back(fmt::format("{} {} (other contents: XXH3 {}, saved {})", in.role, in.path, in.hash, saved));
      }
    }
    for (const auto& [role, hash] : st.inputs.items()) {
      bool given = false;
      for (const TrainConfig::Input& in : config.inputs) given = given || in.role == role;
      if (!given) changed.push_back(fmt::format("{} (saved, not given now)", role));
    }
    if (!changed.empty()) {
      std::string list;
      for (const std::string& c : changed) list += (list.empty() ? "" : "; ") + c;
      HYDRA_USER_CHECK(config.allow_changed_inputs,
                       "--resume: the inputs differ from those {} was trained on: {}; pass --allow-changed-inputs if "
                       "the change is meant", dir, list);
      if (lead) log::warn("--resume with --allow-changed-inputs: {}", list);
    }
  }
  optimizer.load_state(st.tensors);
  return ResumePoint{st.step, st.position, path, st.data_state};
}

nlohmann::json data_state(const TokenWindows& data, int64_t position) {
  nlohmann::json state{{"position", position}, {"windows_per_epoch", data.count()}};
  if (data.blended()) {
    const std::vector<int64_t> drawn = data.drawn(position);
    nlohmann::json files = nlohmann::json::array();
    for (int64_t f = 0; f < data.files(); ++f) {
      files.push_back({{"path", data.path(f)}, {"weight", data.weights()[static_cast<size_t>(f)]},
                       {"windows_drawn", drawn[static_cast<size_t>(f)]}});
    }
    state["files"] = files;
  }
  return state;
}

void check_data_state(const std::string& path, const std::string& saved_text, const TokenWindows& data, int64_t position) {
  const nlohmann::json saved = nlohmann::json::parse(saved_text, nullptr, false);
  HYDRA_USER_CHECK(saved.is_object(), "{}: its data_state is not readable", path);
  const nlohmann::json now = data_state(data, position).value("files", nlohmann::json());
  if (saved.value("files", nlohmann::json()) == now) return;
  HYDRA_USER_FAIL("--resume: {} was at {} of the data ({}); the data given now draws {} there: resume with the same "
                  "--data files and weights", path, position, saved.value("files", nlohmann::json()).dump(), now.dump());
}

nlohmann::json data_shares(const TokenWindows& data, int64_t position) {
  nlohmann::json shares = nlohmann::json::array();
  for (int64_t d : data.drawn(position)) {
    shares.push_back(static_cast<double>(d) / static_cast<double>(std::max<int64_t>(position, 1)));
  }
  return shares;
}

std::string newest_verified_checkpoint(const std::string& out_dir) {
  std::vector<fs::path> steps = step_dirs(out_dir);
  std::reverse(steps.begin(), steps.end());
  for (const fs::path& dir : steps) {
    try {
      read_verified_state((dir / "state.h5").string());
      return dir.string();
    } catch (const UserError& e) {
      log::warn("{}", e.what());
    }
  }
  return "";
}

std::string latest_checkpoint(const std::string& out_dir) {
  std::ifstream in(fs::path(out_dir) / "latest");
  std::string name;
  if (!(in >> name)) return "";
  const fs::path dir = fs::path(out_dir) / name;
  HYDRA_USER_CHECK(fs::is_directory(dir), "{}/latest names {}, which does not exist", out_dir, name);
  return dir.string();
}

}  // namespace hydra::train
