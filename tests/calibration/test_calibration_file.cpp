// The calibration file: it reads back to what was written (and writes the same text again), a reader that
// refuses, naming the file and the field, everything octet never writes (including seeded truncations and
// garbled bytes of a real file, which must never crash it), and the check that a calibration fits the model.
#include <cmath>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "calibration_fixture.h"
#include "octet/check.h"
#include "tiny_model.h"

namespace octet {
namespace {

constexpr const char* kOrigin = "planted.calibration.json";

Calibration planted() {
  return testing::made_up_calibration(testing::tiny_config(), {}, 32, [](size_t i) {
    return std::array<float, 3>{0.1f * static_cast<float>(i + 1), 3.0e-5f, 1.0e7f};
  });
}

// The message of the refusal of `text`, or "accepted".
std::string refusal(const std::string& text) {
  try {
    parse_calibration(text, kOrigin);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "accepted";
}

TEST(CalibrationFile, RoundTripsExactly) {
  const Calibration c = planted();
  const std::string text = calibration_json(c);
  const Calibration back = parse_calibration(text, kOrigin);
  EXPECT_EQ(calibration_json(back), text);
  ASSERT_EQ(back.layers.size(), c.layers.size());
  for (size_t i = 0; i < c.layers.size(); ++i) {
    EXPECT_EQ(back.layers[i].name, c.layers[i].name);
    EXPECT_EQ(back.layers[i].excluded, c.layers[i].excluded);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(back.layers[i].operands[k].scale, c.layers[i].operands[k].scale)
          << "float32 scales read back";
      EXPECT_EQ(back.layers[i].operands[k].format, c.layers[i].operands[k].format);
      EXPECT_EQ(back.layers[i].operands[k].statistics.amax, c.layers[i].operands[k].statistics.amax);
    }
  }
  EXPECT_EQ(back.layers.back().excluded, "excluded by config");
  EXPECT_NE(text.find("\"format\": \"octet-fp8-calibration\""), std::string::npos);
  EXPECT_NE(text.find("\"octet_version\""), std::string::npos);
}

TEST(CalibrationFile, RefusesWhatOctetNeverWrites) {
  const std::string good = calibration_json(planted());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not valid JSON"},
      {"[1, 2]", "must hold a JSON object"},
      {replaced("\"version\": 1", "\"version\": 2"), "version 2 is not one this octet reads"},
      {replaced("octet-fp8-calibration", "other"), "format is \"other\""},
      {replaced("\"scale\": 0.10000000149011612", "\"scale\": 0"), "is not a usable scale"},
      {replaced("\"scale\": 0.10000000149011612", "\"scale\": -1.5"), "is not a usable scale"},
      {replaced("\"scale\": 0.10000000149011612", "\"scale\": 1e39"), "is not a usable scale"},
      {replaced("\"scale\": 0.10000000149011612", "\"scale\": \"1\""), "scale must be a number"},
      {replaced("\"p99\": 1.0", "\"p99\": -1.0"), "must be a finite magnitude"},
      {replaced("\"zeros\": 3", "\"zeros\": -3"), "zeros must be from 0"},
      {replaced("\"format\": \"e4m3\"", "\"format\": \"bf16\""), "must be \"e4m3\" or \"e5m2\""},
      {replaced("\"name\": \"h.0.attn.c_proj\"", "\"name\": \"h.0.attn.c_attn\""), "appears twice"},
      {replaced("\"statistic\": \"amax\"", "\"statistic\": \"p50\""), "statistic \"p50\""},
      {replaced("\"batches\": 2", "\"batches\": 0"), "batches must be from 1"},
      {replaced("\"batches\": 2", "\"batches\": 99999999999999999999"), "batches must be a whole number"},
      {replaced("\"batches\": 2", "\"batches\": 18446744073709551615"), "batches must be from 1"},
      {replaced("\"version\": 1,", "\"version\": 1, \"version\": 1,"), "appears twice in one object"},
      {replaced("\"weight\": {", "\"weights\": {"), "has no \"weight\""},
      {std::string(100, '[') + std::string(100, ']'), "nested deeper"},
  };
  for (const auto& [text, words] : cases) {
    const std::string message = refusal(text);
    EXPECT_NE(message.find(kOrigin), std::string::npos) << message;
    EXPECT_NE(message.find(words), std::string::npos) << "wanted '" << words << "' in: " << message;
  }
}

TEST(CalibrationFile, TruncatedOrGarbledFilesAreRefusedCleanly) {
  const std::string good = calibration_json(planted());
  ASSERT_EQ(refusal(good), "accepted");
  int64_t refused = 0;
  for (size_t n = 0; n < good.size(); n += 7) refused += refusal(good.substr(0, n)) != "accepted";
  EXPECT_EQ(refused, static_cast<int64_t>((good.size() + 6) / 7)) << "every proper prefix is refused";
  std::mt19937_64 rng(2026);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string t = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) t[rng() % t.size()] = static_cast<char>(rng() % 256);
    try {
      const Calibration c = parse_calibration(t, kOrigin);
      for (const CalibratedLayer& l : c.layers) {  // whatever reads as valid is valid
        for (const CalibratedOperand& o : l.operands)
          EXPECT_TRUE(!l.excluded.empty() || is_valid_scale(o.scale));
      }
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2) << e.what();
      EXPECT_NE(std::string(e.what()).find(kOrigin), std::string::npos) << e.what();
    }
  }
}

