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
#include "runtime/json_integer.h"
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

// ---- Reading: every field of the manifest checked before any is used ----
// A manifest is a file someone may have edited: each number is range-checked before it is cast
// (runtime/json_integer.h), each name is a plain name inside the step folder, each kind is what the
// writer wrote; a damaged manifest is a UserError naming it and the field.

constexpr int64_t kMaxCount = int64_t{1} << 53;  // steps, positions, elements: what a double holds exactly
constexpr int64_t kMaxWorld = int64_t{1} << 20;
constexpr int64_t kMaxBatch = int64_t{1} << 30;  // batch_seqs, grad_accum: their product with replicas fits

// One shard's entry, checked: its rank's writer's file name, its range, its size and checksums.
struct ShardEntry {
  std::string file;
  int64_t begin = 0, end = 0, bytes = 0;
  std::map<std::string, std::string> checksums;  // dataset → XXH3 hex
};

// The manifest of a step folder, checked field by field.
struct Manifest : SavedRun {
  std::string path;  // of manifest.json
  int64_t trainable = 0;
  std::string flat_layout, model_xxh3;
  std::vector<ShardEntry> shards;
};

// object[key], present (UserError naming `where` and the field otherwise).
const nlohmann::json& field(const nlohmann::json& object, const std::string& key, const std::string& where) {
  HYDRA_USER_CHECK(object.is_object() && object.contains(key), "{}: field '{}' is missing", where, key);
  return object[key];
}
int64_t integer_field(const nlohmann::json& object, const std::string& key, int64_t lo, int64_t hi,
                      const std::string& where) {
  return json_integer_in(field(object, key, where), fmt::format("{}: field '{}'", where, key), lo, hi);
}
std::string string_field(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const nlohmann::json& v = field(object, key, where);
  HYDRA_USER_CHECK(v.is_string(), "{}: field '{}' is {}, not a string", where, key, v.dump().substr(0, 80));
  return v.get<std::string>();
}
bool is_hash_hex(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

nlohmann::json parse_manifest(const std::string& dir) {
  const std::string path = entry_inside(dir, kManifestName, dir, "the manifest");
  std::error_code ec;
  HYDRA_USER_CHECK(fs::is_regular_file(path, ec), "{}: is missing or not a file {}", path, kDamaged);
  std::ifstream in(path);
  HYDRA_USER_CHECK(in.good(), "{}: cannot be read {}", path, kDamaged);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, false);
  HYDRA_USER_CHECK(m.is_object() && m.contains("format") && m["format"] == kStateFormat,
                   "{}: not a hydra training manifest {}", path, kDamaged);
  return m;
}

