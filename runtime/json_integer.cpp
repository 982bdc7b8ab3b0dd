#include "runtime/json_integer.h"

#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace hydra {

int64_t json_integer(const nlohmann::json& value, const std::string& what) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    HYDRA_USER_CHECK(v <= static_cast<uint64_t>(INT64_MAX), "{}: {} is too large", what, v);
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    HYDRA_USER_CHECK(std::isfinite(v) && std::trunc(v) == v, "{}: {} is not an integer", what, v);
    HYDRA_USER_CHECK(std::fabs(v) <= 9007199254740992.0, "{}: {} is not an integer within ±2^53", what, v);
    return static_cast<int64_t>(v);
  }
  HYDRA_USER_FAIL("{}: expected an integer, got {}", what, value.dump().substr(0, 80));
}

int64_t json_integer_in(const nlohmann::json& value, const std::string& what, int64_t lo, int64_t hi) {
  const int64_t v = json_integer(value, what);
  HYDRA_USER_CHECK(v >= lo && v <= hi, "{}: {} is out of range [{}, {}]", what, v, lo, hi);
  return v;
}

}  // namespace hydra
