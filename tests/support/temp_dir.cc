#include "tests/support/temp_dir.h"

#include <fstream>
#include <iterator>

#include <unistd.h>

#include <atomic>
#include <string>

namespace edgetrain::testing {

TempDir::TempDir(std::string_view prefix) {
  static std::atomic<int> counter = 0;
  path_ =
      std::filesystem::temp_directory_path() /
      (std::string(prefix) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;  // a destructor must not throw; a leftover temp dir is harmless
  std::filesystem::remove_all(path_, ignored);
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::map<std::string, std::string> directory_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    files[entry.path().filename().string()] = file_bytes(entry.path());
  return files;
}

}  // namespace edgetrain::testing
