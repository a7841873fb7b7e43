// The CI-sized MNIST subset the simulator's tests train on, loaded once per test program.
// Fails even off CI: the simulator's claims are about the real digits.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "model/dataset.h"
#include "tests/support/test_data.h"

namespace edgetrain::testing {

struct SimMnist {
  runtime::Dataset train, test;
};

inline const SimMnist& sim_mnist() {
  static const SimMnist data = [] {
    const std::string dir = mnist_small_dir().string() + "/";
    if (!std::filesystem::exists(dir + "train-images-idx3-ubyte")) {
      ADD_FAILURE() << "MNIST IDX files missing in " << dir << ": run toolchains/setup-deps.sh";
      return SimMnist{};
    }
    return SimMnist{
        runtime::load_dataset(dir + "train-images-idx3-ubyte", dir + "train-labels-idx1-ubyte"),
        runtime::load_dataset(dir + "t10k-images-idx3-ubyte", dir + "t10k-labels-idx1-ubyte")};
  }();
  return data;
}

}  // namespace edgetrain::testing
