// See fuzz_harness.h.
#include "fuzz_harness.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::fuzz {
namespace {

// Exit codes of the child.
constexpr int kAccepted = 0;
constexpr int kRefused = 10;
constexpr int kBadMessage = 11;
constexpr int kWrongError = 12;
constexpr int kPropertyFailed = 13;

const std::vector<std::string>& special_tokens() {
  static const std::vector<std::string> tokens = {
      "[", "]", "{", "}", "\"", "'", "=", ".", ",", ":", "\n", "\r", "\t", "\\", "#", "[[", "]]", "\"\"\"",
      "'''", std::string("\0", 1), "\xff", "\xc0\x80", "\xed\xa0\x80", "\x1b[31m", "nan", "inf", "-inf",
      "\"nan\"", "\"inf\"", "-1", "0", "-0", "1e300", "1e-300", "1e999", "-1e999", "3.5e38",
      "9223372036854775807", "9223372036854775808", "-9223372036854775808", "18446744073709551616",
      "4294967295", "4294967296", "2147483647", "2147483648", "65536", "null", "true", "[]", "{}",
      "\"\\u0000\"", "\"\\ud800\"", "a.b.c.d.e.f.g.h.i.j", std::string(300, 'x')};
  return tokens;
}

const std::vector<int64_t>& boundary_integers() {
  static const std::vector<int64_t> values = {0,          1,           -1,         7,
                                              255,        256,         65535,      65536,
                                              1024,       2147483647,  -2147483648LL, 4294967295LL,
                                              20240520,   20240801,    INT64_MAX,  INT64_MIN,
                                              1LL << 40,  100000000};
  return values;
}

size_t below(std::mt19937_64& rng, size_t n) {
  return n == 0 ? 0 : static_cast<size_t>(rng() % n);
}

}  // namespace

uint64_t seed_from_environment(uint64_t fallback) {
  const char* text = std::getenv("OCTET_FUZZ_SEED");
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 0) : fallback;
}

int scaled_cases(int cases) {
  const char* text = std::getenv("OCTET_FUZZ_SCALE");
  const double scale = text != nullptr && *text != '\0' ? std::strtod(text, nullptr) : 1.0;
  return std::max(1, static_cast<int>(cases * scale));
}

bool selected(int index) {
  const char* text = std::getenv("OCTET_FUZZ_CASE");
  return text == nullptr || *text == '\0' || std::atoi(text) == index;
}

std::mt19937_64 case_rng(uint64_t seed, int index) {
  std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                         static_cast<uint32_t>(index)};
  return std::mt19937_64(sequence);
}

