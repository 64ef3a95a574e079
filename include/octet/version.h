// octet's version, reported by `octet --version` and recorded in checkpoints.
#pragma once

namespace octet {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace octet
