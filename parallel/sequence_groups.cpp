#include "parallel/sequence_groups.h"

#include <algorithm>

#include "runtime/error.h"

namespace hydra {

int SequenceGroups::resolve_sp(int sp, int ranks) {
  HYDRA_USER_CHECK(sp >= 0, "--sp must not be negative (got {})", sp);
  if (sp == 0) return ranks;
  HYDRA_USER_CHECK(ranks % sp == 0, "--sp {} must divide the number of ranks ({})", sp, ranks);
  return sp;
}

SequenceGroups::SequenceGroups(Communicator& world, int sp) : world_(world) {
  const int p = world.size();
  sp = resolve_sp(sp, p);
  replicas_ = p / sp;
  replica_ = world.rank() / sp;
  if (sp == p) {
    sequence_ = &world;
  } else {
    owned_ = world.split(replica_, world.rank());
    sequence_ = owned_.get();
  }
}

std::vector<std::vector<double>> SequenceGroups::gather(std::span<const double> mine) {
  const int64_t groups = replicas_;
  // 1. Every group's length (one non-zero slot per group), 2. the values at their offsets.
  Tensor sizes = Tensor::zeros({groups}, DType::f64);
  if (group_lead()) sizes.data_as<double>()[replica_] = static_cast<double>(mine.size());
  all_reduce_sum_host(world_, sizes);
  std::vector<int64_t> offset(static_cast<size_t>(groups) + 1, 0);
  for (int64_t g = 0; g < groups; ++g) {
    offset[static_cast<size_t>(g) + 1] = offset[static_cast<size_t>(g)] + static_cast<int64_t>(sizes.data_as<double>()[g]);
  }
  std::vector<std::vector<double>> out(static_cast<size_t>(groups));
  if (offset.back() == 0) return out;
  Tensor values = Tensor::zeros({offset.back()}, DType::f64);
  if (group_lead()) std::copy(mine.begin(), mine.end(), values.data_as<double>() + offset[static_cast<size_t>(replica_)]);
  all_reduce_sum_host(world_, values);
  for (int64_t g = 0; g < groups; ++g) {
    const double* v = values.data_as<double>();
    out[static_cast<size_t>(g)].assign(v + offset[static_cast<size_t>(g)], v + offset[static_cast<size_t>(g) + 1]);
  }
  return out;
}

}  // namespace hydra
