#include "tests/support/temp_dir.h"

#include <unistd.h>

#include <atomic>
#include <string>

namespace edgetrain::testing {

TempDir::TempDir(std::string_view prefix) {
  static std::atomic<int> counter = 0;
  path_ = std::filesystem::temp_directory_path() /
          (std::string(prefix) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;  // a destructor must not throw; a leftover temp dir is harmless
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace edgetrain::testing
