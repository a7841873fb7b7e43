// The parameter store's staleness rules: unit/parameter_store_test.cc checks each one
// against its brute-force reference (StalenessRules/EveryStalenessRule.*; a new rule also
// needs its case in that reference), bench/apply_bench.cc times each.
#pragma once

#include <vector>

#include "server/parameter_store.h"
#include "tests/support/variant.h"

namespace edgetrain::testing {

inline const std::vector<Variant<server::StalenessRule>>& staleness_rules() {
  static const std::vector<Variant<server::StalenessRule>> rules = {
      {"Sigma", "AdaComp: lr / max(1, sigma_i), per parameter",
       server::StalenessRule::kPerParameterSigma},
      {"Delay", "Zhang et al.: lr / max(1, delay), per update",
       server::StalenessRule::kPerUpdateDelay},
      {"None", "plain asynchronous SGD: lr, whatever the delay", server::StalenessRule::kNone},
  };
  return rules;
}

}  // namespace edgetrain::testing
