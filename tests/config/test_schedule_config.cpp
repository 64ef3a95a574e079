// The keys that take lists of tables: train.precision_phases (and its shorthand fp8.bf16_warmup_steps and
// fp8.bf16_cooldown_steps) and optimizer.groups; what they resolve to, how they round-trip, and one clear
// message for each mistake.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/config/run_config.h"
#include "parse_errors.h"

namespace octet {
namespace {

using testing::error_of;

struct Span {
  MixedPrecision mode;
  int64_t first;
  int64_t end;
  bool operator==(const Span&) const = default;
};

std::vector<Span> spans_of(const RunConfig& c) {
  std::vector<Span> out;
  for (const PrecisionSpan& s : precision_schedule(c)) out.push_back({s.mode, s.first_step, s.end_step});
  return out;
}

constexpr MixedPrecision bf16 = MixedPrecision::bf16;
constexpr MixedPrecision fp8 = MixedPrecision::fp8;
constexpr MixedPrecision fp32 = MixedPrecision::fp32;

TEST(PrecisionPhases, InlineTablesResolveStepByStepAndTheLastRunsToTheEnd) {
  const RunConfig c = parse_run_config(
      "[train]\nsteps = 1000\nprecision_phases = [{ mode = \"bf16\", steps = 200 }, { mode = \"fp8\", steps "
      "= 700 "
      "}, { mode = \"bf16\" }]\n",
      "run.toml");
  EXPECT_EQ(spans_of(c), (std::vector<Span>{{bf16, 0, 200}, {fp8, 200, 900}, {bf16, 900, 1000}}));
  EXPECT_EQ(c.precision.mode, bf16) << "train.mixed_precision says the first phase's mode";
  EXPECT_EQ(precision_at(c, 0), bf16);
  EXPECT_EQ(precision_at(c, 199), bf16);
  EXPECT_EQ(precision_at(c, 200), fp8);
  EXPECT_EQ(precision_at(c, 899), fp8);
  EXPECT_EQ(precision_at(c, 900), bf16);
  EXPECT_EQ(precision_at(c, 1000), bf16);
  // The resolved configuration reads back as the same schedule.
  const RunConfig again = parse_run_config(to_toml(c), "again.toml");
  EXPECT_EQ(spans_of(again), spans_of(c));
  EXPECT_NE(to_toml(c).find("precision_phases = [{ mode = \"bf16\", steps = 200 }, { mode = \"fp8\", steps = "
                            "700 }, { mode = \"bf16\" }]\n"),
            std::string::npos)
      << to_toml(c);
}

TEST(PrecisionPhases, ArraysOfTablesAndOverridesReadTheSame) {
  const RunConfig tables = parse_run_config(
      "[train]\nsteps = 10\n[[train.precision_phases]]\nmode = \"fp32\"\nsteps = "
      "4\n[[train.precision_phases]]\n"
      "mode = \"fp8\"\nsteps = 6\n",
      "run.toml");
  EXPECT_EQ(spans_of(tables), (std::vector<Span>{{fp32, 0, 4}, {fp8, 4, 10}}));
  const RunConfig set =
      parse_run_config("[train]\nsteps = 10\n", "run.toml",
                       {"train.precision_phases=[{mode=\"fp32\", steps=4}, {mode=\"fp8\"}]"});
  EXPECT_EQ(spans_of(set), spans_of(tables));
}

TEST(PrecisionPhases, ShorthandPutsBf16StepsAroundFp8) {
  const RunConfig c = parse_run_config(
      "[train]\nmixed_precision = \"fp8\"\nsteps = 100\n[fp8]\nbf16_warmup_steps = 10\nbf16_cooldown_steps = "
      "5\n",
      "run.toml");
  EXPECT_EQ(spans_of(c), (std::vector<Span>{{bf16, 0, 10}, {fp8, 10, 95}, {bf16, 95, 100}}));
  EXPECT_EQ(c.precision.mode, fp8);
  const RunConfig warmup_only = parse_run_config("[train]\nmixed_precision = \"fp8\"\nsteps = 100\n",
                                                 "run.toml", {"fp8.bf16_warmup_steps=1"});
  EXPECT_EQ(spans_of(warmup_only), (std::vector<Span>{{bf16, 0, 1}, {fp8, 1, 100}}));
  const RunConfig plain = parse_run_config("[train]\nmixed_precision = \"fp8\"\nsteps = 100\n", "run.toml");
  EXPECT_EQ(spans_of(plain), (std::vector<Span>{{fp8, 0, 100}}));
}

TEST(PrecisionPhases, ConfigInModeSetsWhatTheModeImplies) {
  const RunConfig c = parse_run_config("[train]\nmixed_precision = \"fp8\"\n", "run.toml");
  const RunConfig fp16 = config_in_mode(c, MixedPrecision::fp16);
  EXPECT_EQ(fp16.precision.mode, MixedPrecision::fp16);
  EXPECT_TRUE(fp16.train.loss_scale.dynamic);
  EXPECT_FALSE(config_in_mode(fp16, bf16).train.loss_scale.dynamic);
}

TEST(PrecisionPhases, MistakesAreRefusedWithTheReason) {
  const std::string train = "[train]\nsteps = 100\n";
  EXPECT_EQ(error_of(train + "precision_phases = [{ mode = \"fp4\", steps = 10 }, { mode = \"fp8\" }]\n"),
            "run.toml:3: entry 1 of train.precision_phases has mode = \"fp4\"; expected one of \"fp32\", "
            "\"bf16\", \"fp8\"");
  EXPECT_EQ(
      error_of(train + "precision_phases = [{ mode = \"bf16\", step = 10 }]\n"),
      "run.toml:3: entry 1 of train.precision_phases has an unknown key step; its keys are mode, steps");
  EXPECT_EQ(error_of(train + "precision_phases = [{ steps = 10 }]\n"),
            "run.toml:3: entry 1 of train.precision_phases has no mode; give one, as in { mode = \"bf16\", "
            "steps = 200 }");
  EXPECT_EQ(
      error_of(train + "precision_phases = [{ mode = \"bf16\", steps = 0 }, { mode = \"fp8\" }]\n"),
      "run.toml:3: entry 1 of train.precision_phases has steps = 0; a phase's steps are an integer of at "
      "least 1");
  EXPECT_EQ(
      error_of(train + "precision_phases = [\"bf16\", \"fp8\"]\n"),
      "run.toml:3: entry 1 of train.precision_phases must be a table such as { mode = \"bf16\", steps = "
      "200 }, got string \"bf16\"");
  EXPECT_EQ(
      error_of(train + "precision_phases = \"bf16\"\n"),
      "run.toml:3: train.precision_phases must be a list of tables such as { mode = \"bf16\", steps = 200 "
      "}, got string \"bf16\"");
  EXPECT_EQ(
      error_of(train + "precision_phases = [{ mode = \"bf16\" }, { mode = \"fp8\", steps = 10 }]\n"),
      "run.toml: entry 1 of train.precision_phases has no steps; only the last phase may leave them out "
      "(it runs to the end)");
  EXPECT_EQ(
      error_of(train + "precision_phases = [{ mode = \"bf16\", steps = 10 }, { mode = \"fp8\", steps = "
                       "20 }]\n"),
      "run.toml: train.precision_phases: the phases' steps add up to 30, but train.steps is 100; make them "
      "add up, or leave out the last phase's steps so that it runs to the end");
  EXPECT_EQ(
      error_of(train + "precision_phases = [{ mode = \"bf16\", steps = 150 }, { mode = \"fp8\" }]\n"),
      "run.toml: train.precision_phases: the phases up to entry 1 take 150 steps, more than train.steps "
      "(100)");
  EXPECT_EQ(
      error_of(train + "precision_phases = [{ mode = \"bf16\", steps = 100 }, { mode = \"fp8\" }]\n"),
      "run.toml: train.precision_phases: the phases up to entry 1 take 100 steps, all of train.steps (100)");
  EXPECT_EQ(error_of(train + "precision_phases = [{ mode = \"bf16\", steps = 10 }, { mode = \"bf16\" }]\n"),
            "run.toml: entries 1 and 2 of train.precision_phases are both bf16; join them into one phase");
  EXPECT_NE(error_of(train + "precision_phases = [{ mode = \"fp16\", steps = 10 }, { mode = \"fp8\" }]\n")
                .find("entry 1 of train.precision_phases is fp16, which a schedule cannot switch to or from"),
            std::string::npos);
  // A schedule's steps follow train.steps, --set included.
  EXPECT_EQ(
      error_of(train + "precision_phases = [{ mode = \"bf16\", steps = 10 }, { mode = \"fp8\", steps = "
                       "90 }]\n",
               {"train.steps=50"}),
      "run.toml: train.precision_phases: the phases up to entry 2 take 100 steps, more than train.steps "
      "(50)");
  // Every mode of the schedule must allow what the rest of the configuration asks.
  EXPECT_EQ(
      error_of(train + "weight_gradients = \"bf16\"\nprecision_phases = [{ mode = \"fp32\", steps = 10 }, "
                       "{ mode = \"fp8\" }]\n"),
      "run.toml: train.weight_gradients = \"bf16\" needs train.mixed_precision = \"bf16\" or \"fp8\" "
      "(weight-gradient GEMMs that round to bf16), got \"fp32\" for steps 1 to 10 of the precision "
      "schedule");
}

TEST(PrecisionPhases, ShorthandMistakesAreRefused) {
  EXPECT_EQ(error_of("[train]\nmixed_precision = \"bf16\"\n[fp8]\nbf16_warmup_steps = 10\n"),
            "run.toml: fp8.bf16_warmup_steps and fp8.bf16_cooldown_steps put bf16 steps around fp8 ones and "
            "need train.mixed_precision = \"fp8\", got \"bf16\"");
  EXPECT_EQ(error_of("[train]\nmixed_precision = \"fp8\"\nsteps = 20\n[fp8]\nbf16_warmup_steps = 10\n"
                     "bf16_cooldown_steps = 10\n"),
            "run.toml: fp8.bf16_warmup_steps (10) and fp8.bf16_cooldown_steps (10) leave no fp8 step of "
            "train.steps (20)");
  EXPECT_EQ(
      error_of("[train]\nmixed_precision = \"fp8\"\nsteps = 20\nprecision_phases = [{ mode = \"fp8\" }]\n"
               "[fp8]\nbf16_warmup_steps = 10\n"),
      "run.toml: fp8.bf16_warmup_steps and fp8.bf16_cooldown_steps are a shorthand for "
      "train.precision_phases; give one or the other");
  EXPECT_EQ(
      error_of("[train]\nmixed_precision = \"fp8\"\nsteps = 20\n[fp8]\nbf16_warmup_steps = 10\n"
               "bf16_cooldown_steps = 9223372036854775807\n"),
      "run.toml: fp8.bf16_warmup_steps (10) and fp8.bf16_cooldown_steps (9223372036854775807) leave no fp8 "
      "step of train.steps (20)");
  EXPECT_EQ(
      error_of("[train]\nsteps = 20\nprecision_phases = [{ mode = \"bf16\", steps = 10 }, { mode = "
               "\"fp8\", steps = 9223372036854775807 }]\n"),
      "run.toml: train.precision_phases: the phases up to entry 2 take 9223372036854775807 steps, more than "
      "train.steps (20)");
  EXPECT_EQ(error_of("[fp8]\nbf16_cooldown_steps = -1\n"),
            "run.toml:2: fp8.bf16_cooldown_steps must be at least 0, got -1");
}

TEST(ParameterGroups, BothTableFormsReadTheSameAndRoundTrip) {
  const RunConfig inline_tables = parse_run_config(
      "[optimizer]\ngroups = [{ match = \"h.*.attn.*\", lr_scale = 0.5 }, { match = \"wte\", lr_scale = 0, "
      "weight_decay = 0.0 }]\n",
      "run.toml");
  const RunConfig array_of_tables = parse_run_config(
      "[optimizer]\nweight_decay = 0.1\n[[optimizer.groups]]\nmatch = \"h.*.attn.*\"\nlr_scale = 0.5\n"
      "[[optimizer.groups]]\nmatch = \"wte\"\nlr_scale = 0\nweight_decay = 0.0\n",
      "run.toml");
  for (const RunConfig* c : {&inline_tables, &array_of_tables}) {
    const std::vector<ParameterGroup>& g = c->train.adamw.groups;
    ASSERT_EQ(g.size(), 2u);
    EXPECT_EQ(g[0].match, "h.*.attn.*");
    EXPECT_EQ(g[0].lr_scale, 0.5f);
    EXPECT_FALSE(g[0].weight_decay.has_value());
    EXPECT_EQ(g[1].match, "wte");
    EXPECT_EQ(g[1].lr_scale, 0.0f);
    EXPECT_EQ(g[1].weight_decay, 0.0f);
  }
  const std::string toml = to_toml(inline_tables);
  EXPECT_NE(
      toml.find("groups = [{ match = \"h.*.attn.*\", lr_scale = 0.5 }, { match = \"wte\", lr_scale = 0.0, "
                "weight_decay = 0.0 }]\n"),
      std::string::npos)
      << toml;
  EXPECT_EQ(to_toml(parse_run_config(toml, "again.toml")), toml);
  EXPECT_NE(to_toml(RunConfig{}).find("groups = []\n"), std::string::npos);
}

TEST(ParameterGroups, MistakesAreRefusedWithTheReason) {
  EXPECT_EQ(error_of("[optimizer]\ngroups = [{ lr_scale = 0.5 }]\n"),
            "run.toml:2: entry 1 of optimizer.groups needs match = a parameter-name glob, as in { match = "
            "\"h.*.attn.*\", lr_scale = 0.5 }, got none");
  EXPECT_EQ(error_of("[optimizer]\ngroups = [{ match = \"wte\", lr = 0.5 }]\n"),
            "run.toml:2: entry 1 of optimizer.groups has an unknown key lr; its keys are match, lr_scale, "
            "weight_decay");
  EXPECT_EQ(
      error_of("[optimizer]\ngroups = [{ match = \"wte\", lr_scale = -1 }]\n"),
      "run.toml:2: entry 1 of optimizer.groups: lr_scale must be a finite number of at least 0, got -1");
  EXPECT_EQ(error_of("[optimizer]\ngroups = [{ match = \"wte\", weight_decay = \"none\" }]\n"),
            "run.toml:2: entry 1 of optimizer.groups: weight_decay must be a number (at least 0), got string "
            "\"none\"");
  EXPECT_EQ(
      error_of("[optimizer]\ngroups = [{ match = \"wte\", lr_scale = 1e300 }]\n"),
      "run.toml:2: entry 1 of optimizer.groups: lr_scale must be a finite number of at least 0, got 1e+300");
}

}  // namespace
}  // namespace octet
