// The launcher's environment (see launch.h).
#include "octet/dist/launch.h"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::dist {

namespace {

struct LauncherVariables {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
};

constexpr LauncherVariables kLaunchers[] = {
    {"octet train --gpus/--ranks", "OCTET_RANK", "OCTET_WORLD_SIZE", "OCTET_LOCAL_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

int integer(const EnvironmentReader& get, const char* name, int low, int high, const char* launcher) {
  const std::optional<std::string> value = get(name);
  OCTET_REQUIRE(value.has_value(), "{} is set by {} but {} is not: the launcher's environment is incomplete",
                launcher, launcher, name);
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value->c_str(), &end, 10);
  OCTET_REQUIRE(!value->empty() && end != nullptr && *end == '\0' && errno == 0 && parsed >= low &&
                    parsed <= high,
                "{}={:?}: expected a whole number from {} to {}", name, *value, low, high);
  return static_cast<int>(parsed);
}

}  // namespace

std::optional<RankEnvironment> rank_environment(const EnvironmentReader& get) {
  for (const LauncherVariables& v : kLaunchers) {
    if (!get(v.rank).has_value()) continue;
    RankEnvironment env;
    env.launcher = v.launcher;
    env.world = integer(get, v.world, 1, 1 << 20, v.launcher);
    env.rank = integer(get, v.rank, 0, env.world - 1, v.launcher);
    env.local_rank = get(v.local_rank).has_value() ? integer(get, v.local_rank, 0, env.world - 1, v.launcher)
                                                   : env.rank;
    for (const char* name : {"OCTET_MASTER_ADDR", "MASTER_ADDR"}) {
      if (const auto address = get(name); address && !address->empty()) {
        env.master_address = *address;
        break;
      }
    }
    for (const char* name : {"OCTET_MASTER_PORT", "MASTER_PORT"}) {
      if (get(name).has_value()) {
        env.master_port = integer(get, name, 1, 65535, v.launcher);
        break;
      }
    }
    return env;
  }
  return std::nullopt;
}

std::optional<RankEnvironment> rank_environment() {
  return rank_environment([](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  });
}

}  // namespace octet::dist
