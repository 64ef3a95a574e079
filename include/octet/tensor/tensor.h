// Tensor views: where a tensor's elements are, their type and their shape, as the backend's ops take them.
// A view owns nothing (the memory is a backend's Buffer); it is passed by value or const reference and read
// by the op, which dispatches on its dtype: a float32 and a bf16 tensor go to the same op, never to two
// entries. Elements are contiguous and row-major; rows() and cols() see any shape as a matrix of its last
// dimension.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "octet/numerics/minifloat.h"

namespace octet {

class Shape {
 public:
  static constexpr int kMaxRank = 4;

  Shape() = default;
  // Up to kMaxRank non-negative extents; checked.
  Shape(std::initializer_list<int64_t> extents);

  int rank() const { return rank_; }
  int64_t operator[](int axis) const { return extents_[static_cast<size_t>(axis)]; }
  // The number of elements (1 for rank 0).
  int64_t numel() const;
  // The extent of the last dimension (1 for rank 0), and the product of the others.
  int64_t cols() const { return rank_ == 0 ? 1 : extents_[static_cast<size_t>(rank_ - 1)]; }
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }
  bool operator==(const Shape& other) const;
  // "[2, 3, 5]"
  std::string to_string() const;

 private:
  std::array<int64_t, kMaxRank> extents_{};
  int rank_ = 0;
};

// The bytes that n elements of `dtype` take (bf16: 2, FP8: 1, f32: 4).
size_t storage_bytes(Dtype dtype, int64_t n);

// A read-only view. Its data may be null where an op's contract says the values are not needed (the shape
// still describes the tensor).
struct ConstTensorView {
  const void* data = nullptr;
  Dtype dtype = Dtype::f32;
  Shape shape;

  ConstTensorView() = default;
  ConstTensorView(const void* data_, Dtype dtype_, Shape shape_)
      : data(data_), dtype(dtype_), shape(shape_) {}
  ConstTensorView(const float* data_, Shape shape_) : data(data_), dtype(Dtype::f32), shape(shape_) {}

  int64_t numel() const { return shape.numel(); }
  int64_t rows() const { return shape.rows(); }
  int64_t cols() const { return shape.cols(); }
  size_t bytes() const { return storage_bytes(dtype, numel()); }
  bool has_data() const { return data != nullptr; }
  // The data as float32 values; checks that the dtype is f32.
  const float* f32() const;
};

// A view whose elements an op writes.
struct TensorView {
  void* data = nullptr;
  Dtype dtype = Dtype::f32;
  Shape shape;

  TensorView() = default;
  TensorView(void* data_, Dtype dtype_, Shape shape_) : data(data_), dtype(dtype_), shape(shape_) {}
  TensorView(float* data_, Shape shape_) : data(data_), dtype(Dtype::f32), shape(shape_) {}

  operator ConstTensorView() const { return {data, dtype, shape}; }  // NOLINT: a view reads as well as writes
  int64_t numel() const { return shape.numel(); }
  int64_t rows() const { return shape.rows(); }
  int64_t cols() const { return shape.cols(); }
  size_t bytes() const { return storage_bytes(dtype, numel()); }
  bool has_data() const { return data != nullptr; }
  float* f32() const;
};

// Precondition checks that name the op and the argument: "<op>: <what> has shape [..], expected [..]".
void check_shape(std::string_view op, std::string_view what, const Shape& seen, const Shape& expected);
// The same for a tensor seen as a matrix (rows() x cols()), whatever its rank.
void check_matrix(std::string_view op, std::string_view what, const Shape& seen, int64_t rows, int64_t cols);
void check_dtype(std::string_view op, std::string_view what, Dtype seen,
                 std::initializer_list<Dtype> allowed);

}  // namespace octet
