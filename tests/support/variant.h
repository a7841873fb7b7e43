// One entry of a variant list that a test and a benchmark both iterate (as XNNPACK's tests
// and benchmarks share their kernel lists): the test instantiates one case per entry
// (INSTANTIATE_TEST_SUITE_P(..., ValuesIn(list), VariantName())), the benchmark registers
// one benchmark per entry, so a new variant is tested and benchmarked by adding one line.
#pragma once

#include <ostream>
#include <string>

namespace edgetrain::testing {

template <typename Setting>
struct Variant {
  std::string name;         // a C identifier: the test's parameter name and the benchmark's
  std::string description;  // what a reader of the figures should see
  Setting setting;
};

// How GoogleTest prints a variant (found by argument-dependent lookup): its name.
template <typename Setting>
void PrintTo(const Variant<Setting>& variant, std::ostream* out) {
  *out << variant.name;
}

// GoogleTest's name for a case of INSTANTIATE_TEST_SUITE_P over a variant list.
struct VariantName {
  template <typename ParamInfo>
  std::string operator()(const ParamInfo& info) const {
    return info.param.name;
  }
};

}  // namespace edgetrain::testing
