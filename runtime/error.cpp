#include "runtime/error.h"

#include <mpi.h>

namespace hydra {
namespace {
ErrorContext& mutable_context() {
  static ErrorContext context;
  return context;
}
}  // namespace

void set_error_context(const ErrorContext& context) { mutable_context() = context; }
const ErrorContext& error_context() { return mutable_context(); }

std::string describe_location() {
  const ErrorContext& c = error_context();
  std::string s = fmt::format("host {}, rank {}/{}", c.host.empty() ? "?" : c.host, c.rank,
                              c.world_size);
  if (c.device >= 0) s += fmt::format(", device {}", c.device);
  return s;
}

namespace detail {
void fail_statement(const char* statement, const char* file, int line, const std::string& what) {
  throw Error(fmt::format("{} failed: {} [{}:{}, {}]", statement, what, file, line,
                          describe_location()));
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<size_t>(length));
}
}  // namespace detail
}  // namespace hydra
