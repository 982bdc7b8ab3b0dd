// The training state's checks and I/O (state.h): the step folders, --resume, and the older single-file
// form: state.h5 holds every optimizer tensor (f32) with an
// XXH3 per dataset and the run's identity as attributes; --resume reads it whole and verifies it
// before any tensor is loaded.
#include "model/train/state.h"

#include <algorithm>
#include <cctype>
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
constexpr const char* kDamagedStep =
    "(a damaged checkpoint: resume from an older step-NNNNNN by pointing 'latest' at it)";

// A state.h5 read whole and checked: every dataset against its stored XXH3, finite fp32 values
// (second moments ≥ 0), attributes in range. Any damage is a UserError naming the file.
struct VerifiedState : SavedRun {
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
      HYDRA_USER_CHECK(st.batch_seqs >= 1 && st.grad_accum >= 1 && st.replicas >= 1 &&
                           static_cast<double>(st.batch_seqs) * static_cast<double>(st.grad_accum) *
                                   static_cast<double>(st.replicas) <= 9007199254740992.0,
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

// A step folder without manifest.json must be an older run's, with its state.h5: otherwise the
// message says which file is missing (a deleted manifest is not "a missing state.h5").
void require_older_state(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "state.h5", ec)) return;
  bool shards = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) shards = shards || e.path().filename().string().rfind("shard-", 0) == 0;
  HYDRA_USER_CHECK(!shards, "{}: {} is missing (the step's shards are there, but a step folder is whole only with "
                   "the manifest its last writer adds) {}", dir, kManifestName, kDamagedStep);
  HYDRA_USER_FAIL("{}: holds neither {} (a step saved by every rank) nor state.h5 (an older run's) {}", dir,
                  kManifestName, kDamagedStep);
}

// A saved config for a message: its summary, or why it cannot be read (the message must not fail).
std::string saved_config_summary(const std::string& text, const std::string& path) {
  try {
    return config_from_json(nlohmann::json::parse(text), path).summary();
  } catch (const std::exception& e) {
    return fmt::format("unreadable: {}", e.what());
  }
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step-{:06d}", step); }

bool is_step_dir_name(const std::string& name) {
  return name.size() >= 11 && name.rfind("step-", 0) == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

std::vector<std::string> step_directories(const std::string& out_dir) {
  std::vector<std::string> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code link;
    if (is_step_dir_name(name) && !e.is_symlink(link) && e.is_directory(link)) steps.push_back(e.path().string());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
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
  // A step written by every rank (a manifest and shards), or an older run's single state.h5 (read
  // whole: every rank takes its range of it).
  const bool sharded = has_manifest(dir);
  if (!sharded) require_older_state(dir);
  const std::string path = sharded ? entry_inside(dir, kManifestName, dir, "the manifest")
                                   : entry_inside(dir, "state.h5", dir, "the training state");
  VerifiedState old_state;
  if (!sharded) old_state = read_verified_state(path);
  const SavedRun st = sharded ? read_manifest(dir) : static_cast<const SavedRun&>(old_state);
  HYDRA_USER_CHECK(st.stage == stage_name(config.stage), "--resume: {} was saved by stage {}, this run is stage {}", path,
                   st.stage, stage_name(config.stage));
  // Another world size or --sp resumes the same run when a step takes the same windows: the step's
  // windows are data positions [position, position + windows) whatever the layout (trainer.h), and
  // the optimizer's state is re-cut on load (each rank reads its range: load_sharded_state, or
  // AdamW::load_state from a whole state.h5).
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
                   saved_config_summary(st.config, path), student.config().summary());
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
  if (sharded) {
    load_sharded_state(dir, optimizer);
  } else {
    optimizer.load_state(old_state.tensors);
  }
  return ResumePoint{st.step, st.position, path, st.data_state};
}

nlohmann::json data_state(const TokenWindows& data, int64_t position) {
  nlohmann::json state{{"position", position}, {"windows_per_epoch", data.count()}};
  if (data.blended()) {
    const std::vector<int64_t> drawn = data.drawn(position);
    nlohmann::json files = nlohmann::json::array();
    for (int64_t c = 0; c < data.corpora(); ++c) {  // a file given alone: its own corpus, named by its path
      files.push_back({{"path", data.corpus_name(c)}, {"weight", data.weights()[static_cast<size_t>(c)]},
                       {"windows_drawn", drawn[static_cast<size_t>(c)]}});
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
  nlohmann::json shares = nlohmann::json::object();
  const std::vector<int64_t> drawn = data.drawn(position);
  for (int64_t c = 0; c < data.corpora(); ++c) {
    shares[data.corpus_name(c)] = static_cast<double>(drawn[static_cast<size_t>(c)]) /
                                  static_cast<double>(std::max<int64_t>(position, 1));
  }
  return shares;
}

std::string newest_verified_checkpoint(const std::string& out_dir) {
  std::vector<std::string> steps = step_directories(out_dir);
  std::reverse(steps.begin(), steps.end());
  for (const std::string& dir : steps) {
    try {
      if (has_manifest(dir)) {
        verify_sharded_checkpoint(dir);
      } else {
        require_older_state(dir);
        read_verified_state(entry_inside(dir, "state.h5", dir, "the training state"));
      }
      return dir;
    } catch (const UserError& e) {
      log::warn("{}", e.what());
    }
  }
  return "";
}

std::string latest_checkpoint(const std::string& out_dir) {
  const fs::path pointer = fs::path(out_dir) / "latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(pointer, ec))) return "";
  HYDRA_USER_CHECK(fs::is_regular_file(fs::symlink_status(pointer, ec)), "{}: is not a file (the pointer hydra writes "
                   "holds the name of the newest step folder)", pointer.string());
  // The pointer names a step folder of this run: a plain step-NNNNNN inside out_dir, never a path
  // elsewhere (another run's state) — a file never makes hydra read outside its folder.
  std::ifstream in(pointer, std::ios::binary);
  std::string text(256, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  text.erase(0, std::min(text.size(), text.find_first_not_of(" \t\n\r")));
  if (text.empty()) return "";
  HYDRA_USER_CHECK(is_step_dir_name(text), "{}: holds '{}', not the name of a step folder (step-NNNNNN) of {}: a run "
                   "resumes only from its own step folders", pointer.string(), text.substr(0, 80), out_dir);
  const std::string dir = entry_inside(out_dir, text, pointer.string(), "step folder");
  HYDRA_USER_CHECK(fs::is_directory(dir, ec), "{}/latest names {}, which does not exist", out_dir, text);
  return dir;
}

}  // namespace hydra::train
