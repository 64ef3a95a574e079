// Precondition checks that throw octet::Error with the file, line and a message saying what was expected
// and what was seen. The command-line tool catches Error, prints one line and exits with its exit code.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace octet {

// Why an operation failed, which decides the exit code of the command line tool.
enum class ErrorKind {
  invalid_input,    // the user's input, arguments, config, data or checkpoint is wrong: exit code 2
  internal,         // a broken invariant inside octet: exit code 1
  training_failed,  // training cannot go on (for example too many non-finite steps in a row): exit code 3
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }
  int exit_code() const noexcept {
    return kind_ == ErrorKind::invalid_input ? 2 : kind_ == ErrorKind::training_failed ? 3 : 1;
  }

 private:
  ErrorKind kind_;
};

[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const std::string& message);

}  // namespace octet

// An internal invariant: `cond` must hold; the message says what was expected and what was seen.
#define OCTET_CHECK(cond, ...)                                                                    \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      ::octet::throw_error(::octet::ErrorKind::internal, __FILE__, __LINE__,                      \
                           fmt::format("check failed: {}: {}", #cond, fmt::format(__VA_ARGS__))); \
    }                                                                                             \
  } while (0)

// A user-facing validation: `cond` must hold for the input to be valid.
#define OCTET_REQUIRE(cond, ...)                                                                             \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      ::octet::throw_error(::octet::ErrorKind::invalid_input, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
    }                                                                                                        \
  } while (0)
