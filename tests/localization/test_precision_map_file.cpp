// The precision map file: it reads back to what was written (and writes the same text again); the reader
// refuses, naming the file and the field, everything octet never writes (seeded truncations and garbled
// copies included, which must never crash it); and the precision policy runs the layers the map sets to
// BF16 in BF16 with the map's reason, never moving a layer into FP8, and refuses a map of another model.
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/model/calibration.h"
#include "octet/model/precision_map_file.h"
#include "octet/version.h"
#include "tiny_model.h"

namespace octet {
namespace {

constexpr const char* kOrigin = "planted.precision_map.json";

// A map of the tiny GPT-2 (4 block layers a block, the head excluded): h.1.mlp.c_fc in BF16, the others in
// FP8, with measurements made up so that every number is exact in binary.
PrecisionMapFile planted(const ModelConfig& model = testing::tiny_config()) {
  PrecisionSettings settings;
  settings.mode = MixedPrecision::fp8;
  const PrecisionPolicy policy(settings, model, 32);
  PrecisionMapFile m;
  m.octet_version = kVersion;
  m.data_dir = "data/planted";
  m.model_description = model.describe();
  m.model_shape = model_shape_keys(model);
  m.batches = 2;
  m.batch_size = 2;
  m.seq_len = 16;
  m.recipe = "current (hybrid E4M3/E5M2, margin 0)";
  m.budget = 0.005;
  m.predictor = "sum";
  m.gain_basis = "modelled";
  m.loss_bf16 = 2.5;
  m.loss_fp8 = 2.75;
  m.loss_chosen = 2.5078125;
  m.predicted_loss_change = 0.00390625;
  m.saving_ms = 0.125;
  for (const LinearPlan& p : policy.layers()) {
    LocalizedLayer l;
    l.name = p.name;
    l.in_features = p.in_features;
    l.out_features = p.out_features;
    if (!p.fp8()) {
      l.excluded = p.reason;
    } else {
      l.fp8 = p.name != "h.1.mlp.c_fc";
      l.reason =
          l.fp8 ? "fp8: saves 0.0156 ms" : "bf16: loss +12.500% alone in FP8, over the budget of 0.500%";
      l.numerics = {CastNumerics{30.5, 0.0, 0.25}, CastNumerics{31.25, 0.0, 0.0},
                    CastNumerics{std::nullopt, 0.5, 1.0}};
      l.alone_in_fp8 = {l.fp8 ? 0.0009765625 : 0.125, 0.99951171875, 1.0};
      l.alone_in_bf16 = {-0.0625, 0.5, -0.25};
      l.bf16_ms = 0.03125;
      l.fp8_gemm_ms = 0.015625;
      l.fp8_cast_ms = 0.0078125;
    }
    m.layers.push_back(std::move(l));
  }
  return m;
}

std::string refusal(const std::string& text) {
  try {
    parse_precision_map_file(text, kOrigin);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "accepted";
}

std::filesystem::path write(const std::string& name, const std::string& text) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TEST(PrecisionMapFile, RoundTripsExactly) {
  const PrecisionMapFile m = planted();
  const std::string text = precision_map_file_json(m);
  const PrecisionMapFile back = parse_precision_map_file(text, kOrigin);
  EXPECT_EQ(precision_map_file_json(back), text);
  ASSERT_EQ(back.layers.size(), m.layers.size());
  for (size_t i = 0; i < m.layers.size(); ++i) {
    EXPECT_EQ(back.layers[i].name, m.layers[i].name);
    EXPECT_EQ(back.layers[i].fp8, m.layers[i].fp8);
    EXPECT_EQ(back.layers[i].reason, m.layers[i].reason);
    EXPECT_EQ(back.layers[i].excluded, m.layers[i].excluded);
    EXPECT_EQ(back.layers[i].alone_in_fp8.loss_change, m.layers[i].alone_in_fp8.loss_change);
    EXPECT_EQ(back.layers[i].numerics[0].sqnr_db, m.layers[i].numerics[0].sqnr_db);
    EXPECT_EQ(back.layers[i].numerics[2].sqnr_db.has_value(), m.layers[i].numerics[2].sqnr_db.has_value());
    EXPECT_EQ(back.layers[i].fp8_cast_ms, m.layers[i].fp8_cast_ms);
  }
  EXPECT_EQ(back.model_shape, m.model_shape);
  EXPECT_EQ(back.budget, 0.005);
  EXPECT_NE(text.find("\"choice\": \"bf16\""), std::string::npos);
  EXPECT_NE(text.find("\"choice\": \"excluded\""), std::string::npos);
}

TEST(PrecisionMapFile, RefusesWhatOctetNeverWrites) {
  const std::string good = precision_map_file_json(planted());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_NE(refusal("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal("[]").find("must hold a JSON object"), std::string::npos);
  EXPECT_NE(refusal(replaced("octet-precision-map", "octet-fp8-calibration")).find("format is"),
            std::string::npos);
  EXPECT_NE(refusal(replaced("\"version\": 1", "\"version\": 2")).find("version 2 is not one"),
            std::string::npos);
  EXPECT_NE(refusal(replaced("\"choice\": \"bf16\"", "\"choice\": \"fp16\"")).find("choice must be"),
            std::string::npos);
  EXPECT_NE(refusal(replaced("\"saturated\": 0.5", "\"saturated\": 1.5")).find("saturated"),
            std::string::npos);
  EXPECT_NE(refusal(replaced("\"budget\": 0.005", "\"budget\": -1")).find("budget"), std::string::npos);
  EXPECT_NE(
      refusal(replaced("\"name\": \"h.0.mlp.c_fc\"", "\"name\": \"h.0.attn.c_attn\"")).find("appears twice"),
      std::string::npos);
  EXPECT_NE(
      refusal(replaced("\"batches\": 2,", "\"batches\": 2, \"batches\": 3,")).find("appears twice in one"),
      std::string::npos);
  EXPECT_NE(
      refusal(replaced("\"reason\": \"fp8: saves 0.0156 ms\"", "\"reason\": \"\"")).find("must say why"),
      std::string::npos);
  EXPECT_NE(refusal("{\"a\": [[[[[[[[1]]]]]]]]}").find("nested deeper"), std::string::npos);
}

TEST(PrecisionMapFile, TruncatedOrGarbledFilesAreRefusedCleanly) {
  const std::string good = precision_map_file_json(planted());
  ASSERT_EQ(refusal(good), "accepted");
  int64_t refused = 0;
  for (size_t n = 0; n < good.size(); n += 7) refused += refusal(good.substr(0, n)) != "accepted";
  EXPECT_EQ(refused, static_cast<int64_t>((good.size() + 6) / 7)) << "every proper prefix is refused";
  std::mt19937_64 rng(2027);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string t = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) t[rng() % t.size()] = static_cast<char>(rng() % 256);
    try {
      const PrecisionMapFile m = parse_precision_map_file(t, kOrigin);
      for (const LocalizedLayer& l : m.layers) {  // whatever reads as valid is valid
        EXPECT_TRUE(!l.excluded.empty() || !l.reason.empty());
        EXPECT_TRUE(l.numerics[0].saturated >= 0.0 && l.numerics[0].saturated <= 1.0);
      }
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2) << e.what();
      EXPECT_NE(std::string(e.what()).find(kOrigin), std::string::npos) << e.what();
    }
  }
}

TEST(PrecisionMapFile, MissingFileIsRefusedNamingIt) {
  try {
    read_precision_map_file("/nonexistent/x.precision_map.json");
    FAIL() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.precision_map.json"), std::string::npos) << e.what();
  }
}

PrecisionSettings fp8_with_map(const std::filesystem::path& map) {
  PrecisionSettings s;
  s.mode = MixedPrecision::fp8;
  s.precision_map = map;
  return s;
}

TEST(PrecisionMapPolicy, RunsTheMapsBf16LayersInBf16WithItsReason) {
  const std::filesystem::path file =
      write("octet-test.precision_map.json", precision_map_file_json(planted()));
  const PrecisionPolicy policy(fp8_with_map(file), testing::tiny_config(), 32);
  EXPECT_EQ(policy.precision_map_moved(), 1);
  EXPECT_EQ(policy.fp8_layer_count(), 7);
  const LinearPlan& c_fc = policy.layer("h.1.mlp.c_fc");
  EXPECT_FALSE(c_fc.fp8());
  EXPECT_EQ(c_fc.forward, GemmMode::bf16);
  EXPECT_EQ(c_fc.input_gradient, GemmMode::bf16);
  EXPECT_EQ(c_fc.weight_gradient, GemmMode::bf16);
  EXPECT_EQ(c_fc.reason, "bf16: loss +12.500% alone in FP8, over the budget of 0.500% (precision map " +
                             file.string() + ")");
  EXPECT_TRUE(policy.layer("h.0.mlp.c_fc").fp8());
  EXPECT_NE(policy.startup_line().find("7 of 9 linear layers in FP8; 1 kept in BF16 by precision map " +
                                       file.string() + "; lm_head: excluded by config"),
            std::string::npos)
      << policy.startup_line();
  const std::string json = policy.map_json();
  EXPECT_NE(json.find("\"reason\": \"bf16: loss +12.500% alone in FP8"), std::string::npos) << json;
}

TEST(PrecisionMapPolicy, ComposesWithExcludeAndNeverMovesALayerIntoFp8) {
  PrecisionMapFile m = planted();
  m.layers[0].fp8 = true;  // h.0.attn.c_attn: fp8 in the map, excluded by the configuration
  const std::filesystem::path file =
      write("octet-test-exclude.precision_map.json", precision_map_file_json(m));
  PrecisionSettings s = fp8_with_map(file);
  s.exclude = {"h.0.attn.*"};
  const PrecisionPolicy policy(s, testing::tiny_config(), 32);
  EXPECT_FALSE(policy.layer("h.0.attn.c_attn").fp8());
  EXPECT_EQ(policy.layer("h.0.attn.c_attn").reason, "excluded by pattern 'h.0.attn.*'");
  EXPECT_FALSE(policy.layer("h.1.mlp.c_fc").fp8());
  EXPECT_FALSE(policy.layer("lm_head").fp8());  // excluded in the map, excluded here
  EXPECT_EQ(policy.fp8_layer_count(), 5);
  // The head converted here but excluded when the map was made: the map cannot speak for it.
  s.exclude.clear();
  s.lm_head = true;
  try {
    const PrecisionPolicy refused(s, testing::tiny_config(), 32);
    FAIL() << "a layer converted here that the map did not measure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer lm_head runs in FP8 here but was not measured"),
              std::string::npos)
        << e.what();
  }
}

