// The backend registry: the CPU backend is there from the start and first, a name keeps its first factory,
// every registered backend is listed (the op harness runs each one against the CPU reference), and an
// unknown name finds nothing.
#include <memory>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "octet/backend/cpu_backend.h"
#include "octet/backend/registry.h"

namespace octet {
namespace {

class FakeFactory final : public BackendFactory {
 public:
  explicit FakeFactory(int devices) : devices_(devices) {}
  std::string_view name() const override { return "fake"; }
  int device_count() const override { return devices_; }
  BackendDevice device(int index) const override { return {index, "fake device", 0, 0, false, 0}; }
  std::string describe_device(int) const override { return "a fake device"; }
  bool supports_recipe(RecipeKind) const override { return false; }
  bool attention_on_tensor_cores(int64_t, int64_t) const override { return false; }
  std::string attention_kernels(int64_t, int64_t, int64_t, int64_t, AttentionKernelChoice) const override {
    return "none";
  }
  std::unique_ptr<Backend> make(const BackendOptions&) const override { return make_cpu_backend(); }

 private:
  int devices_;
};

TEST(BackendRegistry, ListsEveryBackendOnceWithTheCpuFirst) {
  ASSERT_FALSE(registered_backends().empty());
  EXPECT_EQ(registered_backends().front()->name(), "cpu");
  const BackendFactory* cpu = find_backend("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->device_count(), 1);
  EXPECT_EQ(cpu->make(BackendOptions{})->name(), "cpu");
  EXPECT_EQ(find_backend("no such backend"), nullptr);

  const size_t before = registered_backends().size();
  register_backend(std::make_unique<FakeFactory>(3));
  register_backend(std::make_unique<FakeFactory>(5));  // the name is taken: the first factory stays
  const BackendFactory* fake = find_backend("fake");
  ASSERT_NE(fake, nullptr);
  EXPECT_EQ(fake->device_count(), 3);
  ASSERT_EQ(registered_backends().size(), before + 1);
  EXPECT_EQ(registered_backends().back(), fake);
  EXPECT_EQ(registered_backends().front()->name(), "cpu");
}

}  // namespace
}  // namespace octet
