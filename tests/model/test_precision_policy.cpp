// The precision policy: which GEMMs run in FP8, why the others do not, and the line and map it reports.
#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/model/precision_policy.h"

namespace octet {
namespace {

ModelConfig model(int64_t layers, int64_t channels) {
  ModelConfig c;
  c.vocab_size = 50257;
  c.layers = layers;
  c.heads = 4;
  c.channels = channels;
  return c;
}

PrecisionSettings fp8() {
  PrecisionSettings s;
  s.mode = MixedPrecision::fp8;
  return s;
}

TEST(GlobMatch, StarsAndQuestionMarks) {
  EXPECT_TRUE(glob_match("h.0.*", "h.0.attn.c_attn"));
  EXPECT_FALSE(glob_match("h.0.*", "h.10.attn.c_attn"));
  EXPECT_TRUE(glob_match("*.mlp.*", "h.3.mlp.c_fc"));
  EXPECT_FALSE(glob_match("*.mlp.*", "h.3.attn.c_proj"));
  EXPECT_TRUE(glob_match("h.?.mlp.c_proj", "h.7.mlp.c_proj"));
  EXPECT_TRUE(glob_match("*", "lm_head"));
  EXPECT_FALSE(glob_match("h.*.c_fc", "h.1.mlp.c_proj"));
  EXPECT_TRUE(glob_match("lm_head", "lm_head"));
}

TEST(PrecisionPolicy, DefaultConvertsEveryBlockLinearButNotTheHead) {
  const PrecisionPolicy p(fp8(), model(12, 768), 8 * 1024);
  ASSERT_EQ(p.layers().size(), 49u);
  EXPECT_EQ(p.fp8_layer_count(), 48);
  EXPECT_TRUE(p.layer("h.0.attn.c_attn").fp8());
  EXPECT_TRUE(p.layer("h.11.mlp.c_proj").fp8());
  EXPECT_EQ(p.layer("h.11.mlp.c_proj").in_features, 4 * 768);
  EXPECT_FALSE(p.layer("lm_head").fp8());
  EXPECT_EQ(p.layer("lm_head").forward, GemmMode::bf16);
  EXPECT_EQ(p.startup_line(),
            "FP8 training enabled: recipe=delayed (hybrid E4M3/E5M2, history 16, margin 0); 48 of 49 linear "
            "layers in FP8; lm_head: excluded by config");
  EXPECT_EQ(p.formats().gradient, Dtype::e5m2);
  ASSERT_NE(p.recipe(), nullptr);
  EXPECT_EQ(p.recipe()->kind(), RecipeKind::delayed);
}

TEST(PrecisionPolicy, PatternsHeadAndFirstLastBlocks) {
  PrecisionSettings s = fp8();
  s.exclude = {"*.mlp.*"};
  s.lm_head = true;
  const PrecisionPolicy p(s, model(4, 64), 256);
  EXPECT_FALSE(p.layer("h.2.mlp.c_fc").fp8());
  EXPECT_EQ(p.layer("h.2.mlp.c_fc").reason, "excluded by pattern '*.mlp.*'");
  EXPECT_TRUE(p.layer("h.2.attn.c_proj").fp8());
  EXPECT_TRUE(p.layer("lm_head").fp8());

  s = fp8();
  s.include = {"h.1.*", "h.2.attn.*"};
  const PrecisionPolicy q(s, model(4, 64), 256);
  EXPECT_TRUE(q.layer("h.1.mlp.c_fc").fp8());
  EXPECT_TRUE(q.layer("h.2.attn.c_attn").fp8());
  EXPECT_FALSE(q.layer("h.2.mlp.c_fc").fp8());
  EXPECT_EQ(q.layer("h.0.attn.c_attn").reason, "not matched by any include pattern");
  EXPECT_EQ(q.fp8_layer_count(), 6);

  s = fp8();
  s.first_last_blocks_bf16 = true;
  const PrecisionPolicy r(s, model(4, 64), 256);
  EXPECT_FALSE(r.layer("h.0.mlp.c_fc").fp8());
  EXPECT_FALSE(r.layer("h.3.attn.c_attn").fp8());
  EXPECT_TRUE(r.layer("h.1.attn.c_attn").fp8());
  EXPECT_EQ(r.layer("h.3.attn.c_attn").reason, "first and last blocks kept in BF16 by config");
  EXPECT_EQ(r.fp8_layer_count(), 8);
}

TEST(PrecisionPolicy, EachOfTheThreeGemmsCanStayInBf16) {
  PrecisionSettings s = fp8();
  s.fp8_weight_gradient = false;
  const PrecisionPolicy p(s, model(2, 64), 256);
  const LinearPlan& l = p.layer("h.0.mlp.c_fc");
  EXPECT_EQ(l.forward, GemmMode::fp8);
  EXPECT_EQ(l.input_gradient, GemmMode::fp8);
  EXPECT_EQ(l.weight_gradient, GemmMode::bf16);
  EXPECT_EQ(l.reason, "FP8 by policy; weight gradient in BF16 by config");

  s = fp8();
  s.fp8_forward = false;  // the weight gradient needs the FP8 forward's input, so it stays BF16 too
  const PrecisionPolicy q(s, model(2, 64), 256);
  const LinearPlan& k = q.layer("h.1.attn.c_proj");
  EXPECT_EQ(k.forward, GemmMode::bf16);
  EXPECT_EQ(k.input_gradient, GemmMode::fp8);
  EXPECT_EQ(k.weight_gradient, GemmMode::bf16);
  EXPECT_EQ(
      k.reason,
      "FP8 by policy; forward and weight gradient in BF16 by config (an FP8 weight gradient needs the FP8 "
      "forward's input)");
}

TEST(PrecisionPolicy, ShapesTheFp8PathCannotTakeStayBf16WithTheReason) {
  // 40 channels: c_attn is 40 -> 120, neither a multiple of 16.
  const PrecisionPolicy p(fp8(), model(2, 40), 256);
  EXPECT_EQ(p.fp8_layer_count(), 0);
  EXPECT_EQ(p.layer("h.0.attn.c_attn").forward, GemmMode::bf16);
  EXPECT_EQ(p.layer("h.0.attn.c_attn").reason,
            "kept in BF16: out_features = 120 is not a multiple of 16, which FP8 GEMMs need");
  // Tokens per micro-batch enter the same rule.
  const PrecisionPolicy q(fp8(), model(2, 64), 3 * 11);
  EXPECT_EQ(q.fp8_layer_count(), 0);
  EXPECT_NE(q.layer("h.1.mlp.c_fc").reason.find("B*T) = 33"), std::string::npos);
}

TEST(PrecisionPolicy, OtherModesPrintNoFp8Line) {
  for (const MixedPrecision m : {MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp16}) {
    PrecisionSettings s;
    s.mode = m;
    const PrecisionPolicy p(s, model(2, 64), 256);
    EXPECT_EQ(p.startup_line(), "");
    EXPECT_EQ(p.fp8_layer_count(), 0);
    EXPECT_EQ(p.recipe(), nullptr);
  }
  PrecisionSettings s;
  s.mode = MixedPrecision::fp16;
  EXPECT_EQ(PrecisionPolicy(s, model(2, 64), 256).layer("h.0.mlp.c_fc").forward, GemmMode::f16);
}

TEST(PrecisionPolicy, RecipesDescribeThemselvesInTheLine) {
  PrecisionSettings s = fp8();
  s.recipe = RecipeKind::current;
  s.all_e4m3 = true;
  const PrecisionPolicy p(s, model(2, 64), 256);
  EXPECT_EQ(
      p.startup_line(),
      "FP8 training enabled: recipe=current (all E4M3, margin 0); 8 of 9 linear layers in FP8; lm_head: "
      "excluded by config");
  EXPECT_EQ(p.formats().gradient, Dtype::e4m3);
  s.recipe = RecipeKind::block;
  EXPECT_NE(PrecisionPolicy(s, model(2, 64), 256).startup_line().find("recipe=block (all E4M3, 1x128"),
            std::string::npos);
}

TEST(PrecisionPolicy, MapListsEveryLayer) {
  const PrecisionPolicy p(fp8(), model(2, 64), 256);
  const std::string json = p.map_json();
  EXPECT_NE(
      json.find("{\"layer\": \"h.1.mlp.c_proj\", \"in_features\": 256, \"out_features\": 64, \"forward\": "
                "\"fp8\", \"input_gradient\": \"fp8\", \"weight_gradient\": \"fp8\", \"reason\": \"FP8 by "
                "policy\"}"),
      std::string::npos)
      << json;
  EXPECT_NE(json.find("\"layer\": \"lm_head\""), std::string::npos);
}

TEST(MixedPrecisionNames, ExactlyFourSpellings) {
  EXPECT_EQ(parse_mixed_precision("fp8"), MixedPrecision::fp8);
  EXPECT_EQ(parse_mixed_precision("bf16"), MixedPrecision::bf16);
  EXPECT_FALSE(parse_mixed_precision("FP8").has_value());
  EXPECT_FALSE(parse_mixed_precision("float8").has_value());
}

}  // namespace
}  // namespace octet
