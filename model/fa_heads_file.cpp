#include "model/fa_heads_file.h"

#include <algorithm>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace hydra {
namespace {
constexpr const char* kFormat = "hydrahead-fa-heads";

std::vector<int> sorted_unique_checked(std::vector<int> heads, const ModelConfig& teacher, size_t layer,
                                       const std::string& source) {
  std::sort(heads.begin(), heads.end());
  for (size_t i = 0; i < heads.size(); ++i) {
    HYDRA_USER_CHECK(heads[i] >= 0 && heads[i] < teacher.num_heads,
                     "{}: layer {} names head {}, but the model's heads are 0..{}", source, layer, heads[i],
                     teacher.num_heads - 1);
    HYDRA_USER_CHECK(i == 0 || heads[i] != heads[i - 1], "{}: layer {} names head {} twice", source, layer, heads[i]);
  }
  return heads;
}
}  // namespace

FaHeadsFile read_fa_heads_file(const std::string& path, const ModelConfig& teacher) {
  require_readable_file(path, "FA head set");
  nlohmann::json j;
  try {
    std::ifstream in(path);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: not valid JSON ({})", path, e.what());
  }
  FaHeadsFile out;
  try {
    HYDRA_USER_CHECK(j.is_object() && j.value("format", std::string()) == kFormat,
                     "{}: not an FA head-set file (format must be '{}')", path, kFormat);
    const int64_t version = j.contains("version") ? json_integer(j.at("version"), path + ": version") : 0;
    HYDRA_USER_CHECK(version == 1, "{}: unsupported version {}", path, version);
    // Head indices through json_integer: get<int>() of a float such as 1e300 is undefined behaviour.
    const nlohmann::json& list = j.at("fa_heads");
    HYDRA_USER_CHECK(list.is_array() && static_cast<int64_t>(list.size()) == teacher.num_layers,
                     "{}: lists {} layers, the model has {}", path, list.is_array() ? list.size() : 0,
                     teacher.num_layers);
    std::vector<std::vector<int>> layers;
    for (size_t l = 0; l < list.size(); ++l) {
      HYDRA_USER_CHECK(list[l].is_array(), "{}: fa_heads[{}] is not a list of heads", path, l);
      std::vector<int> heads;
      for (const nlohmann::json& h : list[l]) {
        const int64_t v = json_integer(h, fmt::format("{}: fa_heads[{}]", path, l));
        HYDRA_USER_CHECK(v >= 0 && v < teacher.num_heads, "{}: layer {} names head {}, but the model's heads are 0..{}",
                         path, l, v, teacher.num_heads - 1);
        heads.push_back(static_cast<int>(v));
      }
      layers.push_back(std::move(heads));
    }
    for (size_t l = 0; l < layers.size(); ++l) out.fa_heads.push_back(sorted_unique_checked(layers[l], teacher, l, path));
    if (j.contains("scores")) {
      for (const auto& [name, value] : j.at("scores").items()) {
        auto s = value.get<std::vector<std::vector<double>>>();
        HYDRA_USER_CHECK(static_cast<int64_t>(s.size()) == teacher.num_layers, "{}: scores '{}' list {} layers, the model has {}",
                         path, name, s.size(), teacher.num_layers);
        for (size_t l = 0; l < s.size(); ++l) {
          HYDRA_USER_CHECK(static_cast<int64_t>(s[l].size()) == teacher.num_heads,
                           "{}: scores '{}' layer {} has {} heads, the model has {}", path, name, l, s[l].size(),
                           teacher.num_heads);
        }
        out.scores.emplace(name, std::move(s));
      }
    }
    if (j.contains("selection")) {
      HYDRA_USER_CHECK(j.at("selection").is_object(), "{}: 'selection' must be a JSON object", path);
      out.selection_json = j.at("selection").dump();
    }
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: malformed FA head-set file ({})", path, e.what());
  }
  return out;
}

