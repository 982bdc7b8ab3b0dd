#include "runtime/content_hash.h"

#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/error.h"

namespace hydra {

uint64_t hash_bytes(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t hash_tensor(const TensorView& tensor) {
  HYDRA_ASSERT(tensor.on_host(), "hash of a device tensor");
  if (tensor.is_contiguous()) return hash_bytes(tensor.data(), tensor.nbytes());
  const Tensor c = clone(tensor);
  return hash_bytes(c.view().data(), c.nbytes());
}

uint64_t hash_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  HYDRA_USER_CHECK(f != nullptr, "cannot read {}: {}", path, std::strerror(errno));
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
  HYDRA_ASSERT(state != nullptr && XXH3_64bits_reset(state.get()) == XXH_OK, "XXH3 state");
  std::vector<char> buf(size_t{8} << 20);
  for (;;) {
    const size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
    if (n > 0) XXH3_64bits_update(state.get(), buf.data(), n);
    if (n < buf.size()) break;
  }
  HYDRA_USER_CHECK(!std::ferror(f.get()), "cannot read {}: a read error", path);
  return XXH3_64bits_digest(state.get());
}

std::string hash_hex(uint64_t hash) { return fmt::format("{:016x}", hash); }

}  // namespace hydra
