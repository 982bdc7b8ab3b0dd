// One error family for the whole runtime.
//
// Two kinds of failure:
//  - UserError: the input was wrong (bad flag, bad file, impossible shape). The message names the
//    problem and the file and is printed as one line; no location, no stack.
//  - Error: the program or a library failed. The message carries the failed statement, file:line,
//    host, rank and device, so a report from a 64-rank job says where it happened.
// Library status codes (CUDA, cuBLAS, NCCL, MPI, HDF5) go through HYDRA_CHECK_GEN: the statement is
// evaluated once, compared with its success value, and described by the library's own
// error-string function. The specific macros name identifiers (cudaSuccess, ncclSuccess, ...)
// that resolve where they are used, so this header needs none of those libraries' headers.
// A thrown error reaching main() on any rank ends the whole job (launch/main.cpp calls the
// communicator's abort), so no rank is left waiting in a collective.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace hydra {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UserError : public Error {
 public:
  using Error::Error;
};

// Where this process is: set once by the launcher, read by every error message.
struct ErrorContext {
  int rank = 0;
  int world_size = 1;
  int device = -1;  // CUDA device ordinal, -1 on the CPU path
  std::string host;
};
void set_error_context(const ErrorContext& context);
const ErrorContext& error_context();
// "host h, rank r/P, device d" (device omitted when none).
std::string describe_location();

namespace detail {
[[noreturn]] void fail_statement(const char* statement, const char* file, int line,
                                 const std::string& what);
}  // namespace detail

}  // namespace hydra

// Internal invariant: a failed check is a bug or a library failure, reported with its location.
#define HYDRA_ASSERT(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) ::hydra::detail::fail_statement(#cond, __FILE__, __LINE__,                  \
                                                 ::fmt::format(__VA_ARGS__));                \
  } while (0)

// User-facing check: the message must say what is wrong and with what (file, flag, tensor).
#define HYDRA_USER_CHECK(cond, ...)                                                          \
  do {                                                                                       \
    if (!(cond)) throw ::hydra::UserError(::fmt::format(__VA_ARGS__));                       \
  } while (0)

#define HYDRA_USER_FAIL(...) throw ::hydra::UserError(::fmt::format(__VA_ARGS__))

// Generic library status check: `ok` is the success value, `describe(status)` its text.
#define HYDRA_CHECK_GEN(stmt, ok, describe)                                                  \
  do {                                                                                       \
    auto hydra_status_ = (stmt);                                                             \
    if (hydra_status_ != (ok))                                                               \
      ::hydra::detail::fail_statement(#stmt, __FILE__, __LINE__,                             \
                                      ::fmt::format("{} (code {})", describe(hydra_status_), \
                                                    static_cast<long>(hydra_status_)));      \
  } while (0)

#define HYDRA_CUDA_CHECK(stmt) HYDRA_CHECK_GEN(stmt, cudaSuccess, cudaGetErrorString)
#define HYDRA_CUBLAS_CHECK(stmt) HYDRA_CHECK_GEN(stmt, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
#define HYDRA_NCCL_CHECK(stmt) HYDRA_CHECK_GEN(stmt, ncclSuccess, ncclGetErrorString)
#define HYDRA_MPI_CHECK(stmt) HYDRA_CHECK_GEN(stmt, MPI_SUCCESS, ::hydra::detail::mpi_error_string)
// HDF5 returns a negative herr_t or hid_t on failure; the HDF5 error stack is read by the caller
// (runtime/hdf5_file.cpp) which knows the file name.
#define HYDRA_H5_CHECK(stmt)                                                                 \
  do {                                                                                       \
    if ((stmt) < 0) ::hydra::detail::fail_statement(#stmt, __FILE__, __LINE__, "HDF5 call failed"); \
  } while (0)

namespace hydra::detail {
std::string mpi_error_string(int code);
}
