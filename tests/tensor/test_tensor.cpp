// Tensor views: shapes, sizes and the checks the backends' ops make with them. A check names the op, the
// argument, what it saw and what was valid.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "errors.h"
#include "octet/tensor/tensor.h"

namespace octet {
namespace {

using testing::error_of;

TEST(Shape, CountsItsElementsAndSeesItselfAsAMatrix) {
  const Shape s{2, 3, 5};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[2], 5);
  EXPECT_EQ(s.numel(), 30);
  EXPECT_EQ(s.rows(), 6);
  EXPECT_EQ(s.cols(), 5);
  EXPECT_EQ(s.to_string(), "[2, 3, 5]");
  const Shape scalar;
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.rows(), 1);
  EXPECT_EQ(scalar.cols(), 1);
  const Shape empty{4, 0};
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.rows(), 0);
  EXPECT_TRUE((Shape{2, 3} == Shape{2, 3}));
  EXPECT_FALSE((Shape{2, 3} == Shape{3, 2}));
  EXPECT_FALSE((Shape{6} == Shape{6, 1}));
}

TEST(Shape, RefusesNegativeExtentsAndTooManyDimensions) {
  EXPECT_NE(error_of([] { Shape{2, -1}; }).find("non-negative, given -1"), std::string::npos);
  EXPECT_NE(error_of([] { Shape{1, 2, 3, 4, 5}; }).find("at most 4 dimensions, given 5"), std::string::npos);
}

TEST(TensorView, KnowsItsBytesAndReadsAsFloatOnlyWhenFloat32) {
  std::vector<float> f(6);
  std::vector<uint16_t> h(6);
  const TensorView a(f.data(), {2, 3});
  EXPECT_EQ(a.dtype, Dtype::f32);
  EXPECT_EQ(a.bytes(), 24u);
  EXPECT_EQ(a.f32(), f.data());
  const ConstTensorView read = a;  // a view that writes also reads
  EXPECT_EQ(read.data, f.data());
  EXPECT_EQ(read.shape, (Shape{2, 3}));
  const TensorView b(h.data(), Dtype::bf16, {6});
  EXPECT_EQ(b.bytes(), 12u);
  EXPECT_NE(error_of([&] { (void)b.f32(); }).find("a float32 tensor was expected, this one is bf16"),
            std::string::npos);
  EXPECT_EQ(storage_bytes(Dtype::e4m3, 7), 7u);
  const ConstTensorView no_data(nullptr, {3, 4});
  EXPECT_FALSE(no_data.has_data());
  EXPECT_EQ(no_data.numel(), 12);
}

TEST(TensorChecks, NameTheOpTheArgumentAndWhatWasValid) {
  EXPECT_EQ(error_of([] { check_shape("op", "x", Shape{2, 3}, Shape{2, 3}); }), "");
  EXPECT_NE(error_of([] {
              check_shape("attention_forward", "qkv", Shape{2, 3}, Shape{2, 9});
            }).find("attention_forward: qkv has shape [2, 3], expected [2, 9]"),
            std::string::npos);
  EXPECT_EQ(error_of([] { check_matrix("op", "x", Shape{2, 3, 4}, 6, 4); }), "");
  EXPECT_NE(error_of([] {
              check_matrix("linear_forward", "out", Shape{2, 3, 4}, 6, 5);
            }).find("linear_forward: out has shape [2, 3, 4], expected 6 rows of 5"),
            std::string::npos);
  EXPECT_EQ(error_of([] { check_dtype("op", "x", Dtype::bf16, {Dtype::f32, Dtype::bf16}); }), "");
  EXPECT_NE(error_of([] {
              check_dtype("linear_backward", "dout", Dtype::e4m3, {Dtype::f32, Dtype::bf16});
            }).find("linear_backward: dout is stored as e4m3, this backend takes f32 or bf16 there"),
            std::string::npos);
}

}  // namespace
}  // namespace octet