Manifest checked_manifest(const std::string& dir) {
  const nlohmann::json m = parse_manifest(dir);
  Manifest run;
  run.path = (fs::path(dir) / kManifestName).string();
  const std::string& where = run.path;
  try {
    run.version = integer_field(m, "format_version", 0, kMaxCount, where);
    HYDRA_USER_CHECK(run.version == kManifestVersion, "{}: format_version {} is not one this hydra reads ({})", where,
                     run.version, kManifestVersion);
    run.stage = string_field(m, "stage", where);
    run.step = integer_field(m, "step", 1, kMaxCount, where);
    run.position = integer_field(m, "data_position", 0, kMaxCount, where);
    run.world = integer_field(m, "world_size", 1, kMaxWorld, where);
    run.sp = integer_field(m, "sp", 1, run.world, where);
    HYDRA_USER_CHECK(run.world % run.sp == 0, "{}: sp {} does not divide world_size {}", where, run.sp, run.world);
    run.seq_len = integer_field(m, "seq_len", 1, kMaxCount, where);
    run.seed = integer_field(m, "seed", INT64_MIN, INT64_MAX, where);
    run.batch_seqs = integer_field(m, "batch_seqs", 1, kMaxBatch, where);
    run.grad_accum = integer_field(m, "grad_accum", 1, kMaxBatch, where);
    run.replicas = integer_field(m, "replicas", run.world / run.sp, run.world / run.sp, where);
    HYDRA_USER_CHECK(static_cast<double>(run.batch_seqs) * static_cast<double>(run.grad_accum) *
                             static_cast<double>(run.replicas) <= static_cast<double>(kMaxCount),
                     "{}: batch_seqs {} × grad_accum {} × replicas {} windows a step is out of range", where,
                     run.batch_seqs, run.grad_accum, run.replicas);
    run.config = string_field(m, "config", where);
    const nlohmann::json config = nlohmann::json::parse(run.config, nullptr, false);
    HYDRA_USER_CHECK(config.is_object(), "{}: field 'config' does not hold a JSON object", where);
    const nlohmann::json& data_state = field(m, "data_state", where);
    HYDRA_USER_CHECK(data_state.is_object(), "{}: field 'data_state' is not an object", where);
    run.data_state = data_state.dump();
    run.inputs = field(m, "inputs", where);
    HYDRA_USER_CHECK(run.inputs.is_object(), "{}: field 'inputs' is not an object", where);
    for (const auto& [role, hash] : run.inputs.items()) {
      HYDRA_USER_CHECK(hash.is_string(), "{}: inputs['{}'] is {}, not a string", where, role, hash.dump().substr(0, 80));
    }
    run.trainable = integer_field(m, "trainable", 0, kMaxCount, where);
    run.flat_layout = string_field(m, "flat_layout", where);
    string_field(m, "dtype", where);
    const nlohmann::json& model = field(m, "model", where);
    HYDRA_USER_CHECK(string_field(model, "file", where + " model") == "model.h5",
                     "{}: the model's file is '{}', expected model.h5", where, model["file"].get<std::string>());
    run.model_xxh3 = string_field(model, "xxh3", where + " model");
    // The shards cover the flat space [0, trainable) once, in rank order, each under its writer's name.
    const nlohmann::json& shards = field(m, "shards", where);
    HYDRA_USER_CHECK(shards.is_array() && static_cast<int64_t>(shards.size()) == run.world, "{}: {} shards for {} ranks",
                     where, shards.is_array() ? shards.size() : 0, run.world);
    int64_t at = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string entry = fmt::format("{} shards[{}]", where, i);
      const nlohmann::json& s = shards[i];
      ShardEntry e;
      e.file = string_field(s, "file", entry);
      const std::string expected = shard_name(static_cast<int>(i), static_cast<int>(run.world));
      HYDRA_USER_CHECK(e.file == expected, "{}: file '{}' is not {}, the name its rank writes (a shard is a plain name "
                       "inside its step folder)", entry, e.file, expected);
      e.begin = integer_field(s, "begin", 0, run.trainable, entry);
      e.end = integer_field(s, "end", 0, run.trainable, entry);
      HYDRA_USER_CHECK(e.begin == at && e.end >= e.begin, "{}: holds [{}, {}), expected it to start at {}", entry,
                       e.begin, e.end, at);
      at = e.end;
      e.bytes = integer_field(s, "bytes", 0, kMaxCount, entry);
      const nlohmann::json& checksums = field(s, "checksums", entry);
      for (const auto& [kind, dataset] : kKinds) {
        const std::string hex = string_field(checksums, dataset, entry + " checksums");
        HYDRA_USER_CHECK(is_hash_hex(hex), "{}: the checksum of '{}' is '{}', not 16 hex digits", entry, dataset,
                         hex.substr(0, 40));
        e.checksums[dataset] = hex;
      }
      run.shards.push_back(std::move(e));
    }
    HYDRA_USER_CHECK(at == run.trainable, "{}: the shards end at {}, the state has {} elements", where, at,
                     run.trainable);
  } catch (const UserError& e) {
    HYDRA_USER_FAIL("{} {}", e.what(), kDamaged);
  } catch (const nlohmann::json::exception& e) {  // every access above is checked first: a bug if reached
    HYDRA_USER_FAIL("{}: a field is mistyped ({}) {}", where, e.what(), kDamaged);
  }
  return run;
}

