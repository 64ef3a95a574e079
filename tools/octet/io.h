// Whole-stream input and output for the command-line tool. Commands read all of standard input before they
// print anything (so that bad input leaves standard output empty) and write their output in one piece.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

namespace octet::cli {

// A stream could not be read or written (a closed or full output, an input that is a directory). Not the
// user's data being wrong and not an octet invariant: the tool reports it and exits with 1.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Everything left in `stream`; `name` (e.g. "standard input") goes into the error message.
std::string read_all(std::FILE* stream, std::string_view name);

// Writes all of `text` to `stream` and flushes it.
void write_all(std::FILE* stream, std::string_view text, std::string_view name);

}  // namespace octet::cli
