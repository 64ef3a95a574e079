// The backend registry (see registry.h), with the CPU backend registered from the start.
#include "octet/backend/registry.h"

#include <mutex>
#include <utility>

#include "octet/backend/cpu_backend.h"

namespace octet {
namespace {

class CpuBackendFactory final : public BackendFactory {
 public:
  std::string_view name() const override { return "cpu"; }
  int device_count() const override { return 1; }
  BackendDevice device(int index) const override {
    BackendDevice d;
    d.index = index;
    d.name = "CPU";
    return d;
  }
  std::string describe_device(int) const override { return "the CPU"; }
  // FP8 casts and GEMMs are emulated bit for bit with every recipe of the numerics core.
  bool supports_recipe(RecipeKind) const override { return true; }
  bool attention_on_tensor_cores(int64_t, int64_t) const override { return false; }
  std::string attention_kernels(int64_t, int64_t, int64_t, int64_t, AttentionKernelChoice) const override {
    return "octet's float32 attention";
  }
  std::unique_ptr<Backend> make(const BackendOptions&) const override { return make_cpu_backend(); }
};

struct Registry {
  Registry() { factories.push_back(std::make_unique<CpuBackendFactory>()); }
  std::mutex mutex;
  std::vector<std::unique_ptr<const BackendFactory>> factories;
};

// Made on first use, so that registering never depends on the order of static initialisers.
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_backend(std::unique_ptr<const BackendFactory> factory) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& registered : r.factories) {
    if (registered->name() == factory->name()) return;
  }
  r.factories.push_back(std::move(factory));
}

const BackendFactory* find_backend(std::string_view name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& registered : r.factories) {
    if (registered->name() == name) return registered.get();
  }
  return nullptr;
}

std::vector<const BackendFactory*> registered_backends() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<const BackendFactory*> all;
  for (const auto& registered : r.factories) all.push_back(registered.get());
  return all;
}

}  // namespace octet
