// What the golden tests of GPT-2 and Llama share: running both sides of a case once per test process (octet
// here, the architecture's PyTorch reference as a child process), the comparisons of logits, loss, every
// gradient and the step losses with the suite's comparator, and the determinism check. Each test file
// supplies the reduction lengths that bound its architecture's float32 error.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "golden_io.h"
#include "golden_octet_run.h"

namespace octet::testing {

// Both sides of one case.
struct Golden {
  GoldenCase golden_case;
  OctetRun octet;
  GoldenOutput torch;
  std::optional<std::string> skip;   // why the comparison cannot run here
  std::optional<std::string> error;  // why it broke
};

// The case computed on first use and kept for the rest of the test process (CTest runs every test in a
// process of its own, so each runs one octet training and one PyTorch script).
const Golden& golden_for(const GoldenCase& golden_case);

// The bounds, as the comparator takes them: K is the sum of the float32 reduction lengths along the longest
// chain from the parameters to the compared output (the test files derive it per architecture).
// Logits against PyTorch's per-logit magnitudes; padded vocabulary columns must be exactly zero.
void expect_logits_match(const Golden& g, int64_t K);
void expect_loss_matches(const Golden& g, int64_t K);
// Every gradient element against its tensor's largest |gradient|; padded vocabulary rows exactly zero.
void expect_gradients_match(const Golden& g, int64_t K);
// Each step's loss held to the first loss's bound, and training lowers the loss.
void expect_step_losses_match(const Golden& g, int64_t K);

// Two octet runs of each case from the same seed: the same losses and final parameters, bit for bit.
void expect_bit_identical_training(const std::vector<GoldenCase>& cases);

}  // namespace octet::testing
