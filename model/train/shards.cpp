// Checkpoints written by every rank (shards.h): the writer, the manifest, and the re-cut on load.
#include "model/train/shards.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "model/params.h"
#include "model/train/state.h"
#include "runtime/atomic_file.h"
#include "runtime/content_hash.h"
#include "runtime/fault.h"
#include "runtime/hdf5_file.h"
#include "runtime/log.h"

namespace hydra::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kShardFormat = "hydrahead-train-shard";
constexpr const char* kStateFormat = "hydrahead-train-state";
constexpr int64_t kManifestVersion = 3;
// The datasets of a shard, one per AdamW::Kind.
constexpr std::pair<AdamW::Kind, const char*> kKinds[] = {
    {AdamW::Kind::master, "master"}, {AdamW::Kind::m, "adam_m"}, {AdamW::Kind::v, "adam_v"}};

double wall_clock_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string shard_name(int rank, int world) { return fmt::format("shard-{:05d}-of-{:05d}.h5", rank, world); }

// This rank's part of the save: its shard (rank 0 also model.h5), as a report for rank 0.
nlohmann::json write_own_part(const fs::path& temp, int rank, int world, const Model& student, const AdamW& optimizer,
                              int64_t step, int64_t position) {
  nlohmann::json report{{"rank", rank}};
  report["write_start"] = wall_clock_s();
  std::error_code ec;
  fs::create_directories(temp, ec);  // every rank: the first one creates it
  HYDRA_USER_CHECK(!ec, "cannot create {}: {}", temp.string(), ec.message());
  const auto [begin, end] = optimizer.own_range();
  const std::string name = shard_name(rank, world);
  nlohmann::json checksums = nlohmann::json::object();
  {
    AtomicFile file((temp / name).string());
    H5File h5 = H5File::create(file.temp_path());
    for (const auto& [kind, dataset] : kKinds) {
      const Tensor t = optimizer.own_state(kind);
      h5.write(dataset, t);
      checksums[dataset] = hash_hex(hash_tensor(t));
    }
    h5.set_attribute("format", std::string(kShardFormat));
    h5.set_attribute("rank", static_cast<int64_t>(rank));
    h5.set_attribute("world_size", static_cast<int64_t>(world));
    h5.set_attribute("begin", begin);
    h5.set_attribute("end", end);
    h5.set_attribute("trainable", optimizer.trainable_parameters());
    h5.set_attribute("flat_layout", hash_hex(optimizer.flat_layout_hash()));
    h5.set_attribute("step", step);
    h5.set_attribute("data_position", position);
    h5.close();
    maybe_inject_fault("save");  // tests: a rank failing or killed half way through a save
    file.commit();
  }
  report.update({{"file", name}, {"begin", begin}, {"end", end}, {"bytes", fs::file_size(temp / name)},
                 {"checksums", checksums}});
  report["write_end"] = wall_clock_s();
  if (rank == 0) {
    write_model_checkpoint((temp / "model.h5").string(), student.config(), student.unpack(student.weights()));
    report["model"] = {{"file", "model.h5"}, {"bytes", fs::file_size(temp / "model.h5")},
                       {"xxh3", hash_hex(hash_file((temp / "model.h5").string()))}};
  }
  return report;
}

