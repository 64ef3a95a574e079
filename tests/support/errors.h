// The message of the octet::Error a call throws, for tests of what octet refuses and how it says so.
#pragma once

#include <string>
#include <utility>

#include "octet/check.h"

namespace octet::testing {

// What `call` throws as octet::Error; "" when it throws none.
template <typename Call>
std::string error_of(Call&& call) {
  try {
    std::forward<Call>(call)();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace octet::testing
