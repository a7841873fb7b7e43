// A fresh directory for one test's files, removed with everything in it when the object
// goes: tests run in parallel under ctest -j, so the name carries the process id and a
// per-process counter.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

namespace edgetrain::testing {

class TempDir {
 public:
  // <system temp dir>/<prefix>-<pid>-<n>; the directory itself is not created (the code
  // under test creates the directories it is given), anything left there is removed.
  explicit TempDir(std::string_view prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A file's bytes ("" if it cannot be read), and every file of a directory by name: for
// tests that check a state directory was left exactly as it was.
std::string file_bytes(const std::filesystem::path& path);
std::map<std::string, std::string> directory_bytes(const std::filesystem::path& dir);

}  // namespace edgetrain::testing
