// Releasable buffers (Backend::allocate_releasable, Buffer::release): the page bookkeeping they share, and
// the CPU backend's buffer, whose pages given back are really unmapped (a touch is a fault) and come back
// as writable zeros. The CUDA backend's buffer is exercised by every GPU test (the model's parameters live
// in one) and by tests/cuda/test_gpu_data_parallel.cpp, where FP8 gathers give pages back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "octet/backend/cpu_backend.h"
#include "released_pages.h"

namespace octet {
namespace {

using Run = ReleasedPages::Run;

std::vector<std::pair<size_t, size_t>> pairs(const std::vector<Run>& runs) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const Run& r : runs) out.emplace_back(r.first, r.count);
  return out;
}

TEST(ReleasedPages, ReleasesOnlyThePagesWhollyInsideARangeAndEachOnce) {
  // 10 pages of 100 bytes, the last one 50 bytes long.
  ReleasedPages pages(950, 100);
  EXPECT_EQ(pages.pages(), 10u);
  // [150, 420): pages 2 and 3 lie wholly inside; 1 and 4 only in part.
  EXPECT_EQ(pairs(pages.release(150, 270)), (std::vector<std::pair<size_t, size_t>>{{2, 2}}));
  EXPECT_EQ(pages.released_bytes(), 200u);
  // A range inside one page frees nothing; one over pages already given back frees only the new ones.
  EXPECT_TRUE(pages.release(510, 80).empty());
  EXPECT_EQ(pairs(pages.release(100, 400)), (std::vector<std::pair<size_t, size_t>>{{1, 1}, {4, 1}}));
  EXPECT_EQ(pages.released_bytes(), 400u);
  // The buffer's short last page, to its end.
  EXPECT_EQ(pairs(pages.release(900, 50)), (std::vector<std::pair<size_t, size_t>>{{9, 1}}));
  EXPECT_EQ(pages.released_bytes(), 450u);
  EXPECT_TRUE(pages.released(9) && pages.released(1) && !pages.released(0) && !pages.released(5));
  EXPECT_EQ(pairs(pages.restore_all()), (std::vector<std::pair<size_t, size_t>>{{1, 4}, {9, 1}}));
  EXPECT_EQ(pages.released_bytes(), 0u);
  EXPECT_TRUE(pages.restore_all().empty());
  EXPECT_ANY_THROW(pages.release(900, 51));  // past the end
}

TEST(ReleasableMemory, TheCpuBuffersPagesGivenBackAreUnmappedAndComeBackAsZeros) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the backend's worker threads run beside the test
  auto backend = make_cpu_backend();
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t floats = 8 * page / sizeof(float) + 100;
  std::unique_ptr<Buffer> buffer = backend->allocate_releasable(floats * sizeof(float));
  ASSERT_EQ(buffer->bytes(), floats * sizeof(float));
  float* x = buffer->floats();
  for (size_t i = 0; i < floats; ++i) ASSERT_EQ(x[i], 0.0f);  // zero-filled, as every buffer
  for (size_t i = 0; i < floats; ++i) x[i] = static_cast<float>(i % 1000);
  // From half a page in to three and a half pages in: pages 1 and 2 go, and nothing else changes.
  EXPECT_EQ(buffer->release(page / 2, 3 * page), 2 * page);
  EXPECT_EQ(buffer->released_bytes(), 2 * page);
  const size_t per_page = page / sizeof(float);
  for (size_t i = 0; i < per_page; ++i) ASSERT_EQ(x[i], static_cast<float>(i % 1000));
  for (size_t i = 3 * per_page; i < floats; ++i) ASSERT_EQ(x[i], static_cast<float>(i % 1000));
  // Reading or writing a page given back is a fault, not a stale value.
  EXPECT_DEATH({ std::printf("%f", static_cast<double>(*static_cast<volatile float*>(x + per_page + 7))); },
               "");
  EXPECT_DEATH({ *static_cast<volatile float*>(x + 2 * per_page) = 1.0f; }, "");
  buffer->restore();
  EXPECT_EQ(buffer->released_bytes(), 0u);
  for (size_t i = per_page; i < 3 * per_page; ++i) ASSERT_EQ(x[i], 0.0f);
  x[per_page + 7] = 3.0f;
  EXPECT_EQ(x[per_page + 7], 3.0f);
  // A plain buffer keeps its memory.
  std::unique_ptr<Buffer> plain = backend->allocate(4 * page);
  EXPECT_EQ(plain->release(0, 4 * page), 0u);
  EXPECT_EQ(plain->released_bytes(), 0u);
}

}  // namespace
}  // namespace octet
