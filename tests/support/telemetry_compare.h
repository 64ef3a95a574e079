// Exact agreement of two layers' cast telemetry, for tests where both sides run the same casts on the same
// backend (fused against unfused ops on the CPU reference): every count and both energies must be equal.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "octet/backend/precision.h"

namespace octet::testing {

inline void expect_same_telemetry(const CastTelemetry& a, const CastTelemetry& e, const std::string& what) {
  EXPECT_EQ(a.casts, e.casts) << what;
  EXPECT_EQ(a.elements, e.elements) << what;
  EXPECT_EQ(a.nonzero, e.nonzero) << what;
  EXPECT_EQ(a.saturated, e.saturated) << what;
  EXPECT_EQ(a.underflowed, e.underflowed) << what;
  EXPECT_EQ(a.signal_energy, e.signal_energy) << what;
  EXPECT_EQ(a.noise_energy, e.noise_energy) << what;
}

}  // namespace octet::testing