// Rank 0, once every rank reported: the manifest (last, atomically), the rename, `latest`, pruning.
// Throws a UserError naming the rank whose part failed.
void finish_save(const fs::path& temp, const fs::path& final_dir, const std::vector<std::string>& reports,
                 const TrainConfig& config, SequenceGroups& topology, const Model& student, const AdamW& optimizer,
                 int64_t step, int64_t position, const nlohmann::json& data_position, double started) {
  nlohmann::json shards = nlohmann::json::array(), model;
  for (const std::string& text : reports) {
    nlohmann::json r = nlohmann::json::parse(text, nullptr, false);
    HYDRA_ASSERT(r.is_object(), "a shard report that is not JSON: {}", text);
    HYDRA_USER_CHECK(!r.contains("error"), "rank {}: {}", r.value("rank", -1), r.value("error", std::string()));
    if (r.contains("model")) model = r["model"];
    r.erase("model");
    shards.push_back(r);
  }
  nlohmann::json inputs = nlohmann::json::object();
  for (const TrainConfig::Input& in : config.inputs) inputs[in.role] = in.hash;
  const nlohmann::json manifest{
      {"format", kStateFormat}, {"format_version", kManifestVersion}, {"stage", stage_name(config.stage)},
      {"step", step}, {"data_position", position}, {"data_state", data_position},
      {"seed", static_cast<int64_t>(config.seed)}, {"seq_len", config.seq_len},
      {"world_size", topology.world().size()}, {"sp", topology.sp()},
      // The global batch: a resume on another world size or --sp must take the same windows per step.
      {"batch_seqs", config.batch_seqs}, {"grad_accum", config.grad_accum}, {"replicas", topology.replicas()},
      {"config", config_to_json(student.config()).dump()}, {"inputs", inputs},
      {"trainable", optimizer.trainable_parameters()}, {"flat_layout", hash_hex(optimizer.flat_layout_hash())},
      {"dtype", dtype_name(student.acc_dtype())}, {"model", model}, {"shards", shards}};
  write_text_atomically((temp / kManifestName).string(), manifest.dump(1) + "\n");
  std::error_code ec;
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step (after a resume)
  fs::rename(temp, final_dir, ec);
  HYDRA_USER_CHECK(!ec, "cannot rename {} to {}: {}", temp.string(), final_dir.string(), ec.message());
  write_text_atomically((fs::path(config.out_dir) / "latest").string(), step_dir_name(step) + "\n");
  uintmax_t bytes = 0;
  std::string intervals;
  for (const auto& e : fs::directory_iterator(final_dir)) bytes += e.is_regular_file() ? e.file_size() : 0;
  for (const nlohmann::json& s : shards) {
    intervals += fmt::format("{}rank {} {:.3f}–{:.3f}", intervals.empty() ? "" : ", ", s["rank"].get<int>(),
                             s["write_start"].get<double>() - started, s["write_end"].get<double>() - started);
  }
  log::info("saved {} ({:.1f} MiB in {:.1f} s; shards written at s after the save began: {})", final_dir.string(),
            static_cast<double>(bytes) / (1024.0 * 1024.0), wall_clock_s() - started, intervals);
  // Keep the newest `keep` step directories.
  const std::vector<std::string> steps = step_directories(config.out_dir);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(config.keep, 1)) < steps.size(); ++i) {
    if (fs::path(steps[i]) != final_dir) fs::remove_all(steps[i]);
  }
}

const char* kDamaged = "(a damaged checkpoint: resume from an older step-NNNNNN by pointing 'latest' at it)";

nlohmann::json parse_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  std::ifstream in(path);
  HYDRA_USER_CHECK(in.good(), "{}: cannot be read {}", path, kDamaged);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, false);
  HYDRA_USER_CHECK(m.is_object() && m.value("format", "") == kStateFormat, "{}: not a hydra training manifest {}", path,
                   kDamaged);
  return m;
}

// One shard read whole and checked against its manifest entry: size, attributes, per-dataset XXH3,
// finite values, second moments ≥ 0. Returns its datasets in kKinds order.
std::vector<Tensor> read_shard(const std::string& dir, const nlohmann::json& entry, const nlohmann::json& manifest) {
  const std::string path = (fs::path(dir) / entry.at("file").get<std::string>()).string();
  try {
    require_readable_file(path, "checkpoint shard");
    HYDRA_USER_CHECK(fs::file_size(path) == entry.at("bytes").get<uintmax_t>(), "{}: {} bytes, the manifest says {} {}",
                     path, fs::file_size(path), entry.at("bytes").get<uintmax_t>(), kDamaged);
    const H5File h5 = H5File::open_read(path);
    HYDRA_USER_CHECK(h5.has_attribute("format") && h5.string_attribute("format") == kShardFormat,
                     "{}: not a hydra checkpoint shard {}", path, kDamaged);
    const int64_t begin = entry.at("begin").get<int64_t>(), end = entry.at("end").get<int64_t>();
    HYDRA_USER_CHECK(h5.int_attribute("begin") == begin && h5.int_attribute("end") == end &&
                         h5.int_attribute("step") == manifest.at("step").get<int64_t>() &&
                         h5.int_attribute("data_position") == manifest.at("data_position").get<int64_t>(),
                     "{}: holds [{}, {}) of step {}, the manifest names [{}, {}) of step {} {}", path,
                     h5.int_attribute("begin"), h5.int_attribute("end"), h5.int_attribute("step"), begin, end,
                     manifest.at("step").get<int64_t>(), kDamaged);
    std::vector<Tensor> out;
    for (const auto& [kind, dataset] : kKinds) {
      Tensor t = h5.read(dataset);
      HYDRA_USER_CHECK((t.dtype() == DType::f32 || t.dtype() == DType::f64) && t.numel() == end - begin,
                       "{}: dataset '{}' is {} {}, not {} float elements {}", path, dataset, dtype_name(t.dtype()),
                       t.shape_string(), end - begin, kDamaged);
      HYDRA_USER_CHECK(entry.at("checksums").value(dataset, "") == hash_hex(hash_tensor(t)),
                       "{}: dataset '{}' does not match its checksum {}", path, dataset, kDamaged);
      const Tensor f64 = to(t, Device::host, DType::f64);
      const double* v = f64.data_as<double>();
      for (int64_t i = 0; i < f64.numel(); ++i) {
        HYDRA_USER_CHECK(std::isfinite(v[i]) && (kind != AdamW::Kind::v || v[i] >= 0),
                         "{}: dataset '{}' holds {} at element {} {}", path, dataset, v[i], i, kDamaged);
      }
      out.push_back(std::move(t));
    }
    return out;
  } catch (const UserError& e) {
    if (std::string(e.what()).find(path) != std::string::npos) throw;
    HYDRA_USER_FAIL("{}: {} {}", path, e.what(), kDamaged);
  } catch (const std::exception& e) {
    HYDRA_USER_FAIL("{}: cannot be read ({}) {}", path, e.what(), kDamaged);
  }
}

}  // namespace