std::string mutate(const std::string& input, const std::vector<std::string>& corpus, std::mt19937_64& rng,
                   const MutatorOptions& options) {
  std::string s = input;
  const int mutations = 1 + static_cast<int>(below(rng, 4));
  for (int m = 0; m < mutations; ++m) {
    const size_t kinds = options.binary ? 11 : 9;
    const size_t at = below(rng, s.size() + 1);
    switch (below(rng, kinds)) {
      case 0:  // flip a bit
        if (!s.empty()) s[below(rng, s.size())] ^= static_cast<char>(1 << below(rng, 8));
        break;
      case 1:  // set a byte
        if (!s.empty()) s[below(rng, s.size())] = static_cast<char>(rng());
        break;
      case 2:  // truncate
        s.resize(below(rng, s.size() + 1));
        break;
      case 3: {  // insert random bytes
        std::string bytes(1 + below(rng, 8), '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        s.insert(at, bytes);
        break;
      }
      case 4:  // insert a token readers treat specially
        s.insert(at, special_tokens()[below(rng, special_tokens().size())]);
        break;
      case 5: {  // duplicate a chunk
        if (s.empty()) break;
        const size_t begin = below(rng, s.size()), length = 1 + below(rng, std::min<size_t>(64, s.size() - begin));
        s.insert(below(rng, s.size() + 1), s.substr(begin, length));
        break;
      }
      case 6: {  // delete a chunk
        if (s.empty()) break;
        const size_t begin = below(rng, s.size());
        s.erase(begin, 1 + below(rng, std::min<size_t>(64, s.size() - begin)));
        break;
      }
      case 7: {  // splice with another valid input
        if (corpus.empty()) break;
        const std::string& other = corpus[below(rng, corpus.size())];
        s = s.substr(0, at) + other.substr(below(rng, other.size() + 1));
        break;
      }
      case 8: {  // a run of nesting
        static const char* const units[] = {"[", "{", "a.", "{\"a\":", "[[", "{a="};
        const size_t count = std::vector<size_t>{1000, 20000, 200000}[below(rng, 3)];
        std::string run;
        const std::string unit = units[below(rng, 6)];
        run.reserve(unit.size() * count);
        for (size_t i = 0; i < count; ++i) run += unit;
        s.insert(at, run);
        break;
      }
      case 9:
      case 10: {  // overwrite a 4- or 8-byte field with a boundary integer
        const size_t width = below(rng, 2) == 0 ? 4 : 8;
        if (s.size() < width) break;
        size_t where = below(rng, s.size() - width + 1);
        if (options.hot_end > options.hot_begin && below(rng, 2) == 0 && options.hot_end <= s.size() &&
            options.hot_end - options.hot_begin >= width) {
          where = options.hot_begin + below(rng, options.hot_end - options.hot_begin - width + 1);
        }
        const int64_t value = boundary_integers()[below(rng, boundary_integers().size())];
        std::memcpy(s.data() + where, &value, width);  // little-endian: the low bytes for width 4
        break;
      }
    }
  }
  return s;
}

const char* outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::accepted:
      return "accepted";
    case Outcome::refused:
      return "refused";
    case Outcome::bad_message:
      return "refused with an empty or multi-line message";
    case Outcome::wrong_error:
      return "failed with an error other than invalid input";
    case Outcome::property_failed:
      return "accepted, but its result failed a check";
    case Outcome::crashed:
      return "crashed (signal)";
    case Outcome::hung:
      return "hung (time limit)";
  }
  return "?";
}

bool is_clean(Outcome outcome) {
  return outcome == Outcome::accepted || outcome == Outcome::refused;
}

Outcome run_case(const std::function<void()>& reader, unsigned seconds) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("fork");
    std::abort();
  }
  if (child == 0) {
    ::alarm(seconds);
    int code = kAccepted;
    try {
      reader();
    } catch (const Error& e) {
      const std::string message = e.what();
      if (e.kind() != ErrorKind::invalid_input) {
        std::fprintf(stderr, "error of another kind: %s\n", message.substr(0, 300).c_str());
        code = kWrongError;
      } else if (message.empty() || message.find_first_of("\n\r") != std::string::npos) {
        std::fprintf(stderr, "message not one line: %s\n", message.substr(0, 300).c_str());
        code = kBadMessage;
      } else {
        code = kRefused;
      }
    } catch (const PropertyFailure& f) {
      std::fprintf(stderr, "check failed: %s\n", f.what.substr(0, 600).c_str());
      code = kPropertyFailed;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exception: %s\n", std::string(e.what()).substr(0, 300).c_str());
      code = kWrongError;
    }
    std::fflush(nullptr);
    ::_exit(code);  // no destructors or atexit handlers of the parent's state
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
  }
  if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGALRM ? Outcome::hung : Outcome::crashed;
  switch (WEXITSTATUS(status)) {
    case kAccepted:
      return Outcome::accepted;
    case kRefused:
      return Outcome::refused;
    case kBadMessage:
      return Outcome::bad_message;
    case kPropertyFailed:
      return Outcome::property_failed;
    default:
      return Outcome::wrong_error;  // kWrongError, or a sanitizer's exit code
  }
}

void Campaign::record(int case_index, Outcome outcome) {
  if (outcome == Outcome::accepted) ++accepted;
  if (outcome == Outcome::refused) ++refused;
  if (!is_clean(outcome)) {
    failures.push_back(fmt::format("case {} (replay: OCTET_FUZZ_SEED={} OCTET_FUZZ_CASE={}): {}", case_index,
                                   seed, case_index, outcome_name(outcome)));
  }
}

std::string Campaign::summary() const {
  std::string s = fmt::format("seed {}: {} accepted, {} refused, {} failed", seed, accepted, refused,
                              failures.size());
  for (size_t i = 0; i < std::min<size_t>(failures.size(), 20); ++i) s += "\n  " + failures[i];
  return s;
}

}  // namespace octet::fuzz
