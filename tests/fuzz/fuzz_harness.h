// Seeded mutation fuzzing of octet's readers. Each case runs in a forked child under alarm(), so that a crash
// (a signal) or a hang (SIGALRM) is caught by the parent from the wait status instead of ending the test
// program. A case passes when the reader accepts the input or refuses it with one octet::Error of kind
// invalid_input whose message is one non-empty line; anything else fails, printing the seed and case index.
// OCTET_FUZZ_SEED and OCTET_FUZZ_CASE replay one case; OCTET_FUZZ_SCALE multiplies the number of cases
// (e.g. 0.25 under the sanitizers).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace octet::fuzz {

// The seed of this run: OCTET_FUZZ_SEED when set, else `fallback`.
uint64_t seed_from_environment(uint64_t fallback);
// `cases` scaled by OCTET_FUZZ_SCALE (at least 1).
int scaled_cases(int cases);
// Whether to run case `index`: every case, or only OCTET_FUZZ_CASE when it is set (to replay one).
bool selected(int index);
// The random generator of one case, so that any case replays alone from (seed, index).
std::mt19937_64 case_rng(uint64_t seed, int index);

struct MutatorOptions {
  bool binary = false;  // also overwrite 4- and 8-byte fields with boundary integers
  // Where binary field overwrites land half of the time (a header), as [begin, end) byte offsets.
  size_t hot_begin = 0, hot_end = 0;
};

// Applies 1 to 4 random mutations: bit flips, byte sets, truncation, insertion of random bytes or of tokens
// that readers treat specially (brackets, quotes, line breaks, invalid UTF-8, huge and negative numbers,
// NaN), chunk duplication and deletion, splices with another valid input, and runs of nesting (a thousand to
// a few hundred thousand brackets or dotted key parts).
std::string mutate(const std::string& input, const std::vector<std::string>& corpus, std::mt19937_64& rng,
                   const MutatorOptions& options = {});

enum class Outcome {
  accepted,          // the reader returned normally
  refused,           // octet::Error(invalid_input) with a one-line message
  bad_message,       // invalid_input, but an empty or multi-line message
  wrong_error,       // another octet::Error kind, or another exception
  property_failed,   // the reader accepted, but a check of its result failed (reported by the reader)
  crashed,           // ended by a signal other than SIGALRM
  hung,              // still running when the alarm rang
};
const char* outcome_name(Outcome outcome);
bool is_clean(Outcome outcome);

// Thrown by a reader's check of its own result (Outcome::property_failed).
struct PropertyFailure {
  std::string what;
};

// Runs `reader` in a forked child with a time limit of `seconds`; the child's stderr carries the message of a
// failing case.
Outcome run_case(const std::function<void()>& reader, unsigned seconds = 10);

// Counts of the outcomes of a campaign, and the failures to report.
struct Campaign {
  uint64_t seed = 0;
  int accepted = 0, refused = 0;
  std::vector<std::string> failures;  // "case N (seed S): outcome"
  void record(int case_index, Outcome outcome);
  std::string summary() const;
};

}  // namespace octet::fuzz
