#include "launch/kernel_options.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace hydra {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

ops::KernelOptions kernel_options_from_environment() {
  ops::KernelOptions o;
  if (const std::string v = env("HYDRA_ATTENTION_KERNEL"); !v.empty()) {
    HYDRA_USER_CHECK(v == "hopper" || v == "mma", "HYDRA_ATTENTION_KERNEL must be hopper or mma (got '{}')", v);
    o.attention = v == "hopper" ? ops::AttentionKernel::hopper : ops::AttentionKernel::mma;
  }
  if (const std::string v = env("HYDRA_ATTENTION_BWD_KERNEL"); !v.empty()) {
    HYDRA_USER_CHECK(v == "ws" || v == "mma" || v == "mma-k64",
                     "HYDRA_ATTENTION_BWD_KERNEL must be ws, mma or mma-k64 (got '{}')", v);
    o.attention_backward = v == "ws"    ? ops::AttentionBackwardKernel::ws
                           : v == "mma" ? ops::AttentionBackwardKernel::mma
                                        : ops::AttentionBackwardKernel::mma_k64;
  }
  if (const std::string v = env("HYDRA_GDN_SEGMENTS"); !v.empty()) {
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    HYDRA_USER_CHECK(end && *end == '\0' && n >= 1 && n <= 4096,
                     "HYDRA_GDN_SEGMENTS must be an integer from 1 to 4096 (got '{}')", v);
    o.gdn_segments = static_cast<int>(n);
  }
  if (const std::string v = env("HYDRA_GDN_PROFILE"); !v.empty()) {
    HYDRA_USER_CHECK(v == "0" || v == "1" || v == "2", "HYDRA_GDN_PROFILE must be 0, 1 or 2 (got '{}')", v);
    o.gdn_profile = v == "1" ? ops::GdnProfile::stages : v == "2" ? ops::GdnProfile::serial_stages : ops::GdnProfile::off;
  }
  if (const std::string v = env("HYDRA_SERIAL_BRANCHES"); !v.empty()) {
    HYDRA_USER_CHECK(v == "0" || v == "1", "HYDRA_SERIAL_BRANCHES must be 0 or 1 (got '{}')", v);
    o.branches = v == "1" ? Branches::serial : Branches::concurrent;
  }
  if (const std::string v = env("HYDRA_DECODE_PDL"); !v.empty()) {
    HYDRA_USER_CHECK(v == "0" || v == "1", "HYDRA_DECODE_PDL must be 0 or 1 (got '{}')", v);
    o.decode_pdl = v == "1";
  }
  if (const std::string v = env("HYDRA_DECODE_PREFETCH"); !v.empty()) {
    o.decode_prefetch_bytes = parse_decode_prefetch(v, "HYDRA_DECODE_PREFETCH");
  }
  if (const std::string v = env("HYDRA_SMALL_ROWS"); !v.empty()) {
    HYDRA_USER_CHECK(v == "0" || v == "1", "HYDRA_SMALL_ROWS must be 0 or 1 (got '{}')", v);
    o.small_rows = v == "1";
  }
  if (const std::string v = env("HYDRA_DECODE_GEMV"); !v.empty()) {
    HYDRA_USER_CHECK(v == "cublas" || v == "hydra" || v == "hydra-norm",
                     "HYDRA_DECODE_GEMV must be cublas, hydra or hydra-norm (got '{}')", v);
    o.decode_gemv = v == "hydra"        ? ops::DecodeGemvKernel::hydra
                    : v == "hydra-norm" ? ops::DecodeGemvKernel::hydra_norm
                                        : ops::DecodeGemvKernel::cublas;
  }
  if (const std::string v = env("HYDRA_GEMV_TUNING"); !v.empty()) o.gemv_tuning = ops::parse_gemv_tuning(v);
  return o;
}

int64_t parse_decode_prefetch(const std::string& text, const char* what) {
  if (text == "off") return 0;
  char* end = nullptr;
  errno = 0;
  const long long mib = std::strtoll(text.c_str(), &end, 10);
  HYDRA_USER_CHECK(!text.empty() && std::isdigit(static_cast<unsigned char>(text[0])) && end && *end == '\0' &&
                       errno == 0 && mib >= 0 && mib <= kMaxDecodePrefetchMiB,
                   "{} must be off or a whole number of MiB from 1 to {} (got '{}')", what, kMaxDecodePrefetchMiB, text);
  return static_cast<int64_t>(mib) * 1024 * 1024;
}

GpuSharing gpu_sharing_from_environment() {
  const std::string v = env("HYDRA_SHARE_GPUS");
  HYDRA_USER_CHECK(v.empty() || v == "0" || v == "1", "HYDRA_SHARE_GPUS must be 0 or 1 (got '{}')", v);
  return v == "1" ? GpuSharing::allowed : GpuSharing::one_rank_per_gpu;
}

}  // namespace hydra