TEST(CalibrationFile, MissingDirectoryOrFifoIsRefusedNamingIt) {
  for (const std::filesystem::path& p : {std::filesystem::path("/nonexistent/octet.calibration.json"),
                                         std::filesystem::temp_directory_path()}) {
    try {
      read_calibration_file(p);
      FAIL() << "read " << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  }
}

// calibrated_scales' refusal for `calibration` read by the tiny GPT-2 (or `model`) with `settings`.
std::string misfit(const Calibration& calibration, ModelConfig model = testing::tiny_config(),
                   PrecisionSettings settings = {}) {
  settings.mode = MixedPrecision::fp8;
  settings.recipe = RecipeKind::static_scale;
  const PrecisionPolicy policy(settings, model, 32);
  try {
    calibrated_scales(parse_calibration(calibration_json(calibration), kOrigin), kOrigin, model,
                      policy.layers(), policy.formats());
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find(kOrigin), std::string::npos) << e.what();
    return e.what();
  }
  return "fits";
}

TEST(CalibrationFile, FitsOnlyTheModelAndSettingsItWasMadeFor) {
  EXPECT_EQ(misfit(planted()), "fits");
  ModelConfig wider = testing::tiny_config();
  wider.channels = 128;
  EXPECT_NE(misfit(planted(), wider).find("made for another model: model.channels is 64 there, 128"),
            std::string::npos);
  ModelConfig deeper = testing::tiny_config();
  deeper.layers = 3;
  EXPECT_NE(misfit(planted(), deeper).find("model.layers is 2 there, 3"), std::string::npos);

  Calibration missing = planted();
  missing.layers.erase(missing.layers.begin() + 1);
  EXPECT_NE(misfit(missing).find("the model's layer h.0.attn.c_proj is missing from it"), std::string::npos);

  Calibration extra = planted();
  extra.layers.push_back(extra.layers.front());
  extra.layers.back().name = "h.7.attn.c_attn";
  EXPECT_NE(misfit(extra).find("a layer h.7.attn.c_attn that this model"), std::string::npos);

  Calibration reshaped = planted();
  reshaped.layers[2].out_features = 48;
  EXPECT_NE(misfit(reshaped).find("layer h.0.mlp.c_fc is [64 -> 48] there, [64 -> 256]"), std::string::npos);

  PrecisionSettings head;
  head.lm_head = true;  // the head runs in FP8 now, and was excluded when calibrated
  EXPECT_NE(
      misfit(planted(), testing::tiny_config(), head).find("lm_head runs in FP8 here but was not calibrated"),
      std::string::npos);

  PrecisionSettings e4m3;
  e4m3.all_e4m3 = true;
  EXPECT_NE(misfit(planted(), testing::tiny_config(), e4m3)
                .find("gradient scale is for e5m2, and this run casts "
                      "it to e4m3"),
            std::string::npos);

  PrecisionSettings fewer;
  fewer.exclude = {"h.1.*"};  // fewer FP8 layers than calibrated: fine
  EXPECT_EQ(misfit(planted(), testing::tiny_config(), fewer), "fits");
}

}  // namespace
}  // namespace octet
