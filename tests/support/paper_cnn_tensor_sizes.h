// The paper CNN's tensors as the codec and the server see them: conv1 w/b, conv2 w/b,
// fc1 w/b, fc2 w/b (421,642 parameters), for tests and benchmarks that need its shape but
// not the model (tests/support/paper_cnn.h is the model itself).
#pragma once

#include <cstdint>
#include <vector>

namespace edgetrain::testing {

inline const std::vector<std::uint32_t> kPaperCnnTensorSizes = {288,    32,  18432, 64,
                                                                401408, 128, 1280,  10};

}  // namespace edgetrain::testing
