#include "tests/support/test_data.h"

#include <cstdlib>

namespace edgetrain::testing {

std::filesystem::path dependency_dir() {
  const char* env = std::getenv("EDGETRAIN_DEPS");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path("/var/cache/edgetrain");
}

std::filesystem::path mnist_dir() { return dependency_dir() / "mnist-full"; }

std::filesystem::path mnist_small_dir() { return dependency_dir() / "mnist-small"; }

std::filesystem::path fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

bool running_under_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && *ci != '\0';
}

std::optional<std::string> missing_data(std::initializer_list<std::filesystem::path> paths) {
  for (const auto& path : paths)
    if (!std::filesystem::exists(path))
      return path.string() + " not present (toolchains/setup-deps.sh provides it)";
  return std::nullopt;
}

}  // namespace edgetrain::testing