TEST(PrecisionMapPolicy, RefusesAMapOfAnotherModel) {
  auto refused = [](const PrecisionMapFile& m, const ModelConfig& model) -> std::string {
    const std::filesystem::path file =
        write("octet-test-other.precision_map.json", precision_map_file_json(m));
    try {
      const PrecisionPolicy policy(fp8_with_map(file), model, 32);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
      return e.what();
    }
    return "accepted";
  };
  ModelConfig wider = testing::tiny_config();
  wider.channels = 128;
  EXPECT_NE(refused(planted(), wider).find("made for another model: model.channels is 64 there, 128"),
            std::string::npos);
  PrecisionMapFile missing = planted();
  missing.layers.erase(missing.layers.begin() + 2);
  EXPECT_NE(refused(missing, testing::tiny_config()).find("the model's layer h.0.mlp.c_fc is missing"),
            std::string::npos);
  PrecisionMapFile extra = planted();
  extra.layers[2].name = "h.9.mlp.c_fc";
  EXPECT_NE(refused(extra, testing::tiny_config()).find("it has a layer h.9.mlp.c_fc that this model"),
            std::string::npos);
  PrecisionMapFile shape = planted();
  shape.layers[2].in_features = 32;
  EXPECT_NE(refused(shape, testing::tiny_config()).find("layer h.0.mlp.c_fc is [32 -> 256] there"),
            std::string::npos);
  // Modes other than fp8 do not read it.
  PrecisionSettings bf16 = fp8_with_map("/nonexistent/map.json");
  bf16.mode = MixedPrecision::bf16;
  EXPECT_NO_THROW(PrecisionPolicy(bf16, testing::tiny_config(), 32));
}

}  // namespace
}  // namespace octet