// One shard read whole and checked against its manifest entry: size, attributes, per-dataset XXH3,
// shape, finite values, second moments ≥ 0. Returns its datasets in kKinds order.
std::vector<Tensor> read_shard(const std::string& dir, size_t index, const Manifest& manifest) {
  const ShardEntry& entry = manifest.shards.at(index);
  const std::string path = entry_inside(dir, entry.file, manifest.path, fmt::format("shard {}'s file", index));
  try {
    require_readable_file(path, "checkpoint shard");
    HYDRA_USER_CHECK(fs::file_size(path) == static_cast<uintmax_t>(entry.bytes), "{}: {} bytes, the manifest says {} {}",
                     path, fs::file_size(path), entry.bytes, kDamaged);
    const H5File h5 = H5File::open_read(path);
    HYDRA_USER_CHECK(h5.has_attribute("format") && h5.string_attribute("format") == kShardFormat,
                     "{}: not a hydra checkpoint shard {}", path, kDamaged);
    HYDRA_USER_CHECK(h5.int_attribute("begin") == entry.begin && h5.int_attribute("end") == entry.end &&
                         h5.int_attribute("step") == manifest.step &&
                         h5.int_attribute("data_position") == manifest.position,
                     "{}: holds [{}, {}) of step {}, the manifest names [{}, {}) of step {} {}", path,
                     h5.int_attribute("begin"), h5.int_attribute("end"), h5.int_attribute("step"), entry.begin,
                     entry.end, manifest.step, kDamaged);
    std::vector<Tensor> out;
    for (const auto& [kind, dataset] : kKinds) {
      Tensor t = h5.read(dataset);
      HYDRA_USER_CHECK((t.dtype() == DType::f32 || t.dtype() == DType::f64) && t.rank() == 1 &&
                           t.size(0) == entry.end - entry.begin,
                       "{}: dataset '{}' is {} {}, not [{}] float elements {}", path, dataset, dtype_name(t.dtype()),
                       t.shape_string(), entry.end - entry.begin, kDamaged);
      HYDRA_USER_CHECK(entry.checksums.at(dataset) == hash_hex(hash_tensor(t)),
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

SavedRun read_manifest(const std::string& dir) { return checked_manifest(dir); }

void load_sharded_state(const std::string& dir, AdamW& optimizer) {
  const Manifest m = checked_manifest(dir);
  HYDRA_USER_CHECK(m.trainable == optimizer.trainable_parameters() &&
                       m.flat_layout == hash_hex(optimizer.flat_layout_hash()),
                   "--resume: {} holds the state of {} trained elements (layout {}); this run trains {} (layout {}): "
                   "another --train set or model", m.path, m.trainable, m.flat_layout,
                   optimizer.trainable_parameters(), hash_hex(optimizer.flat_layout_hash()));
  std::map<size_t, std::vector<Tensor>> opened;  // the shards this rank's range needs, read and verified once
  const auto read = [&](AdamW::Kind kind, int64_t begin, const TensorView& out) {
    const int64_t end = begin + out.numel();
    for (size_t i = 0; i < m.shards.size(); ++i) {
      const int64_t b = m.shards[i].begin, e = m.shards[i].end;
      const int64_t lo = std::max(b, begin), hi = std::min(e, end);
      if (lo >= hi) continue;
      if (!opened.count(i)) opened.emplace(i, read_shard(dir, i, m));
      const Tensor& t = opened.at(i)[static_cast<size_t>(kind)];
      copy_into(out.narrow(0, lo - begin, hi - lo), t.view().narrow(0, lo - b, hi - lo));
    }
  };
  optimizer.load_flat_state(read);
}

void verify_sharded_checkpoint(const std::string& dir) {
  const Manifest m = checked_manifest(dir);
  for (size_t i = 0; i < m.shards.size(); ++i) read_shard(dir, i, m);
  const std::string model = entry_inside(dir, "model.h5", m.path, "the model's file");
  require_readable_file(model, "model checkpoint");
  HYDRA_USER_CHECK(m.model_xxh3 == hash_hex(hash_file(model)), "{}: does not match its checksum {}", model, kDamaged);
}

}  // namespace hydra::train
