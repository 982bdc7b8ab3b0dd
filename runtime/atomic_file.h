// Output files appear whole or not at all.
//
// AtomicFile hands out a temporary path in the destination's directory (same filesystem, so the
// final rename is atomic); commit() renames it over the destination. If the object dies without
// commit() (an exception, a failed write), the temporary is removed and the destination is left
// exactly as it was: a failed `hydra convert --out model.h5` never destroys an existing model.h5.
#pragma once

#include <string>

namespace hydra {

class AtomicFile {
 public:
  explicit AtomicFile(std::string destination);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& temp_path() const { return temp_; }
  const std::string& destination() const { return destination_; }
  void commit();

 private:
  std::string destination_;
  std::string temp_;
  bool committed_ = false;
};

// Fails with a UserError naming `path` if it does not exist or cannot be read.
void require_readable_file(const std::string& path, const char* what);
// Fails with a UserError if the directory that would hold `path` does not exist or is not writable.
void require_writable_destination(const std::string& path, const char* what);

}  // namespace hydra
