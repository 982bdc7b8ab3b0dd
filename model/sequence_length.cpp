#include "model/sequence_length.h"

#include "parallel/gdn_scan.h"
#include "parallel/layout.h"
#include "runtime/error.h"

namespace hydra {
namespace {

int64_t halo_of(const ModelConfig& config) { return config.has_gdn_heads() ? config.conv_kernel - 1 : 0; }

}  // namespace

bool sequence_length_fits(const ModelConfig& config, int64_t length, int ranks) {
  if (length <= 0 || length % SequenceLayout::granularity(ranks) != 0) return false;
  const int64_t segment = ranks == 1 ? length : length / (2 * int64_t{ranks});
  return conv_halo_fits(segment, halo_of(config), ranks);
}

void check_sequence_length(const ModelConfig& config, int64_t length, int ranks, const std::string& where) {
  try {
    SequenceLayout::check_length(length, ranks);
  } catch (const UserError& e) {
    HYDRA_USER_FAIL("{}{}", where, e.what());
  }
  const int64_t segment = ranks == 1 ? length : length / (2 * int64_t{ranks}), halo = halo_of(config);
  HYDRA_USER_CHECK(conv_halo_fits(segment, halo, ranks),
                   "{}length {} on {} ranks gives segments of {} token(s), shorter than the conv halo ({} rows); use a "
                   "longer sequence or fewer ranks",
                   where, length, ranks, segment, halo);
}

}  // namespace hydra
