// The refusal a configuration text gets, for the configuration tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/config/run_config.h"

namespace octet::testing {

// The message of the Error that parsing `text` (with `overrides`) throws, which must be exit code 2; empty
// when it parses.
inline std::string error_of(std::string_view text, std::vector<std::string> overrides = {}) {
  try {
    parse_run_config(text, "run.toml", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return {};
}

}  // namespace octet::testing
