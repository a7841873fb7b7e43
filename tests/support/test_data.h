// The data sets some tests read (set-up puts them in place: toolchains/setup-deps.sh), and
// the one rule for a test whose data set is missing: on a developer's machine without the
// data it is skipped; under CI (the environment variable CI set, as CI runs always set it)
// it fails, because there set-up always provides the data and a skip would hide a broken
// set-up. The shell tests follow the same rule (require_mnist in
// tests/integration/process_test_lib.sh).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>

namespace edgetrain::testing {

// $EDGETRAIN_DEPS, or /var/cache/edgetrain: where set-up keeps what it fetched.
std::filesystem::path dependency_dir();
// Full MNIST's IDX files (60,000 / 10,000; train-images-idx3-ubyte, ...), as set-up fetches them.
std::filesystem::path mnist_dir();
// The 8,000 / 2,000 MNIST subset set-up converts, for CI-sized training runs.
std::filesystem::path mnist_small_dir();
// Fashion-MNIST from the Debian package dataset-fashion-mnist (gzip IDX files).
std::filesystem::path fashion_mnist_dir();

// True when CI is set to a non-empty value.
bool running_under_ci();
// "PATH not present (...)" for the first of `paths` that does not exist, or nothing.
std::optional<std::string> missing_data(std::initializer_list<std::filesystem::path> paths);

}  // namespace edgetrain::testing

// In a test body (or a function returning void that the test calls; GoogleTest's skip
// and fail only leave that function): skips the test when one of the files is missing,
// or fails it under CI.
#define EDGETRAIN_REQUIRE_DATA(...)                                                              \
  do {                                                                                           \
    if (const auto edgetrain_missing = ::edgetrain::testing::missing_data({__VA_ARGS__})) {      \
      if (::edgetrain::testing::running_under_ci()) FAIL() << *edgetrain_missing << " under CI"; \
      GTEST_SKIP() << *edgetrain_missing;                                                        \
    }                                                                                            \
  } while (0)
