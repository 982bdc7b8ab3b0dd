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
    HYDRA_USER_CHECK(std::isfinite(v) && std::trunc(v) == v && std::fabs(v) <= 9007199254740992.0,
                     "{}: {} is not an integer", what, v);
    return static_cast<int64_t>(v);
  }
  HYDRA_USER_FAIL("{}: expected an integer, got {}", what, value.dump().substr(0, 80));
}

}  // namespace hydra
