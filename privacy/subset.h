// The entries of a secure round that sends a subset (issue 39 part 2, "compression and secure
// aggregation together"; docs/privacy.md, "Secure aggregation of a subset"). Masks only cancel
// in a sum when every device masks the same positions, so a per-device choice (top-k) cannot
// go through secure aggregation; every device of a session sends the same seeded random
// subset of the flat parameter vector instead, and the server sums those entries only.
//
// All ours:
//   - the subset is a fraction of the whole vector (the model's one parameter buffer), not
//     of each tensor: a small tensor (a bias) may get no entry in a round; the devices' error
//     feedback carries its changes to a later round;
//   - length = max(1, round(fraction · P)), at most P;
//   - the seed is public and derived, not drawn: seed = SplitMix64(model_id XOR
//     SplitMix64(session)), so that a restarted server replaying secagg.wal gets the same
//     subset without storing it, and each attempt of a round (a new session) another one;
//   - the indices: Knuth's selection sampling (TAOCP vol. 2, 3.4.2, Algorithm S) driven by
//     SplitMix64 (Steele, Lea, Flood 2014) from the seed, in integers only (each draw in
//     [0, P − i) is ⌊x · (P − i) / 2^64⌋ of a 64-bit x), so that an x86-64 server and an
//     aarch64 worker agree bit for bit; exactly `length` indices, ascending; O(P).
// Pure functions: no state, no allocation beyond the returned vector.
#pragma once

#include <cstdint>
#include <vector>

namespace edgetrain::privacy {

// max(1, round(fraction · P)), at most P. Throws std::invalid_argument for a fraction outside
// (0, 1] or P = 0.
std::uint32_t subset_length(double fraction, std::uint32_t vector_length);

// The public seed of a session's subset (above).
std::uint64_t subset_seed(std::uint64_t model_id, std::uint64_t session);

// `length` distinct indices of [0, vector_length), ascending, the same for the same arguments
// on every machine. Throws std::invalid_argument when length is 0 or above vector_length.
std::vector<std::uint32_t> subset_indices(std::uint64_t seed, std::uint32_t vector_length, std::uint32_t length);

}  // namespace edgetrain::privacy