void write_fa_heads_file(const std::string& path, const ModelConfig& teacher, const FaHeadsFile& file) {
  nlohmann::json j = {{"format", kFormat},
                      {"version", 1},
                      {"num_layers", teacher.num_layers},
                      {"num_heads", teacher.num_heads},
                      {"fa_heads", file.fa_heads}};
  if (!file.scores.empty()) j["scores"] = file.scores;
  if (!file.selection_json.empty()) j["selection"] = nlohmann::json::parse(file.selection_json);
  require_writable_destination(path, "FA head-set file");
  AtomicFile out(path);
  {
    std::ofstream f(out.temp_path());
    f << j.dump(1) << "\n";
    HYDRA_USER_CHECK(f.good(), "{}: write failed", path);
  }
  out.commit();
}

namespace {
constexpr const char* kKinds =
    "uniform:K, random:K, random-global:K[@DRAW], top-global:K, bottom-global:K, layerwise:EVERY[@OFFSET] or file:PATH";

// The first k of a Fisher-Yates shuffle of 0..n-1 drawn from (seed, name), in drawn order.
std::vector<int> draw_without_replacement(int n, long k, uint64_t seed, const std::string& name) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const RandomStream rng{seed, hash_name(name)};
  for (long j = 0; j < k; ++j) {
    const long pick = j + static_cast<long>(rng.bits(static_cast<uint64_t>(j)) % static_cast<uint64_t>(n - j));
    std::swap(order[static_cast<size_t>(j)], order[static_cast<size_t>(pick)]);
  }
  order.resize(static_cast<size_t>(k));
  return order;
}

// scores.composite of a head-set file, required by the score-ranked kinds.
std::vector<std::vector<double>> composite_scores(const std::string& spec, const std::string& scores_path,
                                                  const ModelConfig& teacher) {
  HYDRA_USER_CHECK(!scores_path.empty(), "--fa-heads '{}' ranks heads by score: give --scores FILE (a head-set file "
                   "with scores.composite, e.g. what hydra select-heads wrote)", spec);
  const FaHeadsFile file = read_fa_heads_file(scores_path, teacher);
  const auto it = file.scores.find("composite");
  HYDRA_USER_CHECK(it != file.scores.end(), "{}: no scores.composite to rank heads by", scores_path);
  return it->second;
}

// Heads given as flat indices l * H + h, as a per-layer list of sorted heads.
std::vector<std::vector<int>> per_layer(const std::vector<int>& flat, const ModelConfig& teacher) {
  std::vector<std::vector<int>> layers(static_cast<size_t>(teacher.num_layers));
  for (int f : flat) layers[static_cast<size_t>(f / teacher.num_heads)].push_back(f % teacher.num_heads);
  for (auto& heads : layers) std::sort(heads.begin(), heads.end());
  return layers;
}
}  // namespace

