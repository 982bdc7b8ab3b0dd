#include "runtime/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"

namespace hydra {
namespace fs = std::filesystem;

AtomicFile::AtomicFile(std::string destination) : destination_(std::move(destination)) {
  const fs::path dest(destination_);
  const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  temp_ = (dir / fmt::format(".{}.tmp-{}", dest.filename().string(), static_cast<long>(getpid()))).string();
  std::remove(temp_.c_str());
}

AtomicFile::~AtomicFile() {
  if (!committed_) std::remove(temp_.c_str());
}

void AtomicFile::commit() {
  if (std::rename(temp_.c_str(), destination_.c_str()) != 0) {
    const int err = errno;
    std::remove(temp_.c_str());
    HYDRA_USER_FAIL("{}: cannot write ({})", destination_, std::strerror(err));
  }
  committed_ = true;
}

void require_readable_file(const std::string& path, const char* what) {
  std::error_code ec;
  HYDRA_USER_CHECK(!path.empty(), "no {} file given", what);
  HYDRA_USER_CHECK(fs::exists(path, ec), "{}: {} file does not exist", path, what);
  HYDRA_USER_CHECK(fs::is_regular_file(path, ec), "{}: {} is not a regular file", path, what);
  HYDRA_USER_CHECK(access(path.c_str(), R_OK) == 0, "{}: {} file is not readable ({})", path, what,
                   std::strerror(errno));
}

void require_writable_destination(const std::string& path, const char* what) {
  HYDRA_USER_CHECK(!path.empty(), "no {} path given", what);
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  HYDRA_USER_CHECK(fs::is_directory(dir, ec), "{}: directory {} for the {} does not exist", path,
                   dir.string(), what);
  HYDRA_USER_CHECK(access(dir.c_str(), W_OK) == 0, "{}: directory {} for the {} is not writable", path,
                   dir.string(), what);
  HYDRA_USER_CHECK(!fs::is_directory(p, ec), "{}: {} path is a directory", path, what);
}

}  // namespace hydra