double save_time_limit(double configured, double largest_writer_bytes) {
  if (configured > 0) return configured;
  return 120.0 + largest_writer_bytes / 20e6;
}

std::string write_sharded_checkpoint(const TrainConfig& config, SequenceGroups& topology, const Model& student,
                                     const AdamW& optimizer, int64_t step, int64_t position,
                                     const nlohmann::json& data_position) {
  Communicator& world = topology.world();
  const bool lead = world.rank() == 0;
  const double started = wall_clock_s();
  const fs::path final_dir = fs::path(config.out_dir) / step_dir_name(step);
  // The limit from the largest writer: rank 0 writes its shard (3 kinds of ⌈N/W⌉ elements) and model.h5.
  const double shard_elements = std::ceil(static_cast<double>(optimizer.trainable_parameters()) / world.size());
  const double largest = 3.0 * static_cast<double>(dtype_size(student.acc_dtype())) * shard_elements +
                         4.0 * static_cast<double>(parameter_count(student.config()));
  const double limit = save_time_limit(config.save_timeout, largest);
  const std::string what = fmt::format("saving step {} (the save's limit: {:.0f} s)", step, limit);
  // The folder's temporary name is rank 0's (its PID): every rank writes into it, rank 0 renames it.
  const fs::path temp = world.broadcast_text(lead ? temporary_path_for(final_dir.string()) : "", limit, what);
  ScopedTemporary registration;
  if (lead) registration = ScopedTemporary(temp.string(), ScopedTemporary::Kind::directory);
  struct RemoveUnlessRenamed {  // rank 0, after every rank reported: a failed save leaves nothing behind
    const fs::path& dir;
    bool active;
    ~RemoveUnlessRenamed() {
      std::error_code ec;
      if (active) fs::remove_all(dir, ec);
    }
  } cleanup{temp, lead};
  nlohmann::json report;
  try {
    report = write_own_part(temp, world.rank(), world.size(), student, optimizer, step, position);
  } catch (const std::exception& e) {  // reported to rank 0, which fails the save on every rank
    report = {{"rank", world.rank()}, {"error", e.what()}};
  }
  const std::vector<std::string> reports = world.gather_text(report.dump(), limit, what);
  std::string outcome = "saved";
  if (lead) {
    try {
      finish_save(temp, final_dir, reports, config, topology, student, optimizer, step, position, data_position,
                  started);
      cleanup.active = false;
      registration.release();
    } catch (const std::exception& e) {
      outcome = e.what();
    }
  }
  outcome = world.broadcast_text(outcome, limit, what);
  HYDRA_USER_CHECK(outcome == "saved", "saving step {} failed: {}; {}", step, outcome,
                   "the previous checkpoint ('latest') is unchanged");
  return final_dir.string();
}

bool has_manifest(const std::string& dir) { return fs::exists(fs::path(dir) / kManifestName); }