std::vector<std::vector<int>> resolve_fa_heads(const std::string& spec, const ModelConfig& teacher,
                                               const std::string& scores_path, uint64_t seed) {
  const size_t colon = spec.find(':');
  HYDRA_USER_CHECK(colon != std::string::npos, "--fa-heads '{}': expected {}", spec, kKinds);
  const std::string kind = spec.substr(0, colon), arg = spec.substr(colon + 1);
  const auto integer = [&](const std::string& text, const char* what) {
    size_t used = 0;
    long v = -1;
    try {
      v = std::stol(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HYDRA_USER_CHECK(used == text.size() && used > 0, "--fa-heads '{}': {} must be an integer", spec, what);
    return v;
  };
  const auto number = [&](const char* what) { return integer(arg, what); };
  const int heads = teacher.num_heads;
  const int total = static_cast<int>(teacher.num_layers) * heads;
  std::vector<std::vector<int>> layers(static_cast<size_t>(teacher.num_layers));
  const bool ranked = kind == "uniform" || kind == "top-global" || kind == "bottom-global";
  HYDRA_USER_CHECK(ranked || scores_path.empty(),
                   "--scores only applies to --fa-heads uniform:K, top-global:K and bottom-global:K (not '{}')", spec);
  if (kind == "uniform") {
    const long k = number("K");
    HYDRA_USER_CHECK(k >= 0 && k <= heads,
                     "--fa-heads '{}': a budget of {} FA heads per layer is not in 0..{} (the model has {} heads per layer)",
                     spec, k, heads, heads);
    std::vector<std::vector<double>> scores;
    if (!scores_path.empty()) scores = composite_scores(spec, scores_path, teacher);
    for (int64_t l = 0; l < teacher.num_layers; ++l) {
      std::vector<int> order(static_cast<size_t>(heads));
      std::iota(order.begin(), order.end(), 0);
      if (!scores.empty()) {
        // Highest score first; ties keep the lower index.
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores[l][a] > scores[l][b]; });
      }
      layers[l].assign(order.begin(), order.begin() + k);
      std::sort(layers[l].begin(), layers[l].end());
    }
    return layers;
  }
  if (kind == "random") {
    const long k = number("K");
    HYDRA_USER_CHECK(k >= 0 && k <= heads,
                     "--fa-heads '{}': {} random FA heads per layer is not in 0..{} (the model has {} heads per layer)",
                     spec, k, heads, heads);
    // Per layer, the first K of a Fisher-Yates shuffle drawn from (seed, layer).
    for (int64_t l = 0; l < teacher.num_layers; ++l) {
      layers[l] = draw_without_replacement(heads, k, seed, "fa-heads/random/" + std::to_string(l));
      std::sort(layers[l].begin(), layers[l].end());
    }
    return layers;
  }
  if (kind == "random-global" || kind == "top-global" || kind == "bottom-global") {
    // random-global:K@DRAW draws from DRAW instead of the seed (a draw apart from the new weights' seed).
    const size_t at = kind == "random-global" ? arg.find('@') : std::string::npos;
    const long k = integer(arg.substr(0, at), "K");
    if (at != std::string::npos) {
      const long draw = integer(arg.substr(at + 1), "DRAW");
      HYDRA_USER_CHECK(draw >= 0, "--fa-heads '{}': DRAW must be 0 or more", spec);
      seed = static_cast<uint64_t>(draw);
    }
    HYDRA_USER_CHECK(k >= 0 && k <= total,
                     "--fa-heads '{}': a budget of {} FA heads over the whole model is not in 0..{} ({} layers x {} heads)",
                     spec, k, total, teacher.num_layers, heads);
    if (kind == "random-global") {
      // K of the L*H heads drawn uniformly (every K-subset equally likely); a layer may get several or none.
      return per_layer(draw_without_replacement(total, k, seed, "fa-heads/random-global"), teacher);
    }
    const std::vector<std::vector<double>> scores = composite_scores(spec, scores_path, teacher);
    std::vector<int> order(static_cast<size_t>(total));
    std::iota(order.begin(), order.end(), 0);
    const auto score = [&](int f) { return scores[static_cast<size_t>(f / heads)][static_cast<size_t>(f % heads)]; };
    // Across all layers: highest (top) or lowest (bottom) composite first; ties keep the lower (layer, head).
    if (kind == "top-global") {
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score(a) > score(b); });
    } else {
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score(a) < score(b); });
    }
    order.resize(static_cast<size_t>(k));
    return per_layer(order, teacher);
  }
  if (kind == "layerwise") {
    const size_t at = arg.find('@');
    const long every = integer(arg.substr(0, at), "EVERY");
    HYDRA_USER_CHECK(every >= 1 && every <= teacher.num_layers,
                     "--fa-heads '{}': EVERY must be in 1..{} (the number of layers)", spec, teacher.num_layers);
    const long offset = at == std::string::npos ? every - 1 : integer(arg.substr(at + 1), "OFFSET");
    HYDRA_USER_CHECK(offset >= 0 && offset < every, "--fa-heads '{}': OFFSET must be in 0..{} (EVERY - 1)", spec,
                     every - 1);
    for (int64_t l = 0; l < teacher.num_layers; ++l) {
      if (l % every == offset) {
        layers[l].resize(static_cast<size_t>(heads));
        std::iota(layers[l].begin(), layers[l].end(), 0);
      }
    }
    return layers;
  }
  if (kind == "file") return read_fa_heads_file(arg, teacher).fa_heads;
  HYDRA_USER_FAIL("--fa-heads '{}': unknown kind '{}' (expected {})", spec, kind, kKinds);
}

}  // namespace hydra
