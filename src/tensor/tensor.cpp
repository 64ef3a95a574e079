// Tensor views' shapes and the checks the ops make on them.
#include "octet/tensor/tensor.h"

#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet {

Shape::Shape(std::initializer_list<int64_t> extents) {
  OCTET_CHECK(extents.size() <= static_cast<size_t>(kMaxRank), "a tensor has at most {} dimensions, given {}",
              kMaxRank, extents.size());
  for (const int64_t e : extents) {
    OCTET_CHECK(e >= 0, "a tensor's extents are non-negative, given {}", e);
    extents_[static_cast<size_t>(rank_++)] = e;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int axis = 0; axis < rank_; ++axis) n *= extents_[static_cast<size_t>(axis)];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int axis = 0; axis < rank_; ++axis) {
    if (extents_[static_cast<size_t>(axis)] != other.extents_[static_cast<size_t>(axis)]) return false;
  }
  return true;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int axis = 0; axis < rank_; ++axis) {
    if (axis > 0) s += ", ";
    s += std::to_string(extents_[static_cast<size_t>(axis)]);
  }
  return s + "]";
}

size_t storage_bytes(Dtype dtype, int64_t n) {
  return static_cast<size_t>(n) * static_cast<size_t>(dtype_info(dtype).storage_bits / 8);
}

const float* ConstTensorView::f32() const {
  OCTET_CHECK(dtype == Dtype::f32, "a float32 tensor was expected, this one is {}", dtype_name(dtype));
  return static_cast<const float*>(data);
}

float* TensorView::f32() const {
  OCTET_CHECK(dtype == Dtype::f32, "a float32 tensor was expected, this one is {}", dtype_name(dtype));
  return static_cast<float*>(data);
}

void check_shape(std::string_view op, std::string_view what, const Shape& seen, const Shape& expected) {
  OCTET_CHECK(seen == expected, "{}: {} has shape {}, expected {}", op, what, seen.to_string(),
              expected.to_string());
}

void check_matrix(std::string_view op, std::string_view what, const Shape& seen, int64_t rows, int64_t cols) {
  OCTET_CHECK(seen.rows() == rows && seen.cols() == cols, "{}: {} has shape {}, expected {} rows of {}", op,
              what, seen.to_string(), rows, cols);
}

void check_dtype(std::string_view op, std::string_view what, Dtype seen,
                 std::initializer_list<Dtype> allowed) {
  std::string names;
  for (const Dtype d : allowed) {
    if (d == seen) return;
    names += names.empty() ? "" : " or ";
    names += dtype_name(d);
  }
  OCTET_CHECK(false, "{}: {} is stored as {}, this backend takes {} there", op, what, dtype_name(seen),
              names);
}

}  // namespace octet
