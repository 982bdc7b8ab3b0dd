#include "parallel/agreement.h"

#include <algorithm>

namespace hydra {
namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ull, kFnvPrime = 1099511628211ull;
constexpr size_t kShownBytes = 160;

uint64_t fnv(std::string_view text, uint64_t h = kFnvOffset) {
  for (unsigned char c : text) h = (h ^ c) * kFnvPrime;
  return h;
}

// Every rank's `local` [n] int64 as [P, n] on the host (staged through the device for NCCL).
Tensor gather_host(Communicator& comm, const Tensor& local) {
  const int64_t p = comm.size(), n = local.numel();
  if (comm.device() == Device::host) {
    Tensor out = Tensor::empty({p, n}, DType::i64);
    comm.all_gather(local, out);
    return out;
  }
  const Tensor send = to_device(local, comm.device());
  Tensor recv = Tensor::empty({p, n}, DType::i64, comm.device());
  comm.all_gather(send, recv);
  return to(recv, Device::host, DType::i64);
}

Tensor i64_vector(const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i64);
  std::copy(values.begin(), values.end(), t.data_as<int64_t>());
  return t;
}

std::string shown(const std::string& value) {
  return value.size() <= kShownBytes ? value : value.substr(0, kShownBytes) + "...";
}

}  // namespace

void RunFingerprint::add(std::string name, std::string value) {
  fields_.push_back(FingerprintField{std::move(name), std::move(value)});
}

uint64_t hash_tokens(std::span<const int32_t> ids) {
  uint64_t h = kFnvOffset;
  for (int32_t id : ids) h = (h ^ static_cast<uint32_t>(id)) * kFnvPrime;
  return h;
}

void RunFingerprint::add_tokens(const std::string& name, std::span<const int32_t> ids) {
  add(name + " count", std::to_string(ids.size()));
  add(name + " hash", fmt::format("{:016x}", hash_tokens(ids)));
}

void agree_across_ranks(Communicator& comm, const RunFingerprint& fingerprint, const std::string& what) {
  const std::vector<FingerprintField>& fields = fingerprint.fields();
  std::vector<int64_t> digests;
  uint64_t total = kFnvOffset;
  for (const FingerprintField& f : fields) {
    const uint64_t d = fnv(f.value, fnv(std::string_view(f.name.c_str(), f.name.size() + 1)));
    digests.push_back(static_cast<int64_t>(d));
    total = (total ^ d) * kFnvPrime;
  }
  const int64_t p = comm.size(), count = static_cast<int64_t>(fields.size());
  // 1. One small all-gather in the common case: (total digest, field count) per rank.
  const Tensor summary = gather_host(comm, i64_vector({static_cast<int64_t>(total), count}));
  const int64_t* s = summary.data_as<int64_t>();
  int other = -1;
  int64_t most = 0;
  for (int64_t r = 0; r < p; ++r) {
    most = std::max(most, s[2 * r + 1]);
    if (other < 0 && (s[2 * r] != s[0] || s[2 * r + 1] != s[1])) other = static_cast<int>(r);
  }
  if (other < 0) return;
  // 2. Every rank's field digests, to find the first field where rank 0 and `other` differ.
  std::vector<int64_t> padded(digests);
  padded.resize(static_cast<size_t>(most), 0);
  const Tensor all = gather_host(comm, i64_vector(padded));
  const int64_t* a = all.data_as<int64_t>();
  int64_t first = std::min(s[1], s[2 * other + 1]);
  for (int64_t i = 0; i < most; ++i) {
    if (a[i] != a[other * most + i]) {
      first = i;
      break;
    }
  }
  // 3. The name and value of that field on every rank (bytes as int64, padded to the longest).
  std::string text = first < count ? fields[first].name + '\n' + shown(fields[first].value) : std::string();
  const Tensor lengths = gather_host(comm, i64_vector({static_cast<int64_t>(text.size())}));
  const int64_t longest =
      std::max<int64_t>(1, *std::max_element(lengths.data_as<int64_t>(), lengths.data_as<int64_t>() + p));
  std::vector<int64_t> bytes(static_cast<size_t>(longest), 0);
  for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  const Tensor texts = gather_host(comm, i64_vector(bytes));
  const auto text_of = [&](int64_t r) {
    std::string t;
    for (int64_t i = 0; i < lengths.data_as<int64_t>()[r]; ++i)
      t += static_cast<char>(texts.data_as<int64_t>()[r * longest + i]);
    const size_t nl = t.find('\n');
    return nl == std::string::npos ? std::make_pair(std::string(), std::string("(absent)"))
                                   : std::make_pair(t.substr(0, nl), t.substr(nl + 1));
  };
  const auto [name0, value0] = text_of(0);
  const auto [name1, value1] = text_of(other);
  const std::string difference =
      name0 == name1
          ? fmt::format("'{}' differs (rank 0: {}; rank {}: {})", name0, value0, other, value1)
          : fmt::format("rank 0 has '{}' = {} where rank {} has '{}' = {}", name0.empty() ? "(nothing)" : name0, value0,
                        other, name1.empty() ? "(nothing)" : name1, value1);
  HYDRA_USER_FAIL(
      "ranks 0 and {} disagree on {}: {}; every rank must run the same command on the same inputs "
      "(a stale or different file on one node?)",
      other, what, difference);
}

}  // namespace hydra