SavedRun read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  try {
    const nlohmann::json m = parse_manifest(dir);
    SavedRun run;
    run.version = m.at("format_version").get<int64_t>();
    HYDRA_USER_CHECK(run.version == kManifestVersion, "{}: format_version {} is not one this hydra reads ({}) {}", path,
                     run.version, kManifestVersion, kDamaged);
    run.stage = m.at("stage").get<std::string>();
    run.config = m.at("config").get<std::string>();
    run.step = m.at("step").get<int64_t>();
    run.position = m.at("data_position").get<int64_t>();
    run.world = m.at("world_size").get<int64_t>();
    run.sp = m.at("sp").get<int64_t>();
    run.seq_len = m.at("seq_len").get<int64_t>();
    run.seed = m.at("seed").get<int64_t>();
    run.batch_seqs = m.at("batch_seqs").get<int64_t>();
    run.grad_accum = m.at("grad_accum").get<int64_t>();
    run.replicas = m.at("replicas").get<int64_t>();
    run.data_state = m.at("data_state").dump();
    run.inputs = m.at("inputs");
    HYDRA_USER_CHECK(run.step >= 1 && run.position >= 0 && run.world >= 1 && run.sp >= 1 && run.world % run.sp == 0 &&
                         run.seq_len >= 1 && run.batch_seqs >= 1 && run.grad_accum >= 1 && run.replicas >= 1 &&
                         run.inputs.is_object(),
                     "{}: fields out of range (step {}, data_position {}, world_size {}, sp {}, seq_len {}) {}", path,
                     run.step, run.position, run.world, run.sp, run.seq_len, kDamaged);
    // The shards cover the flat space [0, trainable) once, in rank order.
    const nlohmann::json& shards = m.at("shards");
    const int64_t trainable = m.at("trainable").get<int64_t>();
    m.at("flat_layout").get<std::string>();
    HYDRA_USER_CHECK(shards.is_array() && static_cast<int64_t>(shards.size()) == run.world,
                     "{}: {} shards for {} ranks {}", path, shards.is_array() ? shards.size() : 0, run.world, kDamaged);
    int64_t at = 0;
    for (const nlohmann::json& s : shards) {
      HYDRA_USER_CHECK(s.at("begin").get<int64_t>() == at && s.at("end").get<int64_t>() >= at,
                       "{}: shard {} holds [{}, {}), expected it to start at {} {}", path, s.at("file").get<std::string>(),
                       s.at("begin").get<int64_t>(), s.at("end").get<int64_t>(), at, kDamaged);
      at = s.at("end").get<int64_t>();
    }
    HYDRA_USER_CHECK(at == trainable, "{}: the shards end at {}, the state has {} elements {}", path, at, trainable,
                     kDamaged);
    return run;
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: a field is missing or mistyped ({}) {}", path, e.what(), kDamaged);
  }
}

void load_sharded_state(const std::string& dir, AdamW& optimizer) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  const nlohmann::json m = parse_manifest(dir);
  HYDRA_USER_CHECK(m.at("trainable").get<int64_t>() == optimizer.trainable_parameters() &&
                       m.at("flat_layout").get<std::string>() == hash_hex(optimizer.flat_layout_hash()),
                   "--resume: {} holds the state of {} trained elements (layout {}); this run trains {} (layout {}): "
                   "another --train set or model", path, m.at("trainable").get<int64_t>(),
                   m.at("flat_layout").get<std::string>(), optimizer.trainable_parameters(),
                   hash_hex(optimizer.flat_layout_hash()));
  const nlohmann::json& shards = m.at("shards");
  std::map<size_t, std::vector<Tensor>> opened;  // the shards this rank's range needs, read and verified once
  const auto read = [&](AdamW::Kind kind, int64_t begin, const TensorView& out) {
    const int64_t end = begin + out.numel();
    for (size_t i = 0; i < shards.size(); ++i) {
      const int64_t b = shards[i].at("begin").get<int64_t>(), e = shards[i].at("end").get<int64_t>();
      const int64_t lo = std::max(b, begin), hi = std::min(e, end);
      if (lo >= hi) continue;
      if (!opened.count(i)) opened.emplace(i, read_shard(dir, shards[i], m));
      const Tensor& t = opened.at(i)[static_cast<size_t>(kind)];
      copy_into(out.narrow(0, lo - begin, hi - lo), t.view().narrow(0, lo - b, hi - lo));
    }
  };
  optimizer.load_flat_state(read);
}

void verify_sharded_checkpoint(const std::string& dir) {
  read_manifest(dir);
  const nlohmann::json m = parse_manifest(dir);
  for (const nlohmann::json& s : m.at("shards")) read_shard(dir, s, m);
  const std::string model = (fs::path(dir) / "model.h5").string();
  require_readable_file(model, "model checkpoint");
  HYDRA_USER_CHECK(m.at("model").value("xxh3", "") == hash_hex(hash_file(model)), "{}: does not match its checksum {}",
                   model, kDamaged);
}

}  // namespace hydra::train
